#!/bin/bash
# A real Slurm (munged, one slurmctld, one slurmd per node) on the emulated cluster of
# cluster.sh, one COMMAND run against it from the login node (the switch namespace), then a
# teardown that leaves nothing running or mounted (also after a failure, a timeout, a kill).
#
#   tests/cluster/slurm.sh [--nodes N] [--cpus-per-node C] [--timeout SECONDS]
#                          [--keep-output DIR] -- COMMAND [ARGS...]
#
# COMMAND is any program or script that talks to Slurm: `srun --mpi=pmix ...`,
# `sbatch --wait job.sh`, or a test script that also uses squeue/scancel/scontrol. It runs with
# SLURM_CONF set, SLURM_SH_DIR naming the daemons' directory (slurmd-<node>.pid, log/), and the
# caller's working directory and environment. See tests/cluster/README.md.

# shellcheck disable=SC2015,SC2086
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly HERE
readonly CTL_NAME=hsdp-ctl

usage() {
    cat >&2 <<'EOF'
usage: slurm.sh [--nodes N] [--cpus-per-node C] [--timeout SECONDS] [--keep-output DIR]
                -- COMMAND [ARGS...]
  --nodes N            emulated nodes, each with its own slurmd, default 2
  --cpus-per-node C    CPUs every node offers Slurm (its share of this host, oversubscribed as
                       the emulated cluster's ranks are), default 4
  --timeout SECONDS    stop everything after SECONDS and exit 124, default 300 (0: no limit)
  --keep-output DIR    copy Slurm's logs (slurmctld.log, slurmd-<node>.log) and slurm.conf to DIR
Exit status: COMMAND's; 124 on timeout; 2 on usage errors; 3 when the cluster or Slurm does not
come up (no slurmctld, a node never idle); 77 (ctest's skip) when Slurm or munge is not installed.
EOF
}
die_usage() { echo "slurm.sh: $*" >&2; usage; exit 2; }
die() { echo "slurm.sh: $*" >&2; exit 3; }

# ---------------------------------------------------------------------------------------------
# Inside: run by cluster.sh --exec in the switch namespace, as PID 1 of the job's PID namespace
# and in a UTS namespace of its own (host name hsdp-ctl). Everything started here dies with it.
if [ "${1:-}" = --inside ]; then
    shift
    nodes=$1 cpus=$2 keep_dir=$3
    shift 4 # the three values and --
    rundir=$CLUSTER_SH_RUNDIR
    sd=$rundir/slurm
    mkdir -p "$sd/state" "$sd/spool" "$sd/log" "$sd/munge" "$sd/key" && chmod 700 "$sd/key" ||
        die "cannot create $sd"
    hostname "$CTL_NAME" || die "hostname $CTL_NAME failed"

    # Names resolve the same everywhere: our own /etc/hosts in this mount namespace, inherited
    # by every daemon and job (Slurm resolves node and controller names; srun its own).
    {
        echo "127.0.0.1 localhost"
        echo "$CLUSTER_SH_SWITCH_IP $CTL_NAME"
        awk '$1 ~ /^[0-9.]+$/ { print $1, $3 }' "$CLUSTER_SH_MAP"
    } >"$sd/hosts"
    mount --bind "$sd/hosts" /etc/hosts || die "cannot bind $sd/hosts over /etc/hosts"

    # munge: a fresh key per cluster, its socket in the run directory.
    dd if=/dev/urandom of="$sd/key/munge.key" bs=1024 count=1 status=none &&
        chmod 400 "$sd/key/munge.key" || die "cannot write the munge key"
    munged --foreground --force --key-file="$sd/key/munge.key" \
        --socket="$sd/munge/munge.socket" --pid-file="$sd/key/munged.pid" \
        --log-file="$sd/log/munged.log" --seed-file="$sd/key/munged.seed" 2>>"$sd/log/munged.out" &
    for ((i = 0; i < 100; i++)); do [ -S "$sd/munge/munge.socket" ] && break; sleep 0.1; done
    [ -S "$sd/munge/munge.socket" ] || die "munged did not start ($(tail -3 "$sd/log/munged.log" 2>/dev/null))"

    # The epilog of every job on every node (it runs once the job's steps there have ended, and
    # a requeued job starts again only after every node's epilog): Slurm's PMIx plugin leaves a
    # stopped step's client directory (TmpFS: spmix_appdir_<uid>_<job>.<step>) and its server's
    # socket and directory (spool: stepd.slurm.pmix.<job>.<step>, pmix.<job>.<step>) behind,
    # and the requeued job (the same job and step ids) would fail to launch on them ("File
    # exists", "Address already in use"). Real clusters clean per-job temporaries alike (or use
    # job_container/tmpfs). Each run is logged to log/epilog.log.
    {
        echo '#!/bin/sh'
        echo "t=$sd/tmp/\$SLURMD_NODENAME s=$sd/spool/\$SLURMD_NODENAME j=\$SLURM_JOB_ID"
        # Also what the job's ranks left in the node's private /dev/shm (Open MPI's vader and
        # UCX's segments, named after the job and step, so a requeued job's ranks met the
        # killed run's: a CI run's restart crashed in shared-memory set-up, "open(2): No such
        # file or directory"). One job runs at a time on these nodes.
        echo 'shm=$(ls -d /dev/shm/vader_segment.* /dev/shm/ucx_* /dev/shm/sm_segment.* 2>/dev/null | tr "\n" " ")'
        # A stopped step's daemon can outlive its tasks: its PMIx server retried a message to
        # the other node's (already gone) step daemon for 35 s, then, on exit, removed its
        # spool directory and socket, by then the requeued run's (same job and step ids), whose
        # ranks hung in PMIx set-up (a CI run: "gds_ds12_lock_pthread.c at line 169"). So the
        # epilog waits up to 5 s for this node's step daemons of the job to end and kills the
        # rest (kill -9: no clean-up of theirs runs; this script's rm does it). Every node's
        # processes share one pid namespace: a node's own are those in its network namespace.
        echo 'me=$(readlink /proc/self/ns/net)'
        echo 'stepds() { for p in $(pgrep -f "^slurmstepd: \[$j\.[0-9]+\]"); do [ "$(readlink /proc/$p/ns/net 2>/dev/null)" = "$me" ] && echo "$p"; done; }'
        echo 'i=0; while [ -n "$(stepds)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done'
        echo 'killed=$(stepds | tr "\n" " "); [ -z "$killed" ] || kill -9 $killed 2>/dev/null'
        echo 'left=$(ls -d "$t"/spmix_appdir_*_"$j".* "$s"/stepd.slurm.pmix."$j".* "$s"/pmix."$j".* 2>/dev/null | tr "\n" " ")$shm'
        echo 'rm -rf -- "$t"/spmix_appdir_*_"$j".* "$s"/stepd.slurm.pmix."$j".* "$s"/pmix."$j".* $shm'
        echo "echo \"\$(date +%T.%N) \$SLURMD_NODENAME job \$j: removed \$left\${killed:+; killed step daemons \$killed}\" >>$sd/log/epilog.log"
        # slurmd refuses a batch launch whose credential is not newer, in whole seconds, than the
        # job's revocation at its last end ("Job 1 already killed, do not launch batch job"):
        # a job requeued by RequeueExit within that second failed. The job is COMPLETING until
        # the epilog ends, so one second here keeps the requeued launch out of that second.
        echo 'sleep 1'
        echo 'exit 0'
    } >"$sd/clean-job" && chmod 755 "$sd/clean-job" || die "cannot write $sd/clean-job"
    conf=$sd/slurm.conf
    {
        cat <<EOF
# Written by tests/cluster/slurm.sh for one emulated cluster; removed with it.
ClusterName=hsdp
SlurmctldHost=$CTL_NAME($CLUSTER_SH_SWITCH_IP)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sd/munge/munge.socket
StateSaveLocation=$sd/state
SlurmdSpoolDir=$sd/spool/self
# Each node's own temporary directory (PMIx puts per-step directories there; one /tmp would
# collide across the emulated nodes).
TmpFS=$sd/tmp/self
Epilog=$sd/clean-job
SlurmctldPidFile=$sd/slurmctld.pid
SlurmdPidFile=$sd/slurmd-%n.pid
SlurmctldLogFile=$sd/log/slurmctld.log
SlurmdLogFile=$sd/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
# No cgroups in a container: processes tracked by parentage; tasks bound by sched_setaffinity.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
# No binding unless a job asks (--cpu-bind): the declared CPUs may exceed the host's, and
# task/affinity's automatic binding would then fail to lay out the tasks.
TaskPluginParam=None
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
# The node's CPUs are its share of this host, as configured, not as detected.
SlurmdParameters=config_overrides
# A job exiting 143 (SIGTERM) or 138 (SIGUSR1) after its preemption checkpoint is requeued
# (docs/reliability.md, "Preemption"); real clusters set this too.
RequeueExit=138,143
# Short timeouts: a dead slurmd is noticed in seconds, a stopped job killed 20 s after SIGTERM.
SlurmdTimeout=10
KillWait=20
MessageTimeout=10
InactiveLimit=0
MinJobAge=300
NodeName=DEFAULT CPUs=$cpus State=UNKNOWN
EOF
        awk '$1 ~ /^[0-9.]+$/ { printf "NodeName=%s NodeAddr=%s\n", $3, $1 }' "$CLUSTER_SH_MAP"
        echo "PartitionName=emu Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$conf"
    # slurmd starts its cgroup plugin even when nothing uses cgroups; the namespaces' fresh /sys
    # has none mounted, so autodetection would fail: name the plugin (it stays unused).
    echo "CgroupPlugin=cgroup/v1" >"$sd/cgroup.conf"
    export SLURM_CONF=$conf

    slurmctld -D -f "$conf" >"$sd/log/slurmctld.out" 2>&1 &
    # One slurmd per node, in the node's network namespace with the node's host name and a
    # private /dev/shm (as rsh-agent.sh starts Open MPI's daemons). Its spool and TmpFS are the
    # same paths on every node (spool/self, tmp/self), bind-mounted from spool/<node> and
    # tmp/<node>, as /var/spool/slurmd is on real nodes: Slurm's PMIx plugin does not expand %n
    # in every path it builds from SlurmdSpoolDir (its relay to another node's step daemon then
    # went to ".../spool/%n/stepd.slurm.pmix.<job>.<step>" and the step hung). nsenter, not
    # `ip netns exec`: that remounts /sys, and slurmd needs /sys/fs/cgroup to start (it uses no
    # cgroup).
    while read -r ip ns node; do
        [[ $ip =~ ^[0-9.]+$ ]] || continue
        mkdir -p "$sd/spool/$node" "$sd/tmp/$node" "$sd/spool/self" "$sd/tmp/self" ||
            die "cannot create $sd/spool/$node"
        # shellcheck disable=SC2016
        nsenter --net="/run/netns/$ns" unshare --uts --mount --propagation private sh -c '
            hostname "$1" && mount -t tmpfs -o mode=1777 "shm-$1" /dev/shm &&
                mount --bind "$3/spool/$1" "$3/spool/self" &&
                mount --bind "$3/tmp/$1" "$3/tmp/self" || exit 3
            exec slurmd -D -f "$2"' slurmd "$node" "$conf" "$sd" >"$sd/log/slurmd-$node.out" 2>&1 &
    done <"$CLUSTER_SH_MAP"

    # Up when every node is idle.
    up=0
    for ((i = 0; i < 600; i++)); do
        idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | sort -u | wc -l)
        [ "$idle" -eq "$nodes" ] && { up=1; break; }
        sleep 0.1
    done
    t_up=$(awk -v a="$SLURM_SH_T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    keep_logs() {
        [ -n "$keep_dir" ] || return 0
        cp "$conf" "$sd"/log/*.log "$keep_dir"/ 2>/dev/null
        return 0
    }
    if [ "$up" -ne 1 ]; then
        echo "slurm.sh: Slurm did not come up within 60 s; sinfo says:" >&2
        sinfo -N 2>&1 | sed 's/^/  /' >&2
        tail -5 "$sd"/log/*.log "$sd"/log/*.out 2>/dev/null | sed 's/^/  /' >&2
        keep_logs
        exit 3
    fi
    echo "slurm: $nodes nodes x $cpus cpus, controller $CTL_NAME, up in $t_up s"
    # COMMAND may reach the daemons' files (slurmd-<node>.pid, log/) through SLURM_SH_DIR.
    SLURM_SH_DIR=$sd "$@"
    rc=$?
    keep_logs
    exit "$rc"
fi

# ---------------------------------------------------------------------------------------------
# Outside: check the arguments and the tools, then let cluster.sh build the nodes and run us
# inside them.
nodes=2
cpus=4
timeout_s=300
keep_dir=
while [ $# -gt 0 ]; do
    case $1 in
        --nodes) [ $# -ge 2 ] || die_usage "$1 needs a value"; nodes=$2; shift 2 ;;
        --nodes=*) nodes=${1#*=}; shift ;;
        --cpus-per-node) [ $# -ge 2 ] || die_usage "$1 needs a value"; cpus=$2; shift 2 ;;
        --cpus-per-node=*) cpus=${1#*=}; shift ;;
        --timeout) [ $# -ge 2 ] || die_usage "$1 needs a value"; timeout_s=$2; shift 2 ;;
        --timeout=*) timeout_s=${1#*=}; shift ;;
        --keep-output) [ $# -ge 2 ] || die_usage "$1 needs a value"; keep_dir=$2; shift 2 ;;
        --keep-output=*) keep_dir=${1#*=}; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        *) die_usage "unknown argument '$1' (COMMAND goes after --)" ;;
    esac
done
[ $# -ge 1 ] || die_usage "no COMMAND given after --"
[[ $nodes =~ ^[1-9][0-9]*$ ]] && [ "$nodes" -le 64 ] || die_usage "--nodes must be 1..64 (got '$nodes')"
[[ $cpus =~ ^[1-9][0-9]*$ ]] && [ "$cpus" -le 1024 ] ||
    die_usage "--cpus-per-node must be 1..1024 (got '$cpus')"
[[ $timeout_s =~ ^[0-9]+$ ]] || die_usage "--timeout must be a whole number of seconds (got '$timeout_s')"
for tool in munged slurmctld slurmd srun sbatch sinfo scontrol; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "slurm.sh: SKIPPED: '$tool' is not installed (Debian: slurm-wlm and munge;" \
             "scripts/setup installs them)" >&2
        exit 77
    fi
done
if [ -n "$keep_dir" ]; then
    mkdir -p -- "$keep_dir" || die "cannot create --keep-output dir $keep_dir"
    keep_dir=$(cd -- "$keep_dir" && pwd)
fi
SLURM_SH_T0=$(date +%s.%N)
export SLURM_SH_T0
exec "$HERE/cluster.sh" --nodes "$nodes" --ranks-per-node "$cpus" --timeout "$timeout_s" --exec -- \
    unshare --uts -- "$HERE/slurm.sh" --inside "$nodes" "$cpus" "$keep_dir" -- "$@"
