#!/usr/bin/env bash
# Elastic replica groups on the emulated 3-node cluster (tests/cluster/cluster.sh: root, network
# namespaces, `tc` link rates), train_gpt, one group of 2 ranks per node, medians of --repeats:
#   1. steady state, elastic off: one 6-rank mpirun, 3 replicas of a 2-rank shard group (one per
#      node), the replica all-reduce over the links; on: hsdp-elastic, one group per node, the
#      replica Comm (UCX) over the same links (tests/elastic/elastic_cluster_job.sh). The median of the
#      time_ms column over the steps after the third (group 0's rows), and the ratio on/off.
#   2. kill -9 of a rank of group 1 after its step 6: seconds from the kill to group 0's row of
#      step 7 (the survivors' next committed step), and the restarted group's heal line (bytes per
#      rank, seconds, GB/s) against the link rate.
#   3. restart from a checkpoint, side by side: the off job with --save-dir --save-every 5, a rank
#      killed after step 6, the whole job started again with --resume latest: seconds from the
#      kill to its row of step 7 (the same step as 2).
#   bench/elastic_cluster_bench.sh [--rate RATE] [--steps N] [--preset tiny|small] [--batch B]
#                                  [--repeats N] [--build DIR]
set -uo pipefail
rate=1gbit steps=20 preset=small batch=12 reps=1 build=./build
bench_name=elastic_cluster_bench
source "$(dirname "${BASH_SOURCE[0]}")/bench_args.sh"
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=${2:-}; shift 2 ;;
    --steps) steps=${2:-}; shift 2 ;;
    --preset) preset=${2:-}; shift 2 ;;
    --batch) batch=${2:-}; shift 2 ;;
    --repeats) reps=${2:-}; shift 2 ;;
    --build) build=${2:-}; shift 2 ;;
    -h | --help) sed -n '2,/^#   bench/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown flag '$1'" ;;
  esac
done
posint --steps "$steps" 8
posint --repeats "$reps" 1
[[ $batch =~ ^[0-9]+$ ]] && [ $((batch % 6)) -eq 0 ] && [ "$batch" -gt 0 ] ||
  die "--batch '$batch' must be a positive multiple of 6 (3 groups x 2 ranks)"
case $preset in tiny | small) ;; *) die "--preset '$preset' is not tiny or small" ;; esac
here=$(cd "$(dirname "$0")/.." && pwd)
gpt=$build/examples/train_gpt elastic=$build/tools/hsdp-elastic
[ -x "$gpt" ] && [ -x "$elastic" ] || die "--build '$build' has no examples/train_gpt and tools/hsdp-elastic"
cluster=$here/tests/cluster/cluster.sh job=$here/tests/elastic/elastic_cluster_job.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--preset "$preset" --mode zero3 --intra-shard 2 --inter-shard 1 --batch "$batch"
  --steps "$steps")

median() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "n/a"}'; }
# The median time_ms of group 0's rows after the third (train_gpt rows: "  s/N ...").
gpt_ms() {  # the time_ms column: the header names it
  awk 'index($0, "time_ms") && !h {for (i = 1; i <= NF; ++i) if ($i == "time_ms") c = i; h = 1; next}
       h && $1 ~ /^[0-9]+\/[0-9]+$/ {split($1, a, "/"); if (a[1] > 3) print $c}' "$1" | median
}

