#!/usr/bin/env bash
# One case of the fault matrix on the emulated cluster (tests/cluster/cluster.sh, 2 nodes x 4
# ranks): train_mlp runs, a fault is injected mid-training from outside the job, and the way the
# job ends is checked.
#
#   fault_matrix.sh --case stop|kill|cut|orted [--layout zero3|hsdp] [--inter mpi|ucx]
#                   [--timeout SECONDS] [--results FILE] -- TRAIN_MLP
#
#   stop    SIGSTOP rank 2 (node 0)            kill    SIGKILL rank 2 (node 0)
#   cut     node 1's link down (its bridge port, ip link set p1 down)
#   orted   SIGKILL node 1's Open MPI daemon
#   layout  zero3: --mode zero3 --intra-shard 4 --inter-shard 2 (one shard group over both nodes)
#           hsdp:  --mode zero3 --intra-shard 4 --inter-shard 1 (a shard group per node, replicas
#                  across nodes)
#   inter   the inter level's transport (HSDP_TRANSPORT_INTER)
#
# Passes when: every surviving rank has exited within HSDP_TIMEOUT_S (--timeout, default 20) +
# 15 s of the fault; a line names the rank or node at fault; the job's exit code is non-zero; no
# process of the job is left; the emulated cluster is gone (namespaces, temp dir). Prints one
# result line (appended to --results): case, layout, inter, seconds until the last surviving rank
# exited, seconds until the job (mpirun) ended, exit code.
#
# With the link cut, Open MPI's own control plane (mpirun <-> the node's daemon) waits for TCP
# to give up before mpirun can end: the case sets net.ipv4.tcp_retries2=5 (~13 s) in the
# cluster's namespaces (the kernel's default, 15, is ~15 minutes). hsdp's ranks do not wait for
# it: they exit on their own (docs/reliability.md).
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLUSTER=$HERE/../cluster/cluster.sh
fault=; layout=zero3; inter=mpi; timeout_s=20; results=
while [ $# -gt 0 ]; do
  case $1 in
    --case) fault=$2; shift 2 ;;
    --layout) layout=$2; shift 2 ;;
    --inter) inter=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "fault_matrix: unknown argument $1"; exit 2 ;;
  esac
done
[ $# -ge 1 ] || { echo "fault_matrix: usage: --case CASE ... -- TRAIN_MLP"; exit 2; }
train=$1
case $layout in
  zero3) shard=(--mode zero3 --intra-shard 4 --inter-shard 2) ;;
  hsdp) shard=(--mode zero3 --intra-shard 4 --inter-shard 1) ;;
  *) echo "fault_matrix: unknown layout $layout"; exit 2 ;;
esac
case $fault in stop|kill|cut|orted) ;; *) echo "fault_matrix: unknown case $fault"; exit 2 ;; esac

out=$(mktemp -d /tmp/hsdp-faults.XXXXXX)
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
fail() {
  echo "fault_matrix: FAIL ($fault, $layout, inter $inter): $*"
  echo "---- job output (last 40 lines) ----"; tail -n 40 "$out/stderr.log" 2>/dev/null
  [ -n "${cpid:-}" ] && kill -TERM "$cpid" 2>/dev/null && wait "$cpid" 2>/dev/null
  rm -rf "$out"; exit 1
}

export HSDP_TIMEOUT_S=$timeout_s HSDP_TRANSPORT_INTER=$inter
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
"$CLUSTER" --nodes 2 --ranks-per-node 4 --timeout 240 --keep-output "$out" -- \
  "$train" "${shard[@]}" --steps 100000000 >/dev/null 2>&1 &
cpid=$!
tag=hsdpc$cpid

# Mid-training: wait for 10 step rows.
for ((i = 0; i < 600; i++)); do
  rows=$(grep -cE '^ +[0-9]+ +[0-9.]+ ' "$out/stdout.log" 2>/dev/null)
  [ "${rows:-0}" -ge 10 ] && break
  kill -0 "$cpid" 2>/dev/null || fail "the job ended before training got going"
  sleep 0.1
done
[ "${rows:-0}" -ge 10 ] || fail "no training after 60 s"

