#!/usr/bin/env bash
# Semi-synchronous replicas (docs/semi_sync.md) on the emulated 3-node cluster
# (tests/cluster/cluster.sh: root, network namespaces, `tc` link rates): train_gpt, 3 nodes x 2
# ranks, zero3 with intra_shard 2, so each node is one replica group and only the replica level
# crosses the links. Per link rate, the same steps and tokens for each configuration:
#   sync; diloco H = 10; diloco H = 50; streaming diloco H = 10, F = 3; each with the fp32 and the
#   int8 replica wire (HSDP_REPLICA_WIRE: the outer all-reduce's wire; sync's gradient all-reduce)
# and prints a row per run: the median tokens/s over the steps after the third, and the last
# validation loss (train_gpt's "val loss X after step N", every --eval-every steps). Writes
# OUT/runs.csv (config, rate, step, tokens, val_loss) and OUT/loss_vs_tokens.svg (one line per
# configuration and rate).
#   bench/semi_sync_bench.sh [--rates 1gbit,100mbit] [--steps N] [--preset tiny|small]
#                            [--batch B] [--eval-every K] [--configs LIST] [--out DIR]
#                            [--build DIR]
# --configs: comma-separated of sync, diloco10, diloco50, stream10x3, each optionally +int8
# (default: all eight). Bytes across nodes per token are not measured here (left to the link
# counters; docs/semi_sync.md: the expected ratio is H, or H/F per fragment sync).
set -uo pipefail
rates=1gbit,100mbit steps=100 preset=small batch=12 every=10 out=./semi_sync_bench build=./build
configs=sync,sync+int8,diloco10,diloco10+int8,diloco50,diloco50+int8,stream10x3,stream10x3+int8
bench_name=semi_sync_bench
source "$(dirname "${BASH_SOURCE[0]}")/bench_args.sh"
while [ $# -gt 0 ]; do
  case $1 in
    --rates) rates=${2:-}; shift 2 ;;
    --steps) steps=${2:-}; shift 2 ;;
    --preset) preset=${2:-}; shift 2 ;;
    --batch) batch=${2:-}; shift 2 ;;
    --eval-every) every=${2:-}; shift 2 ;;
    --configs) configs=${2:-}; shift 2 ;;
    --out) out=${2:-}; shift 2 ;;
    --build) build=${2:-}; shift 2 ;;
    -h | --help) sed -n '2,/^# --configs/s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) die "unknown flag '$1'" ;;
  esac
done
posint --steps "$steps" 4
posint --eval-every "$every" 1
[[ $batch =~ ^[0-9]+$ ]] && [ $((batch % 6)) -eq 0 ] && [ "$batch" -gt 0 ] ||
  die "--batch '$batch' must be a positive multiple of 6 (3 nodes x 2 ranks)"
case $preset in tiny | small) ;; *) die "--preset '$preset' is not tiny or small" ;; esac
here=$(cd "$(dirname "$0")/.." && pwd)
gpt=$build/examples/train_gpt cluster=$here/tests/cluster/cluster.sh
[ -x "$gpt" ] || die "--build '$build' has no examples/train_gpt"
mkdir -p "$out" || die "--out '$out' cannot be made"
echo "config,rate,step,tokens,val_loss" >"$out/runs.csv"

# The flags of a configuration name (and its wire, after '+').
policy_args() {
  case ${1%%+*} in
    sync) echo "--replica-policy sync" ;;
    diloco10) echo "--replica-policy diloco --sync-every 10" ;;
    diloco50) echo "--replica-policy diloco --sync-every 50" ;;
    stream10x3) echo "--replica-policy diloco --sync-every 10 --fragments 3" ;;
    *) return 1 ;;
  esac
}
median() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "n/a"}'; }
tokens_per_s() {  # the tokens/s column of the rows after step 3 (rows: "  s/N ...")
  awk 'index($0, "tokens/s") && !h {for (i = 1; i <= NF; ++i) if ($i == "tokens/s") c = i; h = 1; next}
       h && $1 ~ /^[0-9]+\/[0-9]+$/ {split($1, a, "/"); if (a[1] > 3) print $c}' "$1" | median
}

printf "%-18s %-8s %12s %10s\n" config rate tokens/s val_loss
IFS=, read -ra cfgs <<<"$configs"
IFS=, read -ra rts <<<"$rates"
for rate in "${rts[@]}"; do
  for c in "${cfgs[@]}"; do
    pa=$(policy_args "$c") || die "--configs: '$c' is not sync, diloco10, diloco50 or stream10x3"
    wire=fp32
    [[ $c == *+int8 ]] && wire=int8
    log=$out/$c.$rate.log
    # shellcheck disable=SC2086
    HSDP_REPLICA_WIRE=$wire "$cluster" --nodes 3 --ranks-per-node 2 --rate "$rate" --timeout 3600 \
      -- "$gpt" --preset "$preset" --mode zero3 --intra-shard 2 --batch "$batch" --steps "$steps" \
      --eval-every "$every" $pa >"$log" 2>&1 ||
      echo "semi_sync_bench: $c at $rate failed: $(tail -2 "$log")" >&2
    tok=$(tokens_per_s "$log")
    per_step=$(awk '/^model: GPT-2/ {for (i = 1; i <= NF; ++i) if ($i == "context") {gsub(",", "", $(i+1)); print $(i+1)}}' "$log" | head -1)
    awk -v c="$c" -v r="$rate" -v b="$batch" -v ctx="${per_step:-0}" \
      '/val loss [0-9.eE+-]+ after step/ {for (i = 1; i <= NF; ++i) if ($i == "step") s = $(i+1);
         print c "," r "," s "," s * b * ctx "," $3}' "$log" >>"$out/runs.csv"
    val=$(grep -aoE 'val loss [0-9.eE+-]+' "$log" | tail -1 | awk '{print $3}')
    printf "%-18s %-8s %12s %10s\n" "$c" "$rate" "$tok" "${val:-n/a}"
  done
done

# The loss-against-tokens plot: a polyline per (config, rate).
python3 - "$out/runs.csv" "$out/loss_vs_tokens.svg" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
lines = {}
for r in rows:
    lines.setdefault(f"{r['config']} {r['rate']}", []).append((float(r['tokens']), float(r['val_loss'])))
W, H, M = 720, 420, 60
xs = [x for pts in lines.values() for x, _ in pts] or [0, 1]
ys = [y for pts in lines.values() for _, y in pts] or [0, 1]
x0, x1, y0, y1 = min(xs), max(xs) or 1, min(ys), max(ys)
sx = lambda x: M + (x - x0) / ((x1 - x0) or 1) * (W - 2 * M)
sy = lambda y: H - M - (y - y0) / ((y1 - y0) or 1) * (H - 2 * M)
colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<text x="{W/2}" y="20" text-anchor="middle">validation loss against tokens</text>',
       f'<text x="{W/2}" y="{H-15}" text-anchor="middle">tokens ({x0:.3g} .. {x1:.3g})</text>',
       f'<text x="12" y="{H/2}" transform="rotate(-90 12 {H/2})" text-anchor="middle">val loss ({y0:.4g} .. {y1:.4g})</text>']
for k, (name, pts) in enumerate(sorted(lines.items())):
    pts.sort()
    c = colors[k % len(colors)]
    out.append('<polyline fill="none" stroke="%s" points="%s"/>' % (c, " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)))
    out.append(f'<text x="{W-M+4}" y="{M + 14*k}" fill="{c}" text-anchor="end">{name}</text>')
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
EOF
echo "semi_sync_bench: $out/runs.csv, $out/loss_vs_tokens.svg"
