#!/usr/bin/env bash
# Issue 45's step targets (docs/overlap.md), on the emulated cluster (tests/cluster/cluster.sh:
# network namespaces joined by a rate-limited bridge), train_gpt --preset small (10.8 M
# parameters, fp32, batch 8 x 128 on 8 ranks, one compute thread per rank):
#  (a) the step of HSDP (intra 4 x inter 1: a shard group per node, 2 replicas) and of full shard
#      (4 x 2: one shard group of 8) on 2 nodes x 4 ranks against the compute alone of the same
#      8 processes (gpt_bench --part alone: the same forward + backward on local full parameters,
#      no engine, the slowest rank); target <= 1.15x;
#  (b) the same two steps with a CPU hog of --hog threads (busy loops) started beside the job:
#      hsdp's slowdown against PyTorch FSDP2's under the same hog (bench/torch_bench.py --impl
#      fsdp2, when torch, transformers and hsdp.torch are installed in the python of HSDP_PYTHON or
#      build/pyenv); target: no worse;
#  (c) weak scaling: 1, 2 and 4 nodes x 2 ranks, one sequence per rank (the same work per rank),
#      HSDP intra 2 x inter 1: step / compute alone of the same processes per size; target: the
#      1-node ratio over the N-node ratio >= 0.9; and every hsdp run's bytes per level and step
#      (the transports' counters, the "bytes:" lines) equal to the planner's closed form (the
#      program's "hsdp-plan bytes per step" line) to the byte.
# Rounds are interleaved (every case once per round, the order rotated round by round: the
# machine is shared, a slow spell hits every case of a round); per run the median step after
# the warm-up steps, then the median over rounds. Needs root (namespaces) and a built tree.
#   bench/step_bench.sh [--rounds R] [--steps N] [--warmup W] [--rate RATE] [--hog T] [--quick]
# --quick: 1 round of 3 steps (1 warm-up), a smoke run of every case; its numbers are not
# medians of rounds and do not meet anything.
set -euo pipefail
root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${HSDP_BUILD_DIR:-$root/build}
rounds=3 steps=8 warmup=2 rate=1gbit hog=2 quick=0
bench_name=step_bench
source "$root/bench/bench_args.sh"
while (($#)); do
  case $1 in
    --rounds) posint --rounds "${2-}" 1; rounds=$2; shift 2 ;;
    --steps) posint --steps "${2-}" 1; steps=$2; shift 2 ;;
    --warmup) posint --warmup "${2-}" 0; warmup=$2; shift 2 ;;
    --rate) [ -n "${2-}" ] || die "--rate needs a value (e.g. 1gbit)"; rate=$2; shift 2 ;;
    --hog) posint --hog "${2-}" 1; hog=$2; shift 2 ;;
    --quick) quick=1; rounds=1 steps=3 warmup=1; shift ;;
    *) die "unknown argument '$1' (--rounds --steps --warmup --rate --hog --quick)" ;;
  esac
done
for b in examples/train_gpt bench/gpt_bench; do
  [ -x "$build/$b" ] || die "no $build/$b: build it (ninja -C build train_gpt gpt_bench)"
done
py=${HSDP_PYTHON:-$build/pyenv/bin/python}
torch=0
[ -x "$py" ] && "$py" -c "import torch, transformers, hsdp.torch" 2>/dev/null && torch=1
tmp=$(mktemp -d /tmp/hsdp-step-bench.XXXXXX)
hog_pids=()
stop_hog() {
  local p
  for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${hog_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  hog_pids=()
}
trap 'stop_hog; rm -rf "$tmp"' EXIT
start_hog() {
  local i
  for ((i = 0; i < hog; i++)); do
    (while :; do :; done) &
    hog_pids+=($!)
  done
}

# median of the arguments
med() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1;
  printf "%.1f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# run_case NAME -> the case's milliseconds on stdout. NAME: KIND.NODES.RANKS_PER_NODE.LAYOUT[.hog],
# KIND one of hsdp (train_gpt), alone (gpt_bench --part alone), fsdp2 (torch_bench.py); LAYOUT
# intra x inter.
run_case() {
  local name=$1 kind nodes rpn layout extra cmd=()
  IFS=. read -r kind nodes rpn layout extra <<<"$name"
  local ranks=$((nodes * rpn)) intra=${layout%x*} inter=${layout#*x}
  case $kind in
    hsdp) cmd=("$build/examples/train_gpt" --preset small --batch "$ranks"
               --steps $((warmup + steps)) --intra-shard "$intra" --inter-shard "$inter"
               --eval-every 0 --sample 0 --lr 3e-4) ;;
    alone) cmd=("$build/bench/gpt_bench" --part alone --batch 1 --repeats "$steps") ;;
    fsdp2) cmd=("$py" "$root/bench/torch_bench.py" --impl fsdp2 --steps "$steps"
                --warmup "$warmup" --layout "$layout") ;;
  esac
  local log=$tmp/$name.log
  [ "$extra" = hog ] && start_hog
  local rc=0
  "$root/tests/cluster/cluster.sh" --nodes "$nodes" --ranks-per-node "$rpn" --rate "$rate" \
    --timeout 1200 -- "${cmd[@]}" >"$log" 2>&1 || rc=$?
  stop_hog
  if ((rc != 0)); then
    echo "step_bench: $name failed (exit $rc); its last lines:" >&2
    tail -5 "$log" >&2
    return 1
  fi
  if [ "$kind" = hsdp ]; then
    # Every step's "bytes:" line (the transports' counters, all ranks) against the program's
    # "hsdp-plan bytes per step" line (the planner's closed form for this mesh and model).
    awk '/^  bytes: intra / { c[n++] = $3 " " $5 " " $7 }
         /^hsdp-plan bytes per step: / { p = $6 " " $8 " " $10 }
         END { bad = 0; for (i = 0; i < n; i++) if (c[i] != p) bad++
               printf "%s %d %d %s\n", (n > 0 && p != "" && bad == 0) ? "equal" : "differs", n, bad,
                      p == "" ? "none" : p }' "$log" >"$tmp/$name.bytes"
  fi
  case $kind in
    hsdp) awk -v w="$warmup" '$1 ~ /^[0-9]+\/[0-9]+$/ { split($1, s, "/"); if (s[1] > w) t[n++] = $5 }
        END { if (n == 0) exit 1; for (i = 0; i < n; i++) for (j = i + 1; j < n; j++)
              if (t[j] < t[i]) { x = t[i]; t[i] = t[j]; t[j] = x }
              printf "%.1f\n", (n % 2) ? t[int(n / 2)] : (t[n / 2 - 1] + t[n / 2]) / 2 }' "$log" ;;
    alone) sed -n 's/^result compute_alone_ms=\([0-9.]*\).*/\1/p' "$log" ;;
    fsdp2) sed -n 's/^result .*step_s=\([0-9.]*\).*/\1/p' "$log" | awk '{ printf "%.1f\n", $1 * 1000 }' ;;
  esac
}

