#!/usr/bin/env bash
# hsdp.torch against PyTorch FSDP2, the torch compute alone and C++ train_gpt, on the emulated
# 2 x 4 cluster (tests/cluster/cluster.sh: two network namespaces joined by a rate-limited
# bridge): HF GPT-2 small (6 layers, d 384, context 128, 10.8 M parameters), a global batch of
# 8 x 128, fp32, one compute thread per rank, the same initial weights and batches
# (bench/torch_bench.py). Layouts: 4x1 (intra 4 x inter 1: HSDP, a shard group per node, 2
# replicas; FSDP2 on a 2-D DeviceMesh) and 4x2 (intra 4 x inter 2: one shard group of 8; FSDP2 on
# a 1-D mesh of 8). Every round runs every case once, in an order rotated round by round
# (interleaved: the machine is noisy); the table gives medians over rounds of each run's median
# step. Needs root (network namespaces), scripts/python-env's build/pyenv, a built tree.
#   bench/torch_bench.sh [--rounds R] [--steps N] [--warmup W] [--rates "1gbit none"]
set -euo pipefail
root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${HSDP_BUILD_DIR:-$root/build}
rounds=3 steps=8 warmup=2 rates="1gbit none"
bench_name=torch_bench
source "$root/bench/bench_args.sh"
while (($#)); do
  case $1 in
    --rounds) posint --rounds "${2-}" 1; rounds=$2; shift 2 ;;
    --steps) posint --steps "${2-}" 1; steps=$2; shift 2 ;;
    --warmup) posint --warmup "${2-}" 0; warmup=$2; shift 2 ;;
    --rates) [ -n "${2-}" ] || die "--rates needs a value"; rates=$2; shift 2 ;;
    *) die "unknown argument '$1' (--rounds --steps --warmup --rates)" ;;
  esac
done
py=$build/pyenv/bin/python
[ -x "$py" ] && "$py" -c "import hsdp.torch, transformers" 2>/dev/null ||
  die "no hsdp.torch in $build/pyenv: run scripts/python-env"
[ -x "$build/examples/train_gpt" ] || die "no $build/examples/train_gpt: run scripts/setup"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cases=("hsdp 4x1" "fsdp2 4x1" "hsdp 4x2" "fsdp2 4x2" "alone -" "train_gpt 4x1" "train_gpt 4x2")
run_case() {  # rate impl layout -> one "result ..." line on stdout
  local rate=$1 impl=$2 layout=$3 cmd
  if [ "$impl" = train_gpt ]; then
    cmd=("$build/examples/train_gpt" --preset small --batch 8 --steps $((warmup + steps))
         --intra-shard 4 --inter-shard "${layout#4x}" --eval-every 0 --sample 0 --lr 3e-4)
  else
    cmd=("$py" "$root/bench/torch_bench.py" --impl "$impl" --steps "$steps" --warmup "$warmup")
    [ "$layout" = - ] || cmd+=(--layout "$layout")
  fi
  local log=$tmp/run.log
  if ! "$root/tests/cluster/cluster.sh" --nodes 2 --ranks-per-node 4 --rate "$rate" --timeout 900 \
      -- "${cmd[@]}" >"$log" 2>&1; then
    echo "torch_bench: $impl $layout at $rate failed; its last lines:" >&2
    tail -5 "$log" >&2
    return 1
  fi
  if [ "$impl" = train_gpt ]; then
    # The step table's time_ms and exposed_ms after the warm-up steps: their medians.
    awk -v w="$warmup" -v l="$layout" '$1 ~ /^[0-9]+\/[0-9]+$/ { split($1, s, "/");
        if (s[1] > w) { t[n] = $5 / 1000; e[n++] = $7 / 1000 } }
      function med(a, n,   i, j, x) { for (i = 0; i < n; i++) for (j = i + 1; j < n; j++)
        if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x } return a[int(n / 2)] }
      END { printf "result impl=train_gpt layout=%s step_s=%.4f exposed_s=%.4f rss_mb=- copied=0\n",
            l, med(t, n), med(e, n) }' "$log"
  else
    grep '^result ' "$log"
  fi
}

for rate in $rates; do
  : >"$tmp/results.$rate"
  for ((r = 0; r < rounds; r++)); do
    n=${#cases[@]}
    for ((i = 0; i < n; i++)); do
      c=${cases[$(((i + r) % n))]}
      # shellcheck disable=SC2086
      line=$(run_case "$rate" $c) || exit 1
      echo "rate=$rate round=$((r + 1)) $line"
      echo "$line" >>"$tmp/results.$rate"
    done
  done
done

echo
echo "# hsdp.torch vs FSDP2 vs torch alone vs C++ train_gpt: GPT-2 small, 2 nodes x 4 ranks," \
  "medians of $rounds rounds x $steps steps"
printf '%-8s %-10s %-6s %10s %12s %8s %14s %14s\n' rate impl layout step_s exposed_s rss_mb \
  vs_fsdp2 vs_alone
for rate in $rates; do
  "$py" - "$tmp/results.$rate" "$rate" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    rows.setdefault((f["impl"], f["layout"]), []).append(f)
med = {k: statistics.median(float(f["step_s"]) for f in v) for k, v in rows.items()}
alone = med.get(("alone", "-"))
for (impl, layout), v in rows.items():
    exp = statistics.median(float(f["exposed_s"]) for f in v)
    rss = "-" if v[0]["rss_mb"] == "-" else max(int(f["rss_mb"]) for f in v)
    fsdp = med.get(("fsdp2", layout))
    vf = f"{med[(impl, layout)] / fsdp:.3f}x" if fsdp and impl != "fsdp2" else "-"
    va = f"{med[(impl, layout)] / alone:.3f}x" if alone and impl != "alone" else "-"
    print(f"{sys.argv[2]:<8} {impl:<10} {layout:<6} {med[(impl, layout)]:10.4f} "
          f"{exp if exp >= 0 else '-':>12} {rss:>8} {vf:>14} {va:>14}")
PY
done
