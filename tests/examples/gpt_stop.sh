#!/usr/bin/env bash
# Preemption (ctest gpt_stop.sigterm): train_gpt tiny on 3 ranks with --save-dir; once step 3 is
# printed, SIGTERM goes to ONE rank. Every rank must stop after the same step K (3 <= K < N),
# save it, and the job exit 143 (128 + SIGTERM) with exactly one line
#   train_gpt: stopped by SIGTERM after step K; checkpoint step-0000000K in DIR
# and a checkpoint whose checksums hold (hsdp-ckpt verify). `--resume latest` then trains on to
# N; its weights (--export) must equal, bit for bit, those of a run of N steps never stopped, and
# its last step's printed loss the straight run's.
#   gpt_stop.sh MPIRUN TRAIN_GPT HSDP_CKPT [MPIRUN FLAGS...]
set -uo pipefail
mpirun=$1 train=$2 ckpt_tool=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/hsdp-gpt-stop.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "gpt_stop: FAIL: $*"; exit 1; }
N=150
common=(--preset tiny --steps $N --batch 6 --eval-batches 0)

# The truth: N steps straight through.
"$mpirun" "$@" -np 3 "$train" "${common[@]}" --export "$work/straight.safetensors" \
  >"$work/straight.log" 2>&1 || { cat "$work/straight.log"; fail "the straight run failed"; }

# Stopped: SIGTERM to one rank (the last child of mpirun) once step 3 is printed.
"$mpirun" "$@" -np 3 "$train" "${common[@]}" --save-dir "$work/ckpt" >"$work/a.log" 2>&1 &
mpid=$!
for _ in $(seq 600); do
  grep -qE "^ *3/$N " "$work/a.log" && break
  kill -0 $mpid 2>/dev/null || break
  sleep 0.1
done
grep -qE "^ *3/$N " "$work/a.log" || { kill $mpid; cat "$work/a.log"; fail "step 3 never printed"; }
victim=$(pgrep -P $mpid | tail -1)
[ -n "$victim" ] || fail "no rank process under mpirun $mpid"
kill -TERM "$victim"
for _ in $(seq 1200); do kill -0 $mpid 2>/dev/null || break; sleep 0.1; done
kill -0 $mpid 2>/dev/null && { kill -KILL $mpid; cat "$work/a.log"; fail "no exit 120 s after SIGTERM (hang)"; }
wait $mpid
rc=$?
[ $rc = 143 ] || { cat "$work/a.log"; fail "exit code $rc, expected 143 (128 + SIGTERM)"; }
lines=$(grep -c "^train_gpt: stopped by" "$work/a.log")
[ "$lines" = 1 ] || { cat "$work/a.log"; fail "$lines 'stopped by' lines, expected 1"; }
line=$(grep "^train_gpt: stopped by" "$work/a.log")
echo "gpt_stop: $line"
k=$(echo "$line" | sed -nE "s|^train_gpt: stopped by SIGTERM after step ([0-9]+); checkpoint step-0*([0-9]+) in $work/ckpt\$|\1 \2|p")
[ -n "$k" ] || fail "the line does not read 'stopped by SIGTERM after step K; checkpoint step-K in $work/ckpt'"
K=${k% *}
[ "$K" = "${k#* }" ] || fail "the step ($K) and the checkpoint (step-${k#* }) differ"
{ [ "$K" -ge 3 ] && [ "$K" -lt $N ]; } || fail "stopped after step $K, expected 3..$((N - 1))"
grep -qE "^ *$((K + 1))/$N " "$work/a.log" && fail "a step after $K was printed"
dir=$(printf "%s/ckpt/step-%08d" "$work" "$K")
"$ckpt_tool" verify "$dir" || fail "hsdp-ckpt verify $dir"

# Resumed to N: the same weights as the straight run.
"$mpirun" "$@" -np 3 "$train" "${common[@]}" --save-dir "$work/ckpt" --resume latest \
  --export "$work/resumed.safetensors" >"$work/b.log" 2>&1 ||
  { cat "$work/b.log"; fail "the resumed run failed"; }
grep -q "resumed from .*step-0*$K at step $K" "$work/b.log" || { cat "$work/b.log"; fail "did not resume at step $K"; }
last_s=$(grep -E "^ *$N/$N " "$work/straight.log" | awk '{print $3}')
last_b=$(grep -E "^ *$N/$N " "$work/b.log" | awk '{print $3}')
[ -n "$last_s" ] && [ "$last_s" = "$last_b" ] || fail "step $N loss: straight '$last_s', resumed '$last_b'"
cmp -s "$work/straight.safetensors" "$work/resumed.safetensors" ||
  fail "the resumed run's weights differ from the straight run's"
echo "gpt_stop: stopped after step $K, resumed to $N: step $N loss $last_b and weights equal the straight run's"
echo "gpt_stop: PASS"
