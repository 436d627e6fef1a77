#!/usr/bin/env bash
# train_gpt across a checkpoint (ctest gpt_parity.resume.8x2x4-to-4x2x2): 8 ranks (zero3, 2 x 4
# virtual nodes, I2 J2) train 4 steps saving at steps 2 and 4; a new job of 4 ranks in mode zero2
# resumes step 2 and trains on to 4. Both must pass --check against the single-process reference
# trained straight through, the resumed one about as close as the straight one (within 2x: the
# other mesh sums the gradients in another order, so the fp32 roundings differ; the bitwise
# resume on the same mesh is checkpoint.resume_jobs), and the resumed job's --export must name
# GPT-2's tensors (wte.weight, h.0.attn.c_attn.weight, ...).
#   gpt_resume.sh MPIRUN TRAIN_GPT [MPIRUN FLAGS...]
set -euo pipefail
mpirun=$1 train=$2
shift 2
work=$(mktemp -d "${TMPDIR:-/tmp}/hsdp-gpt-resume.XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--preset tiny --steps 4 --batch 8 --eval-batches 0 --check)
"$mpirun" "$@" -np 8 -x HSDP_RANKS_PER_NODE=4 "$train" "${common[@]}" --mode zero3 \
  --intra-shard 2 --inter-shard 2 --save-dir "$work/ckpt" --save-every 2 >"$work/a.log" 2>&1 ||
  { cat "$work/a.log"; echo "gpt_resume: FAIL: the first job failed"; exit 1; }
"$mpirun" "$@" -np 4 -x HSDP_RANKS_PER_NODE=2 "$train" "${common[@]}" --mode zero2 \
  --intra-shard 2 --inter-shard 1 --resume "$work/ckpt/step-00000002" \
  --export "$work/gpt.safetensors" >"$work/b.log" 2>&1 ||
  { cat "$work/b.log"; echo "gpt_resume: FAIL: the resumed job failed"; exit 1; }
a=$(grep -o 'max_rel_err=[^ ]* PASS' "$work/a.log" | cut -d= -f2 | cut -d' ' -f1)
b=$(grep -o 'max_rel_err=[^ ]* PASS' "$work/b.log" | cut -d= -f2 | cut -d' ' -f1)
[ -n "$a" ] && [ -n "$b" ] || { cat "$work/a.log" "$work/b.log"; echo "gpt_resume: FAIL: no PASS"; exit 1; }
grep -q "resumed from .*step-00000002 at step 2" "$work/b.log" || { cat "$work/b.log"; exit 1; }
echo "gpt_resume: straight max_rel_err=$a, resumed on another mesh max_rel_err=$b"
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if b <= 2 * a + 1e-6 else 1)" "$a" "$b" ||
  { echo "gpt_resume: FAIL: the resumed run ends elsewhere"; exit 1; }
# The export's header (safetensors: 8-byte little-endian length, then JSON): GPT-2's names.
python3 - "$work/gpt.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    names = set(json.loads(f.read(n))) - {"__metadata__"}
want = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "h.0.ln_1.weight",
        "h.0.attn.c_attn.weight", "h.0.attn.c_proj.bias", "h.3.mlp.c_fc.weight",
        "h.3.mlp.c_proj.weight"}
missing = want - names
if missing:
    sys.exit("gpt_resume: FAIL: the export lacks " + ", ".join(sorted(missing)))
print("gpt_resume: export has %d GPT-2-named tensors" % len(names))
PY
echo "gpt_resume: PASS"
