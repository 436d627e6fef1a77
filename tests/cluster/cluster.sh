#!/bin/bash
# Emulated multi-node cluster on one Linux host: N network namespaces ("nodes") joined by a
# Linux bridge in a "switch" namespace, one mpirun job of N x R ranks across them, then a
# teardown that leaves nothing behind (also after a failure, a timeout, or a kill).
#
#   tests/cluster/cluster.sh [--nodes N] [--ranks-per-node R] [--rate RATE]
#                            [--timeout SECONDS] [--keep-output DIR] -- PROGRAM [ARGS...]
#
# See tests/cluster/README.md.

# shellcheck disable=SC2015,SC2054,SC2086,SC2317
# (A && B || die chains are intended; commas in --mca values; pid lists are meant to split;
#  cleanup and its helpers run from traps)

set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly HERE
readonly AGENT=$HERE/rsh-agent.sh
readonly SUBNET_PREFIX=10.213.7      # private /24, used only inside this script's namespaces
readonly SUBNET=$SUBNET_PREFIX.0/24
readonly SWITCH_IP=$SUBNET_PREFIX.254
readonly TBF_LATENCY=${HSDP_CLUSTER_TBF_LATENCY:-50ms}
readonly TCP_WMEM_MAX=${HSDP_CLUSTER_WMEM:-}

usage() {
    cat >&2 <<'EOF'
usage: cluster.sh [--nodes N] [--ranks-per-node R] [--rate RATE] [--timeout SECONDS]
                  [--keep-output DIR] [--exec] -- PROGRAM [ARGS...]
  --nodes N            emulated nodes (network namespaces), default 2, at most 253
  --ranks-per-node R   MPI ranks per node, default 4 (node i gets ranks i*R .. i*R+R-1)
  --rate RATE          tc rate of every node link (e.g. 1gbit, 100mbit) or none (default)
  --timeout SECONDS    kill the job after SECONDS and exit 124, default 300 (0: no limit)
  --keep-output DIR    also write stdout.log, stderr.log, hostfile, cluster.txt into DIR
  --tcp-retries N      net.ipv4.tcp_retries2 in every namespace (default: the kernel's, 15,
                       ~15 min): how long TCP, Open MPI's daemons' included, waits on a cut link
  --tcp-cc NAME        TCP congestion control of every namespace (default reno, loss-based as
                       Linux's default cubic is; host: the host's default, inherited)
  --exec               run PROGRAM itself (not mpirun PROGRAM) in the switch namespace, in the
                       job's PID namespace, with CLUSTER_SH_MAP, CLUSTER_SH_RUNDIR,
                       CLUSTER_SH_NODES (names), CLUSTER_SH_HOSTS (addresses) and
                       CLUSTER_SH_SWITCH_IP set: a launcher of its own (tests/cluster/slurm.sh)
Exit status: the job's exit status; 124 on timeout; 2 on usage errors; 3 on bring-up errors.
EOF
}

die_usage() { echo "cluster.sh: $*" >&2; usage; exit 2; }
die() { echo "cluster.sh: $*" >&2; exit 3; }

nodes=2
rpn=4
rate=none
timeout_s=300
keep_dir=
tcp_retries=
tcp_cc=reno
exec_mode=0
while [ $# -gt 0 ]; do
    case $1 in
        --nodes) [ $# -ge 2 ] || die_usage "$1 needs a value"; nodes=$2; shift 2 ;;
        --nodes=*) nodes=${1#*=}; shift ;;
        --ranks-per-node) [ $# -ge 2 ] || die_usage "$1 needs a value"; rpn=$2; shift 2 ;;
        --ranks-per-node=*) rpn=${1#*=}; shift ;;
        --rate) [ $# -ge 2 ] || die_usage "$1 needs a value"; rate=$2; shift 2 ;;
        --rate=*) rate=${1#*=}; shift ;;
        --timeout) [ $# -ge 2 ] || die_usage "$1 needs a value"; timeout_s=$2; shift 2 ;;
        --timeout=*) timeout_s=${1#*=}; shift ;;
        --keep-output) [ $# -ge 2 ] || die_usage "$1 needs a value"; keep_dir=$2; shift 2 ;;
        --keep-output=*) keep_dir=${1#*=}; shift ;;
        --tcp-retries) [ $# -ge 2 ] || die_usage "$1 needs a value"; tcp_retries=$2; shift 2 ;;
        --tcp-retries=*) tcp_retries=${1#*=}; shift ;;
        --tcp-cc) [ $# -ge 2 ] || die_usage "$1 needs a value"; tcp_cc=$2; shift 2 ;;
        --tcp-cc=*) tcp_cc=${1#*=}; shift ;;
        --exec) exec_mode=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        *) die_usage "unknown argument '$1' (PROGRAM goes after --)" ;;
    esac
