# Sourced by ckpt_deep_json.sh and ckpt_control_bytes.sh (issue 41): with build, work and here
# set, a fresh $work (removed on exit), the programs (ckpt_common.sh), and a small one-rank
# checkpoint $good saved by train_mlp started without mpirun (an MPI singleton).
# shellcheck source=ckpt_common.sh
source "$here/ckpt_common.sh"
hj="$here/hostile_json.py"
dims=(--dims 8,16,4 --batch 4)
"$mlp" --mode none "${dims[@]}" --steps 1 --save-dir "$work/good" >/dev/null
good="$work/good/step-00000001"
