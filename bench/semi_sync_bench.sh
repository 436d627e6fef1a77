#!/usr/bin/env bash
# Semi-synchronous replicas (docs/semi_sync.md) on the emulated 3-node cluster
# (tests/cluster/cluster.sh: root, network namespaces, `tc` link rates): train_gpt, 3 nodes x 2
# ranks, zero3 with intra_shard 2, so each node is one replica group and only the replica level
# crosses the links. Per link rate, the same steps and tokens for each configuration:
#   sync; diloco H = 10; diloco H = 50; streaming diloco H = 10, F = 3 (tau 0, and tau 1 with
#   stream10x3t1); each with the fp32 and the int8 replica wire (HSDP_REPLICA_WIRE: the outer
#   all-reduce's wire; sync's gradient all-reduce)
# and prints a row per run: the median tokens/s over the steps after the third; the tokens/s over
# whole sync periods (the last k*P steps after the third, P = H, 1 for sync: every fragment's
# sync counted once per period; "n/a" when --steps < 3 + P); the bytes sent across nodes per
# token over the same steps (the inter and replica levels' counted bytes, train_gpt's "bytes:"
# lines, summed over the ranks; summary.csv also has the whole run's); and the last validation
# loss (train_gpt's "val loss X after step N", every --eval-every steps). Writes OUT/runs.csv
# (config, rate, step, tokens, val_loss), OUT/summary.csv (a row per run) and
# OUT/loss_vs_tokens.svg (one line per configuration and rate). The loss after a number of
# tokens does not depend on the link rate (the same seeds, batches and math): measure loss
# curves with --rates none and long --steps, tokens/s with short runs at the rates.
#   bench/semi_sync_bench.sh [--rates 1gbit,100mbit] [--steps N] [--preset tiny|small]
#                            [--batch B] [--eval-every K] [--configs LIST] [--out DIR]
#                            [--build DIR] [--repeat R] [--extra "FLAGS"] [--plot-only]
# --configs: comma-separated of sync, diloco10, diloco50, stream10x3, stream10x3t1, each
# optionally +int8 (default: the first four, each with both wires). --repeat R runs the list R
# times, round-robin (interleaved), a row per run. --extra: more train_gpt flags for every run
# (e.g. "--outer-lr 0.5"); rows and files name the configuration only, so use another --out.
# --plot-only: no runs; redraw OUT/loss_vs_tokens.svg from OUT/runs.csv (e.g. several
# invocations' runs.csv concatenated, one header line).
set -uo pipefail
rates=1gbit,100mbit steps=100 preset=small batch=12 every=10 out=./semi_sync_bench build=./build
repeat=1 extra='' plot_only=0
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
    --repeat) repeat=${2:-}; shift 2 ;;
    --extra) extra=${2:-}; shift 2 ;;
    --plot-only) plot_only=1; shift ;;
    -h | --help) sed -n '2,/^set -uo/{s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) die "unknown flag '$1'" ;;
  esac
done
posint --steps "$steps" 4
posint --eval-every "$every" 1
posint --repeat "$repeat" 1
[[ $batch =~ ^[0-9]+$ ]] && [ $((batch % 6)) -eq 0 ] && [ "$batch" -gt 0 ] ||
  die "--batch '$batch' must be a positive multiple of 6 (3 nodes x 2 ranks)"
