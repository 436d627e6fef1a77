#!/usr/bin/env bash
# Checkpoints of semi-synchronous replicas (docs/checkpoint.md, "Semi-synchronous replicas";
# labels semi_sync, checkpoint): train_mlp straight 8 steps (H = 3: syncs after steps 3 and 6)
# against K steps, a save, and a new job resuming to 8. Every data file of the two step-8
# checkpoints is byte-identical (every replica's parameters and Adam moments, the outer anchor
# and momentum, the step), and the resumed run's --check holds against mlp::trainReplicaReference
# (every rank against its own replica's reference). Saves mid-period (K = 2, 4, 5) and at sync
# points (K = 3, 6); diloco and local_sgd; 2 and 3 replicas; zero3 + CPU offload; fragments;
# mode none; an async save; train_gpt with each policy. Then hsdp-ckpt on it (verify, inspect, diff read it; reshard and
# export refuse it by name), and resuming under another policy, H, F, outer lr or replica count,
# or a semi-synchronous job resuming a sync checkpoint: refused naming the value on every rank.
#   ckpt_semi_sync.sh BUILD_DIR WORK_DIR EXPECT_ERROR_SH
set -eEuo pipefail
build=$1; work=$2; expect_error=$3
# shellcheck source=ckpt_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_common.sh"
trap 'echo "FAIL (line $LINENO); the last job printed:"; cat "$work/last.log"' ERR
common=(--dims 16,48,24,16,10 --lr 1e-2)
train() {  # NP RPN ARGS...
  local np=$1 rpn=$2; shift 2
  echo "+ train_mlp -np $np $*" >"$work/last.log"
  "$mpirun" --oversubscribe --bind-to none -np "$np" -x HSDP_RANKS_PER_NODE="$rpn" "$mlp" \
    "${common[@]}" "$@" >>"$work/last.log" 2>&1
  cat "$work/last.log"
}
expect() {  # PATTERN TEXT
  echo "$2" | grep -q -- "$1" || { echo "$2"; echo "FAIL: expected '$1'"; exit 1; }
}
resume_case() {  # NAME NP RPN K SAVE_FLAG ARGS...: straight 8 vs K + resume to 8
  local name=$1 np=$2 rpn=$3 k=$4 save=$5; shift 5
  local d="$work/$name" out
  train "$np" "$rpn" "$@" --steps 8 --save-dir "$d/straight" >/dev/null
  # shellcheck disable=SC2086
  out=$(train "$np" "$rpn" "$@" --steps "$k" --save-dir "$d/first" $save)
  expect "checkpoint step-$(printf %08d "$k"): .* MiB in" "$out"
  # shellcheck disable=SC2086
  out=$(train "$np" "$rpn" "$@" --steps 8 --resume latest --save-dir "$d/first" $save --check)
  expect "resumed from $d/first/step-$(printf %08d "$k") at step $k" "$out"
  expect "parity vs eigen reference: .* PASS" "$out"
  echo -n "$name (saved at step $k): "
  same_files "$d/straight/step-00000008" "$d/first/step-00000008"
}
z3=(--mode zero3 --intra-shard 2)
resume_case diloco.2rep.mid 4 2 4 "" "${z3[@]}" --replica-policy diloco --sync-every 3
resume_case diloco.2rep.sync_point.async 4 2 3 --async-save "${z3[@]}" --replica-policy diloco \
  --sync-every 3
resume_case local_sgd.3rep.mid 6 2 4 "" --mode zero2 --intra-shard 2 --replica-policy local_sgd \
  --sync-every 3
resume_case local_sgd.2rep.sync_point 4 2 6 "" "${z3[@]}" --replica-policy local_sgd --sync-every 3
resume_case diloco.3rep.offload.mid 6 2 5 "" "${z3[@]}" --offload cpu --replica-policy diloco \
  --sync-every 3
resume_case diloco.2rep.f2.mid 4 2 4 "" "${z3[@]}" --replica-policy diloco --sync-every 3 \
  --fragments 2