# The job's processes, with their ranks and nodes, seen from the host.
declare -A rank_pid
job_pids=()
orted_pid=
for n in 0 1; do
  for p in $(ip netns pids "$tag-n$n" 2>/dev/null); do
    comm=$(cat "/proc/$p/comm" 2>/dev/null)
    case $comm in
      train_mlp)
        r=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        [ -n "$r" ] && rank_pid[$r]=$p && job_pids+=("$p") ;;
      orted) [ "$n" -eq 1 ] && orted_pid=$p; job_pids+=("$p") ;;
    esac
  done
done
job_pids+=($(ip netns pids "$tag-sw" 2>/dev/null))
[ "${#rank_pid[@]}" -eq 8 ] || fail "found ${#rank_pid[@]} ranks, expected 8"

victim=
t_fault=$(now)
case $fault in
  stop) victim=${rank_pid[2]}; kill -STOP "$victim" ;;
  kill) victim=${rank_pid[2]}; kill -KILL "$victim" ;;
  cut)
    for ns in "$tag-sw" "$tag-n0" "$tag-n1"; do
      ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5 || fail "sysctl in $ns"
    done
    ip -n "$tag-sw" link set p1 down || fail "cannot take node 1's link down" ;;
  orted) [ -n "$orted_pid" ] || fail "no daemon on node 1"; kill -KILL "$orted_pid" ;;
esac

# Until every surviving rank has exited (the victim is not waited for), then until the job ends.
limit=$((timeout_s + 15))
survivors_exit=
while :; do
  left=0
  for r in "${!rank_pid[@]}"; do
    p=${rank_pid[$r]}
    [ "$p" = "$victim" ] && continue
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)
    [ -n "$st" ] && [ "$st" != Z ] && left=$((left + 1))
  done
  if [ "$left" -eq 0 ]; then survivors_exit=$(since "$t_fault"); break; fi
  awk -v t="$(since "$t_fault")" -v l="$limit" 'BEGIN { exit !(t > l + 30) }' && break
  sleep 0.1
done
wait "$cpid"
rc=$?
job_end=$(since "$t_fault")
cpid=
[ -n "$survivors_exit" ] || fail "surviving ranks still running $((limit + 30)) s after the fault"
awk -v t="$survivors_exit" -v l="$limit" 'BEGIN { exit !(t <= l) }' ||
  fail "the last surviving rank exited ${survivors_exit} s after the fault (limit ${limit} s)"
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$rc" -eq 124 ] && fail "cluster.sh timed out (the job hung)"
case $fault in
  stop) named='rank 2 \(hsdp-node0, stopped' ;;
  # mpirun's report, or a peer's over UCX (another node's endpoints fail their transfers to
  # the dead rank, ucx_resources.cc), whichever ends the job first.
  kill) named='process rank 2 with PID [0-9]+ on node (hsdp-node0|10\.213\.7\.1) exited on signal 9|\(world rank 2\) failed' ;;
  # The watchdog's report, or (inter level on UCX) a node-0 rank's failed transfer to a rank of
  # node 1: UCX's endpoints to other hosts detect the dead link themselves (Endpoint timeout,
  # peer-failure mode, ucx_resources.cc), sometimes before HSDP_TIMEOUT_S.
  cut) named='unreachable: hsdp-node1 \(ranks 4-7\)|\(world rank [4-7]\) failed: UCX error' ;;
  orted) named='Remote daemon: .* on node 10\.213\.7\.2' ;;
esac
grep -qE "$named" "$out/stderr.log" || fail "no line names the fault (/$named/)"
sleep 0.5
for p in "${job_pids[@]}"; do
  [ -e "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] &&
    fail "process $p ($(cat /proc/$p/comm 2>/dev/null)) of the job is left"
done
ip netns list 2>/dev/null | grep -q "^$tag-" && fail "namespaces of the cluster are left"
ls -d /tmp/$tag.* >/dev/null 2>&1 && fail "the cluster's temp dir is left"
line="fault_matrix: $fault $layout inter=$inter: last surviving rank exited ${survivors_exit} s after the fault, job ended after ${job_end} s, exit code $rc (HSDP_TIMEOUT_S=$timeout_s) OK"
echo "$line"
grep -E "hsdp \[rank [0-9]+\]: (timeout|job ends)" "$out/stderr.log" | head -3
[ -n "$results" ] && echo "$line" >>"$results"
rm -rf "$out"
exit 0