off=() on=() kill_s=() heal=() ckpt_s=()
for ((r = 1; r <= reps; ++r)); do
  echo "elastic_cluster_bench: run $r of $reps: off" >&2
  "$cluster" --nodes 3 --ranks-per-node 2 --rate "$rate" --timeout 900 -- "$gpt" "${args[@]}" \
    >"$tmp/off.log" 2>&1 || echo "elastic_cluster_bench: the off run failed: $(tail -2 "$tmp/off.log")" >&2
  off+=("$(gpt_ms "$tmp/off.log")")
  echo "elastic_cluster_bench: run $r of $reps: on" >&2
  rm -rf "$tmp/on"
  "$cluster" --nodes 3 --ranks-per-node 2 --rate "$rate" --timeout 900 --exec -- \
    bash "$job" run "$tmp/on" "$elastic" "$gpt" "${args[@]}" >"$tmp/on.out" 2>&1 ||
    echo "elastic_cluster_bench: the on run failed: $(tail -2 "$tmp/on.out")" >&2
  on+=("$(gpt_ms "$tmp/on/g0r0.rank0.log")")
  echo "elastic_cluster_bench: run $r of $reps: kill" >&2
  rm -rf "$tmp/kill"
  KILL_AT=6 "$cluster" --nodes 3 --ranks-per-node 2 --rate "$rate" --timeout 900 --exec -- \
    bash "$job" kill "$tmp/kill" "$elastic" "$gpt" "${args[@]}" >"$tmp/kill.out" 2>&1 ||
    echo "elastic_cluster_bench: the kill run failed: $(tail -2 "$tmp/kill.out")" >&2
  if [ -f "$tmp/kill/kill.time" ] && [ -f "$tmp/kill/next_row.time" ]; then
    kill_s+=("$(echo "$(cat "$tmp/kill/next_row.time") - $(cat "$tmp/kill/kill.time")" | bc -l)")
  fi
  h=$(grep -ah "healed to step" "$tmp"/kill/g1r1.rank0.log 2>/dev/null | head -1)
  [ -n "$h" ] && heal+=("$h")
  echo "elastic_cluster_bench: run $r of $reps: restart from a checkpoint" >&2
  rm -rf "$tmp/ckpt"
  HSDP_BENCH_RUN=ckpt-$$ "$cluster" --nodes 3 --ranks-per-node 2 --rate "$rate" --timeout 900 -- \
    "$gpt" "${args[@]}" --save-dir "$tmp/ckpt" --save-every 5 >"$tmp/ck1.log" 2>&1 &
  ck=$!
  for ((i = 0; i < 18000; ++i)); do
    grep -qaE "^ +6/[0-9]+ " "$tmp/ck1.log" && break
    sleep 0.05
  done
  victim=
  for p in $(pgrep -f "$gpt"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "HSDP_BENCH_RUN=ckpt-$$" && victim=$p
  done
  t_kill=$(date +%s.%N)
  [ -n "$victim" ] && kill -9 "$victim"
  wait "$ck"
  "$cluster" --nodes 3 --ranks-per-node 2 --rate "$rate" --timeout 900 -- "$gpt" "${args[@]}" \
    --save-dir "$tmp/ckpt" --resume latest >"$tmp/ck2.log" 2>&1 &
  ck=$!
  for ((i = 0; i < 60000; ++i)); do
    if grep -qaE "^ +7/[0-9]+ " "$tmp/ck2.log"; then
      ckpt_s+=("$(echo "$(date +%s.%N) - $t_kill" | bc -l)")
      break
    fi
    kill -0 "$ck" 2>/dev/null || break
    sleep 0.01
  done
  wait "$ck"
done
off_ms=$(printf '%s\n' "${off[@]}" | grep -v n/a | median)
on_ms=$(printf '%s\n' "${on[@]}" | grep -v n/a | median)
ks=$(printf '%s\n' "${kill_s[@]:-}" | grep . | median)
echo
echo "elastic_cluster_bench: 3 nodes x 2 ranks at $rate, train_gpt --preset $preset --batch $batch," \
  "one group per node, median of $reps"
printf '%-44s %s\n' metric value
printf '%-44s %s\n' "step time off (ms)" "$off_ms"
printf '%-44s %s\n' "step time on (ms)" "$on_ms"
[ "$off_ms" != n/a ] && [ "$on_ms" != n/a ] &&
  printf '%-44s %.3fx\n' "on/off" "$(echo "$on_ms / $off_ms" | bc -l)"
printf '%-44s %s\n' "kill -> survivors' step 7 (s)" "$ks"
printf '%-44s %s\n' "kill -> step 7 restarting from a checkpoint (s)" \
  "$(printf '%s\n' "${ckpt_s[@]:-}" | grep . | median)"
for h in "${heal[@]:-}"; do [ -n "$h" ] && printf '%-44s %s\n' "heal" "${h#elastic: }"; done
