#!/usr/bin/env bash
# train_mlp across jobs: a checkpoint saved by one job, loaded by a new one.
#   ckpt_mlp.sh resume  BUILD_DIR WORK_DIR   straight 8 steps vs 4, save, new job, resume to 8
#                                            (sync and async): the data files are identical
#                                            (parameters, moments, step), and --check holds
#   ckpt_mlp.sh reshard BUILD_DIR WORK_DIR   saved on 8 = 2x4 zero3 I4 J2, resumed on 6 = 2x3
#                                            zero2, 3 = 3x1 zero3, 1 rank none, each --check
#                                            against the Eigen reference trained straight; the
#                                            same through hsdp-ckpt reshard; a direct load on 6
#                                            saved again equals the offline reshard
set -eEuo pipefail
what=$1; build=$2; work=$3
# shellcheck source=ckpt_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_common.sh"
# A failing command shows what the last job printed.
trap 'echo "FAIL (line $LINENO); the last job printed:"; cat "$work/last.log"' ERR
train() {  # NP RPN ARGS...
  local np=$1 rpn=$2; shift 2
  echo "+ train_mlp -np $np $*" >"$work/last.log"
  "$mpirun" --oversubscribe --bind-to none -np "$np" -x HSDP_RANKS_PER_NODE="$rpn" \
    "$build/examples/train_mlp" "$@" 2>&1 | tee -a "$work/last.log"
}
expect() {  # PATTERN TEXT
  echo "$2" | grep -q -- "$1" || { echo "$2"; echo "FAIL: expected '$1'"; exit 1; }
}

if [ "$what" = resume ]; then
  for cfg in "8 4 --mode zero3 --intra-shard 2 --inter-shard 2 --hpz --accum 2 --clip-norm 0.5" \
             "6 3 --mode zero2 --intra-shard 3 --inter-shard 2 --offload cpu --param-dtype bf16 --tolerance 1e-2"; do
    read -r np rpn rest <<<"$cfg"
    for sync in "" "--async-save"; do
      d="$work/$np$sync"
      # shellcheck disable=SC2086
      train "$np" "$rpn" $rest --steps 8 --save-dir "$d/straight" >/dev/null
      # shellcheck disable=SC2086
      out=$(train "$np" "$rpn" $rest --steps 4 --save-dir "$d/first" --save-every 2 $sync --keep 1)
      expect "checkpoint step-00000004: .* MiB in" "$out"
      [ "$(ls "$d/first")" = "$(printf 'latest\nstep-00000004')" ] || { ls "$d/first"; echo "FAIL: --keep 1"; exit 1; }
      # shellcheck disable=SC2086
      out=$(train "$np" "$rpn" $rest --steps 8 --resume latest --save-dir "$d/first" $sync --check)
      expect "resumed from $d/first/step-00000004 at step 4" "$out"
      expect "parity vs eigen reference: .* PASS" "$out"
      same_files "$d/straight/step-00000008" "$d/first/step-00000008"
    done
  done
  exit 0
fi

# reshard
src="$work/src"
train 8 4 --mode zero3 --intra-shard 4 --inter-shard 2 --steps 4 --save-dir "$src" >/dev/null
"$ckpt" verify "$src"
out=$("$ckpt" inspect "$src")
expect "step 4" "$out"
expect "saved under: mode zero3, 8 ranks = 2 nodes x 4, intra_shard 4 x inter_shard 2 (8 shards x 1 replicas)" "$out"
expect "fc1.weight  *\[333, 1000\]  *333000 param, exp_avg, exp_avg_sq" "$out"
expect "checksums: all ok" "$out"
out=$("$ckpt" inspect "$src" --json)
expect '"checksums_ok": true' "$out"
expect '"world_size": 8' "$out"
for cfg in "6 3 --mode zero2 --intra-shard 3 --inter-shard 2" "3 1 --mode zero3 --intra-shard 1 --inter-shard 3" \
           "1 1 --mode none"; do
  read -r np rpn rest <<<"$cfg"
  # shellcheck disable=SC2086
  out=$(train "$np" "$rpn" $rest --steps 8 --resume "$src" --check)
  expect "resumed from $src/step-00000004 at step 4" "$out"
  expect "parity vs eigen reference: .* PASS" "$out"
  echo "ok: resumed on $np ranks ($rest), parity holds"
done
"$ckpt" reshard "$src" "$work/off6" --world 6 --ranks-per-node 3 --intra-shard 3 --inter-shard 2 --mode zero2
out=$(train 6 3 --mode zero2 --intra-shard 3 --inter-shard 2 --steps 8 --resume "$work/off6" --check)
expect "parity vs eigen reference: .* PASS" "$out"
train 6 3 --mode zero2 --intra-shard 3 --inter-shard 2 --steps 4 --resume "$src" --save-dir "$work/direct6" >/dev/null
"$ckpt" diff "$work/off6" "$work/direct6/latest" | tail -1 | grep -qx identical || { echo "FAIL: diff"; exit 1; }
same_files "$work/off6" "$work/direct6/step-00000004"
"$ckpt" reshard "$src" "$work/off1" --world 1 --ranks-per-node 1 --intra-shard 1 --inter-shard 1 --mode none
"$ckpt" diff "$src" "$work/off1" | tail -1 | grep -qx identical || { echo "FAIL: diff to 1 rank"; exit 1; }
echo "ok: reshard"