cases=(hsdp.2.4.4x1 hsdp.2.4.4x2 alone.2.4.- hsdp.2.4.4x1.hog hsdp.2.4.4x2.hog
       hsdp.1.2.2x1 alone.1.2.- hsdp.2.2.2x1 alone.2.2.- hsdp.4.2.2x1 alone.4.2.-)
((torch)) && cases+=(fsdp2.2.4.4x1 fsdp2.2.4.4x2 fsdp2.2.4.4x1.hog fsdp2.2.4.4x2.hog)
declare -A got
n=${#cases[@]}
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < n; i++)); do
    c=${cases[$(((i + r) % n))]}
    v=$(run_case "$c") || exit 1
    [ -n "$v" ] || die "$c printed no step time (log: kept in $tmp? no: rerun it by hand)"
    echo "round $((r + 1)) $c ${v} ms (load $(cut -d' ' -f1 /proc/loadavg))"
    got[$c]="${got[$c]-} $v"
  done
done

# shellcheck disable=SC2086  # the rounds, one word each
m() { med ${got[$1]}; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
met() { awk -v v="$1" -v t="$2" -v op="$3" -v q="$quick" 'BEGIN {
  if (q) { print "smoke"; exit } ok = (op == "<=") ? v <= t : v >= t; print ok ? "yes" : "no" }'; }
echo
echo "# step_bench: train_gpt small, rate $rate, medians of $rounds round(s) x $steps steps" \
  "(warm-up $warmup), hog $hog threads, load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-52s %10s %10s %6s\n' "what" target measured met
row() { printf '%-52s %10s %10s %6s\n' "$1" "$2" "$3" "$(met "$3" "${2#* }" "${2%% *}")"; }
alone2=$(m alone.2.4.-)
for l in 4x1 4x2; do
  s=$(m hsdp.2.4.$l)
  echo "  2x4 $l: step $s ms, compute alone $alone2 ms"
  row "(a) $l step / compute alone" "<= 1.15" "$(ratio "$s" "$alone2")"
done
for l in 4x1 4x2; do
  sh=$(ratio "$(m hsdp.2.4.$l.hog)" "$(m hsdp.2.4.$l)")
  if ((torch)); then
    sf=$(ratio "$(m fsdp2.2.4.$l.hog)" "$(m fsdp2.2.4.$l)")
    echo "  $l under the hog: hsdp $(m hsdp.2.4.$l) -> $(m hsdp.2.4.$l.hog) ms (x$sh), fsdp2" \
      "$(m fsdp2.2.4.$l) -> $(m fsdp2.2.4.$l.hog) ms (x$sf)"
    row "(b) $l hsdp slowdown under the hog (fsdp2's)" "<= $sf" "$sh"
  else
    echo "  $l under the hog: hsdp x$sh; no torch in $py: FSDP2 not run"
    printf '%-52s %10s %10s %6s\n' "(b) $l hsdp slowdown under the hog" "fsdp2 n/a" "$sh" "n/a"
  fi
done
r1=$(ratio "$(m hsdp.1.2.2x1)" "$(m alone.1.2.-)")
for nn in 1 2 4; do
  s=$(m hsdp.$nn.2.2x1) a=$(m alone.$nn.2.-)
  echo "  weak scaling $nn node(s) x 2 ranks: step $s ms, compute alone $a ms, ratio $(ratio "$s" "$a")"
  [ "$nn" = 1 ] || row "(c) ratio(1 node) / ratio($nn nodes)" ">= 0.9" "$(ratio "$r1" "$(ratio "$s" "$a")")"
done
bytes_all=equal
for f in "$tmp"/hsdp.*.bytes; do
  read -r verdict steps_n bad plan <"$f" || verdict=differs
  c=$(basename "$f" .bytes)
  echo "  bytes per step of $c: $verdict to hsdp-plan's (intra inter replica $plan; $bad of $steps_n steps differ, last round)"
  [ "$verdict" = equal ] || bytes_all=differs
done
printf '%-52s %10s %10s %6s\n' "(c) bytes per level = hsdp-plan's (every step)" "equal" "$bytes_all" \
  "$( ((quick)) && echo smoke || { [ "$bytes_all" = equal ] && echo yes || echo no; })"