resume_case diloco.3rep.none.mid 3 1 2 "" --mode none --replica-policy diloco --sync-every 3
# train_gpt (tiny; its lr schedule follows --steps, so both runs give --steps 8): 8 steps saving
# at 4 (mid-period) and 8, against a new job resuming the step-4 checkpoint to 8.
for policy in diloco local_sgd; do
  d="$work/gpt.$policy"
  gpt=("$mpirun" --oversubscribe --bind-to none -np 4 -x HSDP_RANKS_PER_NODE=2
       "$build/examples/train_gpt" --preset tiny --batch 8 --eval-batches 0 --mode zero3
       --intra-shard 2 --replica-policy "$policy" --sync-every 3 --steps 8)
  "${gpt[@]}" --save-dir "$d/straight" --save-every 4 --keep 0 >"$work/last.log" 2>&1
  "${gpt[@]}" --resume "$d/straight/step-00000004" --save-dir "$d/resumed" >"$work/last.log" 2>&1
  echo -n "train_gpt $policy (saved at step 4): "
  same_files "$d/straight/step-00000008" "$d/resumed/step-00000008"
done

# The offline tool on a diloco checkpoint saved mid-period (2 replicas x 2 shards).
ck="$work/diloco.2rep.mid/first/step-00000004"
"$ckpt" verify "$ck"
out=$("$ckpt" inspect "$ck")
expect "format version 2, step 4" "$out"
expect "replica policy diloco: 2 replicas of 4 units, sync every 3 steps (step 1 of the period)" "$out"
expect "replica1/fc3.bias .* param, exp_avg, exp_avg_sq" "$out"
expect "outer_momentum/fc0.weight .* param" "$out"
expect '"step_in_period": 1' "$("$ckpt" inspect "$ck" --json)"
"$ckpt" diff "$work/diloco.2rep.mid/straight/step-00000008" \
  "$work/diloco.2rep.mid/first/step-00000008" >/dev/null
for verb in reshard export; do
  rc=0
  if [ $verb = reshard ]; then
    out=$("$ckpt" reshard "$ck" "$work/out" --world 2 --ranks-per-node 2 --intra-shard 2 \
      --inter-shard 1 --mode zero3 2>&1) || rc=$?
  else
    out=$("$ckpt" export "$ck" "$work/out.safetensors" 2>&1) || rc=$?
  fi
  [ $rc -eq 2 ] || { echo "$out"; echo "FAIL: $verb exit $rc, expected 2"; exit 1; }
  expect "$verb: checkpoint '.*' was saved with replica policy diloco (2 replicas" "$out"
  [ ! -e "$work/out" ] && [ ! -e "$work/out.safetensors" ] || { echo "FAIL: $verb wrote"; exit 1; }
  echo "ok: hsdp-ckpt $verb refuses it by name"
done

# Resuming under other settings: the value named on every rank, exit non-zero, no hang.
train 4 2 "${z3[@]}" --steps 2 --save-dir "$work/sync" >/dev/null
fails=0
bad() {  # NAME CHECKPOINT WANT ARGS...
  local name=$1 from=$2 want=$3; shift 3
  if "$expect_error" 4 2 "$want" --bind-to none "$mlp" "${common[@]}" --mode zero3 --steps 8 \
    --resume "$from" "$@" >"$work/$name.log" 2>&1; then
    echo "ok: $name: every rank reported '$want'"
  else
    cat "$work/$name.log"; echo "FAIL: $name"; fails=$((fails + 1))
  fi
}
dl=(--intra-shard 2 --replica-policy diloco --sync-every 3)
bad other_h "$ck" "sync_every (H) 3 (this model's: 2)" --intra-shard 2 --replica-policy diloco \
  --sync-every 2
bad other_policy "$ck" "replica policy diloco (this model's: local_sgd)" --intra-shard 2 \
  --replica-policy local_sgd --sync-every 3
bad sync_model "$ck" "replica policy diloco (this model's: sync; 2 replicas' own states)" \
  --intra-shard 2
bad other_fragments "$ck" "fragments 1 (this model's: 2)" "${dl[@]}" --fragments 2
bad other_outer_lr "$ck" "outer lr 0.7 (this model's: 0.5)" "${dl[@]}" --outer-lr 0.5
bad other_replicas "$ck" "2 replicas (this model's: 4)" --intra-shard 1 --replica-policy diloco \
  --sync-every 3
bad sync_checkpoint "$work/sync" "replica policy sync (this model's: diloco" "${dl[@]}"
[ $fails -eq 0 ] || { echo "FAIL: $fails bad-input cases"; exit 1; }
echo "PASS"
