#!/usr/bin/env bash
# Tracing's cost (docs/trace.md, "Cost"): train_gpt --preset small on 8 ranks (2 virtual nodes x
# 4, intra_shard 4, inter_shard 1, as scripts/demo), tracing off against --trace DIR, in
# interleaved rounds (off, on, on, off, ...); per run the median step time after the warm-up
# steps, then the median over the rounds of each and their ratio.
#   bench/trace_bench.sh [--rounds N] [--steps S] [--warmup W]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds=3 steps=12 warmup=2
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    *) echo "trace_bench: unknown argument '$1' (--rounds N --steps S --warmup W)" >&2; exit 2 ;;
  esac
done
bin=$root/build/examples/train_gpt
[ -x "$bin" ] || { echo "trace_bench: $bin is not built" >&2; exit 2; }
tmp=$(mktemp -d /tmp/hsdp-trace-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# The median time_ms of the step rows after the warm-up steps ("k/n" in the first column).
median_step() {
  awk -v w="$warmup" '$1 ~ /^[0-9]+\/[0-9]+$/ { split($1, s, "/"); if (s[1] > w) t[n++] = $5 }
    END { for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (t[j] < t[i]) { x = t[i]; t[i] = t[j]; t[j] = x }
          if (n == 0) exit 1; printf "%.1f\n", (n % 2) ? t[int(n / 2)] : (t[n / 2 - 1] + t[n / 2]) / 2 }' "$1"
}

run() {  # run <off|on> <round>
  local log=$tmp/$1.$2.log extra=()
  [ "$1" = on ] && extra=(--trace "$tmp/trace.$2")
  if ! "$root/scripts/mpirun-local" -np 8 -x HSDP_RANKS_PER_NODE=4 "$bin" --preset small \
      --intra-shard 4 --inter-shard 1 --steps "$steps" --eval-batches 0 --sample 0 \
      "${extra[@]}" >"$log" 2>&1; then
    echo "trace_bench: the $1 run of round $2 failed; its last lines:" >&2
    tail -5 "$log" >&2
    exit 1
  fi
  median_step "$log"
}

off=() on=()
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then order="off on"; else order="on off"; fi
  for c in $order; do
    v=$(run "$c" "$r")
    echo "round $r $c: median step ${v} ms"
    if [ "$c" = on ]; then on+=("$v"); else off+=("$v"); fi
  done
done
med() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { printf "%.1f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m_off=$(med "${off[@]}") m_on=$(med "${on[@]}")
echo "result tracing_off_ms=$m_off tracing_on_ms=$m_on on_over_off=$(awk -v a="$m_on" -v b="$m_off" 'BEGIN { printf "%.4f", a / b }') rounds=$rounds steps=$steps warmup=$warmup"