done
[ $# -ge 1 ] || die_usage "no PROGRAM given after --"
[[ $nodes =~ ^[1-9][0-9]*$ ]] && [ "$nodes" -le 253 ] || die_usage "--nodes must be 1..253"
[[ $rpn =~ ^[1-9][0-9]*$ ]] || die_usage "--ranks-per-node must be a positive integer"
[[ $timeout_s =~ ^[0-9]+$ ]] || die_usage "--timeout must be a whole number of seconds"
[ -n "$rate" ] || die_usage "--rate must not be empty"
[ -z "$tcp_retries" ] || { [[ $tcp_retries =~ ^[0-9]+$ ]] && [ "$tcp_retries" -le 255 ]; } ||
    die_usage "--tcp-retries must be 0..255 (got '$tcp_retries')"
[[ $tcp_cc =~ ^[a-z0-9_]+$ ]] || die_usage "--tcp-cc must be a congestion control name or host (got '$tcp_cc')"
if [ "$tcp_cc" != host ] &&
   ! tr ' ' '\n' </proc/sys/net/ipv4/tcp_available_congestion_control | grep -qx "$tcp_cc"; then
    die_usage "--tcp-cc $tcp_cc is not one of this kernel's: $(cat /proc/sys/net/ipv4/tcp_available_congestion_control)"
fi
[ "$(id -u)" -eq 0 ] || die "must run as root (creates network namespaces)"
for tool in ip tc unshare mpirun timeout; do
    command -v "$tool" >/dev/null 2>&1 || die "required tool '$tool' not found"
done
[ -x "$AGENT" ] || die "rsh agent $AGENT missing or not executable"

# ---------------------------------------------------------------------------------------------
# Everything created below carries this invocation's tag, so runs never collide and cleanup
# only touches its own things. Interfaces are created directly inside the namespaces, so the
# root namespace never sees any of them.
readonly TAG=hsdpc$$
readonly SW_NS=$TAG-sw
created_ns=()      # namespaces to delete (recorded before creation)
rundir=            # private temp dir: hostfile, agent map, TMPDIR of mpirun and daemons
job_pid=           # pid of `timeout ... mpirun`
tee_pids=()
cleaning=0

ns_pids() {        # pids of all processes in our namespaces
    local ns
    for ns in "${created_ns[@]}"; do
        [ -e "/run/netns/$ns" ] && ip netns pids "$ns" 2>/dev/null
    done
}

wait_gone() {      # wait_gone TENTHS: wait until our namespaces hold no process
    local i
    for ((i = 0; i < $1; i++)); do
        [ -z "$(ns_pids)" ] && return 0
        sleep 0.1
    done
    return 1
}

cleanup() {
    local rc=$? i p pids
    trap '' INT TERM HUP
    [ "$cleaning" -eq 1 ] && return
    cleaning=1
    # 1. Let mpirun tear its job down (daemons remove their session dirs, shm segments).
    if [ -n "$job_pid" ] && kill -0 "$job_pid" 2>/dev/null; then
        kill -TERM "$job_pid" 2>/dev/null          # timeout forwards it to mpirun
        for ((i = 0; i < 50; i++)); do
            kill -0 "$job_pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    exec 3>&- 4>&-
    [ -n "${CLUSTER_SH_DEBUG:-}" ] && echo "cluster.sh: left in namespaces: $(ns_pids | tr '\n' ' ')" >&2
    # 2. Whatever still lives in our namespaces (mpirun, agents, orted, ranks): TERM, then KILL.
    wait_gone 20
    pids=$(ns_pids)
    if [ -n "$pids" ]; then
        kill -TERM $pids 2>/dev/null
        if ! wait_gone 20; then
            pids=$(ns_pids)
            [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
            wait_gone 50 || echo "cluster.sh: warning: processes survive in namespaces: $(ns_pids | tr '\n' ' ')" >&2
        fi
    fi
    if [ -n "$job_pid" ]; then
        kill -KILL "$job_pid" 2>/dev/null
        wait "$job_pid" 2>/dev/null
    fi
    # 3. Output copiers end when the job's pipes close.
    for p in "${tee_pids[@]}"; do
        for ((i = 0; i < 30; i++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -TERM "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    # 4. Namespaces: deleting them removes their veths, the bridge and the qdiscs.
    for ((i = ${#created_ns[@]} - 1; i >= 0; i--)); do
        [ -e "/run/netns/${created_ns[i]}" ] && ip netns del "${created_ns[i]}" 2>/dev/null
    done
    # 5. Private temp dir (hostfile, map, Open MPI session dirs).
    [ -n "$rundir" ] && rm -rf -- "$rundir"
    exit "$rc"
}
on_signal() { exit "$1"; }
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

# ---------------------------------------------------------------------------------------------
# Leftovers of earlier invocations that were killed with SIGKILL (no trap runs then): their
# namespaces and temp dirs carry the dead script's PID. Only those whose PID is no longer a
# running cluster.sh are removed.
owner_alive() { [ "$1" = $$ ] || tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q 'cluster\.sh'; }
sweep_stale() {
    local ns pid d pids
    # switch namespaces first: killing a stale mpirun (init of the job's PID namespace) ends
    # the whole stale job at once
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hsdpc[0-9]+-sw$') \
              $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^hsdpc[0-9]+-n[0-9]+$'); do
        pid=${ns#hsdpc}; pid=${pid%%-*}
        owner_alive "$pid" && continue
        echo "cluster.sh: removing stale namespace $ns (its cluster.sh, pid $pid, is gone)" >&2
        pids=$(ip netns pids "$ns" 2>/dev/null)
        [ -n "$pids" ] && kill -KILL $pids 2>/dev/null && sleep 0.2
        ip netns del "$ns" 2>/dev/null
    done
    for d in /tmp/hsdpc[0-9]*.??????; do
        [ -d "$d" ] || continue
        pid=${d#/tmp/hsdpc}; pid=${pid%%.*}
        owner_alive "$pid" || rm -rf -- "$d"
    done
}
sweep_stale

# ---------------------------------------------------------------------------------------------
# Bring-up.
t0=$(date +%s.%N)
rundir=$(mktemp -d "/tmp/$TAG.XXXXXX") || die "mktemp failed"
chmod 755 "$rundir"
# Open MPI 4.1's session directories (orte_tmpdir_base, below): mpiruns started at the same moment
# here (the elastic tests' groups) each create $rundir/ompi.<host>.<uid>, and the one whose mkdir
# comes second fails "File exists" (orte_session_dir failed; seen in elastic.etcd3.node-cut). The
# launcher host's and every node's are made once, here.
for h in "$(hostname)" $(seq -f 'hsdp-node%g' 0 $((nodes - 1))); do
    mkdir -m 700 "$rundir/ompi.$h.$(id -u)" || die "cannot create $rundir/ompi.$h.$(id -u)"
done

# tbf burst: 2 ms worth of the rate, at least 64 KiB (a 64 KiB burst loses ~10-30 % at
# 1gbit; 2 ms reaches ~97 % of line rate). Rate strings as tc(8) reads them; if the unit is
# not understood, 64 KiB and tc judges the rate.
tbf_burst() {
    awk -v r="$1" 'BEGIN {
        u["bit"] = 1; u[""] = 1; u["bps"] = 8
        split("k m g t", si, " "); split("ki mi gi ti", bi, " ")
        for (i = 1; i <= 4; i++) {
            u[si[i] "bit"] = 10 ^ (3 * i); u[si[i] "bps"] = 8 * 10 ^ (3 * i)
            u[bi[i] "bit"] = 2 ^ (10 * i); u[bi[i] "bps"] = 8 * 2 ^ (10 * i)
        }
        b = 65536
        if (match(tolower(r), /^[0-9]+(\.[0-9]+)?/)) {
            unit = substr(tolower(r), RLENGTH + 1)
            if (unit in u) { x = substr(r, 1, RLENGTH) * u[unit] / 8 * 0.002; if (x > b) b = x }
        }
        printf "%d\n", b
    }'
}
tbf() {            # tbf NS DEV
    tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency "$TBF_LATENCY"
}
[ "$rate" != none ] && burst=$(tbf_burst "$rate")

created_ns+=("$SW_NS")
ip netns add "$SW_NS" || die "ip netns add $SW_NS failed"
ip -n "$SW_NS" link set lo up &&
ip -n "$SW_NS" link add br0 type bridge stp_state 0 forward_delay 0 &&
ip -n "$SW_NS" addr add "$SWITCH_IP/24" dev br0 &&
ip -n "$SW_NS" link set br0 up || die "switch bring-up failed"
retries() {  # retries NS: --tcp-retries and --tcp-cc in that namespace
    [ -z "$tcp_retries" ] || ip netns exec "$1" sysctl -qw net.ipv4.tcp_retries2="$tcp_retries" ||
        die "sysctl net.ipv4.tcp_retries2 in $1 failed"
    # A namespace may only pick what the host allows (net.ipv4.tcp_allowed_congestion_control).
    [ "$tcp_cc" = host ] || ip netns exec "$1" sysctl -qw net.ipv4.tcp_congestion_control="$tcp_cc" ||
        die "--tcp-cc $tcp_cc: refused in a network namespace (the host allows: $(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control))"
}
retries "$SW_NS"

hosts=()
names=()
: >"$rundir/map"
: >"$rundir/hostfile"
for ((i = 0; i < nodes; i++)); do
    ns=$TAG-n$i
    ip4=$SUBNET_PREFIX.$((i + 1))
    name=hsdp-node$i
    created_ns+=("$ns")
    ip netns add "$ns" || die "ip netns add $ns failed"
    ip -n "$ns" link set lo up &&
    ip -n "$SW_NS" link add "p$i" type veth peer name eth0 netns "$ns" &&
    ip -n "$SW_NS" link set "p$i" master br0 &&
    ip -n "$SW_NS" link set "p$i" up &&
    ip -n "$ns" addr add "$ip4/24" dev eth0 &&
    ip -n "$ns" link set eth0 up || die "bring-up of node $i failed"
    retries "$ns"
    if [ -n "$TCP_WMEM_MAX" ]; then
        ip netns exec "$ns" sysctl -qw net.ipv4.tcp_wmem="4096 16384 $TCP_WMEM_MAX" \
            net.ipv4.tcp_rmem="4096 131072 $TCP_WMEM_MAX" || die "sysctl in $ns failed"
    fi
    if [ "$rate" != none ]; then
        tbf "$SW_NS" "p$i" && tbf "$ns" eth0 || die "tc tbf with rate '$rate' failed"
    fi
    printf '%s %s %s\n%s %s %s\n' "$ip4" "$ns" "$name" "$name" "$ns" "$name" >>"$rundir/map"
    printf '%s slots=%d\n' "$ip4" "$rpn" >>"$rundir/hostfile"
    hosts+=("$ip4")
    names+=("$name")
done
t1=$(date +%s.%N)

# ---------------------------------------------------------------------------------------------
# The job.
mpi_args=(
    --hostfile "$rundir/hostfile" -np $((nodes * rpn)) --map-by slot
    --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1
    --mca oob_tcp_if_include "$SUBNET" --mca btl_tcp_if_include "$SUBNET"
    --mca pml ob1 --mca btl self,vader,tcp
    --mca orte_tmpdir_base "$rundir"
    --bind-to none --oversubscribe
)
[ "$(id -u)" -eq 0 ] && mpi_args+=(--allow-run-as-root)
while IFS= read -r var; do
    case $var in
        HSDP_*|OMPI_ALLOW_RUN_AS_ROOT|OMPI_ALLOW_RUN_AS_ROOT_CONFIRM) mpi_args+=(-x "$var") ;;
    esac
done < <(compgen -e)

header="cluster: $nodes nodes x $rpn ranks, rate $rate, hosts ${names[*]}"
echo "$header"
echo "cluster.sh: bring-up $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }') s;" \
     "hosts ${hosts[*]}; switch $SWITCH_IP in netns $SW_NS; tcp congestion control" \
     "$(ip netns exec "$SW_NS" cat /proc/sys/net/ipv4/tcp_congestion_control)" >&2

# Open MPI 4.1 sometimes prints "plm:rsh: Warning: setpgid(..) failed in parent with
# errno=Permission denied(13)": a harmless race (the agent exec'd before mpirun's setpgid).
# mpirun's stderr goes through a filter that drops only that line.
readonly NOISE='^\[[^]]*\] plm:rsh: Warning: setpgid([0-9]*,[0-9]*) failed in parent with errno=Permission denied(13)$'
mkfifo "$rundir/err.fifo" || die "mkfifo failed"
if [ -n "$keep_dir" ]; then
    mkdir -p -- "$keep_dir" || die "cannot create --keep-output dir $keep_dir"
    cp "$rundir/hostfile" "$keep_dir/hostfile"
    printf '%s\ncommand: mpirun %s %s\n' "$header" "${mpi_args[*]}" "$*" >"$keep_dir/cluster.txt"
    mkfifo "$rundir/out.fifo" || die "mkfifo failed"
    tee "$keep_dir/stdout.log" <"$rundir/out.fifo" &
    tee_pids+=($!)
    LC_ALL=C sed -u -n -e "/$NOISE/d" -e 'w /dev/stderr' -e p \
        <"$rundir/err.fifo" >"$keep_dir/stderr.log" &
    tee_pids+=($!)
    exec 3>"$rundir/out.fifo" 4>"$rundir/err.fifo"
else
    LC_ALL=C sed -u -e "/$NOISE/d" <"$rundir/err.fifo" >&2 &
    tee_pids+=($!)
    exec 3>&1 4>"$rundir/err.fifo"
fi

start=$SECONDS
# mpirun runs in the switch namespace and, through `unshare --pid --fork --kill-child`, as
# init of a PID namespace of its own. The agent, the node daemons and the ranks all live in
# that PID namespace too, so once mpirun is gone the kernel kills and reaps whatever is left
# of the job (no orphans, no zombies handed to the host's init). Daemons inherit mpirun's
# environment through the agent (TMPDIR, CLUSTER_SH_MAP).
launch=(mpirun "${mpi_args[@]}" "$@")
[ "$exec_mode" -eq 1 ] && launch=("$@")
TMPDIR=$rundir CLUSTER_SH_MAP=$rundir/map CLUSTER_SH_RUNDIR=$rundir \
    CLUSTER_SH_NODES="${names[*]}" CLUSTER_SH_HOSTS="${hosts[*]}" CLUSTER_SH_SWITCH_IP=$SWITCH_IP \
    timeout --kill-after=10 "$timeout_s" \
    ip netns exec "$SW_NS" unshare --pid --fork --kill-child --mount-proc \
    "${launch[@]}" >&3 2>&4 3>&- 4>&- </dev/null &
job_pid=$!
wait "$job_pid"
rc=$?
job_pid=
exec 3>&- 4>&-         # the output copiers (if any) see EOF once the job's processes are gone
if [ "$timeout_s" -gt 0 ] && { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } &&
   [ $((SECONDS - start)) -ge "$timeout_s" ]; then
    echo "cluster.sh: job timed out after $timeout_s s" >&2
    rc=124
fi
[ -n "$keep_dir" ] && echo "exit code: $rc" >>"$keep_dir/cluster.txt"
exit "$rc"
