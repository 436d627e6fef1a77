#!/usr/bin/env bash
# Export and import of full weights: train_mlp --export (the model's gather) and hsdp-ckpt export
# of the saved checkpoint are the same bytes; Python's `safetensors` reads the exports (fp32,
# bf16, HF-style shards) and they equal the checkpoint read by numpy from the spec; --init-from
# of an export, saved again, exports to the same bytes.
#   ckpt_export.sh BUILD_DIR WORK_DIR VENV_DIR SCRIPT_DIR
set -euo pipefail
build=$1; work=$2; venv=$3; here=$4
if ! [ -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import safetensors, numpy" 2>/dev/null; then
  echo "ckpt_export: SKIP: no Python with safetensors (PyPI unreachable when the environment was made)"
  exit 77
fi
mpirun=${MPIEXEC:-mpirun}
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
train() { local np=$1 rpn=$2; shift 2
  "$mpirun" --oversubscribe --bind-to none -np "$np" -x HSDP_RANKS_PER_NODE="$rpn" "$build/examples/train_mlp" "$@"; }
ckpt="$build/tools/hsdp-ckpt"
train 8 4 --mode zero3 --intra-shard 4 --inter-shard 2 --steps 3 --save-dir "$work/run" \
  --export "$work/model.safetensors" >/dev/null
"$ckpt" export "$work/run" "$work/offline.safetensors"
cmp "$work/model.safetensors" "$work/offline.safetensors"
echo "ok: the model's export and the checkpoint's are the same bytes"
"$ckpt" export "$work/run/latest" "$work/b16.safetensors" --dtype bf16
"$ckpt" export "$work/run" "$work/sharded.safetensors" --max-shard-size 600000
"$venv/bin/python" "$here/export_check.py" "$work/run/step-00000003" "$work/model.safetensors" \
  "$work/b16.safetensors" "$work/sharded.safetensors.index.json"
# Round trip through --init-from, on another mesh, loading the sharded index.
train 6 3 --mode zero2 --intra-shard 3 --inter-shard 1 --steps 0 \
  --init-from "$work/sharded.safetensors" --save-dir "$work/again" | grep "initialised from"
"$ckpt" export "$work/again" "$work/again.safetensors"
cmp "$work/model.safetensors" "$work/again.safetensors"
echo "ok: --init-from of an export, saved and exported again, gives the same bytes"