case $preset in tiny | small) ;; *) die "--preset '$preset' is not tiny or small" ;; esac
here=$(cd "$(dirname "$0")/.." && pwd)
gpt=$build/examples/train_gpt cluster=$here/tests/cluster/cluster.sh
[ -x "$gpt" ] || die "--build '$build' has no examples/train_gpt"
mkdir -p "$out" || die "--out '$out' cannot be made"
# The loss-against-tokens plot from OUT/runs.csv: a polyline per (config, rate), without the
# initial loss (step 0, the same for every run).
plot() {
python3 - "$out/runs.csv" "$out/loss_vs_tokens.svg" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
lines = {}
for r in rows:
    if float(r['tokens']) == 0: continue  # the initial loss, the same for every run
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
for f in range(5):  # grid lines with their values
    yv, xv = y0 + (y1 - y0) * f / 4, x0 + (x1 - x0) * f / 4
    out.append(f'<line x1="{M}" x2="{W-M}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" stroke="#ddd"/>')
    out.append(f'<text x="{M-4}" y="{sy(yv)+4:.1f}" text-anchor="end">{yv:.3f}</text>')
    out.append(f'<text x="{sx(xv):.1f}" y="{H-M+14}" text-anchor="middle">{xv:.3g}</text>')
for k, (name, pts) in enumerate(sorted(lines.items())):
    pts.sort()
    c = colors[k % len(colors)]
    out.append('<polyline fill="none" stroke="%s" points="%s"/>' % (c, " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)))
    out.append(f'<text x="{W-M+4}" y="{M + 14*k}" fill="{c}" text-anchor="end">{name}</text>')
out.append("</svg>")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
EOF
}
if [ "$plot_only" = 1 ]; then
  [ -s "$out/runs.csv" ] || die "--plot-only: no '$out/runs.csv'"
  plot && echo "semi_sync_bench: $out/loss_vs_tokens.svg" && exit 0
  exit 1
fi
echo "config,rate,step,tokens,val_loss" >"$out/runs.csv"
echo "config,rate,run,steps,tokens,tokens_per_s_median,tokens_per_s_periods,bytes_across_nodes,bytes_per_token,val_loss" >"$out/summary.csv"

# The flags of a configuration name (and its wire, after '+').
policy_args() {
  case ${1%%+*} in
    sync) echo "--replica-policy sync" ;;
    diloco10) echo "--replica-policy diloco --sync-every 10" ;;
    diloco50) echo "--replica-policy diloco --sync-every 50" ;;
    stream10x3) echo "--replica-policy diloco --sync-every 10 --fragments 3" ;;
    stream10x3t1) echo "--replica-policy diloco --sync-every 10 --fragments 3 --sync-delay 1" ;;
    *) return 1 ;;
  esac
}
# The sync period P of a configuration's flags: --sync-every, 1 without it (sync).
period_of() { awk '{for (i = 1; i < NF; ++i) if ($i == "--sync-every") p = $(i+1)} END {print p ? p : 1}' <<<"$1"; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "n/a"}'; }
tokens_per_s() {  # the tokens/s column of the rows after step 3 (rows: "  s/N ...")
  awk 'index($0, "tokens/s") && !h {for (i = 1; i <= NF; ++i) if ($i == "tokens/s") c = i; h = 1; next}
       h && $1 ~ /^[0-9]+\/[0-9]+$/ {split($1, a, "/"); if (a[1] > 3) print $c}' "$1" | median
}
# LOG PERIOD TOKENS_PER_STEP: over the last k*P steps after the third (whole sync periods, so
# each fragment's sync counts once a period): "TOKENS_PER_S BYTES_PER_TOKEN", the tokens/s from
# the rows' time_ms (the slowest rank's step: the outer sync and its wait are inside it) and the
# bytes sent across nodes per token (the "bytes:" line under each row: inter + replica, all
# ranks). "n/a n/a" when the run has fewer than 3 + P steps.
period_stats() {
  awk -v p="$2" -v tps="$3" 'index($0, "time_ms") && !h {for (i = 1; i <= NF; ++i) if ($i == "time_ms") c = i; h = 1; next}
       h && $1 ~ /^[0-9]+\/[0-9]+$/ {split($1, a, "/"); s = a[1]; t[s] = $c; if (s > n) n = s}
       $1 == "bytes:" && s {for (i = 2; i < NF; ++i) if ($i == "inter" || $i == "replica") b[s] += $(i+1)}
       END {k = int((n - 3) / p); if (k < 1 || tps <= 0) {print "n/a n/a"; exit}
            for (j = n - k * p + 1; j <= n; ++j) {ms += t[j]; by += b[j]}
            printf "%.0f %.0f\n", k * p * tps / (ms / 1e3), by / (k * p * tps)}' "$1"
}
# LOG: the bytes sent across nodes over the whole run (the "bytes:" lines' inter + replica).
bytes_across() { awk '$1 == "bytes:" {for (i = 2; i < NF; ++i) if ($i == "inter" || $i == "replica") b += $(i+1)} END {printf "%.0f\n", b}' "$1"; }

IFS=, read -ra cfgs <<<"$configs"
IFS=, read -ra rts <<<"$rates"
for c in "${cfgs[@]}"; do
  policy_args "$c" >/dev/null || die "--configs: '$c' is not sync, diloco10, diloco50, stream10x3 or stream10x3t1"
done
printf "%-18s %-8s %12s %10s %14s %12s\n" config rate tokens/s val_loss tok/s_periods bytes/token
for rate in "${rts[@]}"; do
  for ((run = 1; run <= repeat; ++run)); do
    for c in "${cfgs[@]}"; do
      pa=$(policy_args "$c")
      wire=fp32
      [[ $c == *+int8 ]] && wire=int8
      log=$out/$c.$rate.log
      [ "$repeat" -gt 1 ] && log=$out/$c.$rate.run$run.log
      # shellcheck disable=SC2086
      HSDP_REPLICA_WIRE=$wire "$cluster" --nodes 3 --ranks-per-node 2 --rate "$rate" --timeout 3600 \
        -- "$gpt" --preset "$preset" --mode zero3 --intra-shard 2 --batch "$batch" --steps "$steps" \
        --eval-every "$every" $pa $extra >"$log" 2>&1 ||
        echo "semi_sync_bench: $c at $rate failed: $(tail -2 "$log")" >&2
      tok=$(tokens_per_s "$log")
      per_step=$(awk '/^model: GPT-2/ {for (i = 1; i <= NF; ++i) if ($i == "context") {gsub(",", "", $(i+1)); print $(i+1)}}' "$log" | head -1)
      tps=$((batch * ${per_step:-0}))
      read -r ptok bpt <<<"$(period_stats "$log" "$(period_of "$pa")" "$tps")"
      bytes=$(bytes_across "$log")
      n=$(awk '$1 ~ /^[0-9]+\/[0-9]+$/ {split($1, a, "/"); n = a[1]} END {print n + 0}' "$log")
      if [ "$run" -eq 1 ]; then
        awk -v c="$c" -v r="$rate" -v b="$batch" -v ctx="${per_step:-0}" \
          '/val loss [0-9.eE+-]+ after step/ {for (i = 1; i <= NF; ++i) if ($i == "step") s = $(i+1);
             print c "," r "," s "," s * b * ctx "," $3}' "$log" >>"$out/runs.csv"
      fi
      val=$(grep -aoE 'val loss [0-9.eE+-]+' "$log" | tail -1 | awk '{print $3}')
      echo "$c,$rate,$run,$n,$((n * tps)),$tok,$ptok,$bytes,$bpt,${val:-n/a}" >>"$out/summary.csv"
      printf "%-18s %-8s %12s %10s %14s %12s\n" "$c" "$rate" "$tok" "${val:-n/a}" "$ptok" "$bpt"
    done
  done
done

plot
echo "semi_sync_bench: $out/runs.csv, $out/summary.csv, $out/loss_vs_tokens.svg"
