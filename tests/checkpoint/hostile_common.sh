# Sourced by ckpt_deep_json.sh and ckpt_control_bytes.sh (issue 41): with build, work and here
# set, a fresh $work (removed on exit), the programs, and a small one-rank checkpoint $good
# saved by train_mlp started without mpirun (an MPI singleton).
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
mlp="$build/examples/train_mlp"
ckpt="$build/tools/hsdp-ckpt"
hj="$here/hostile_json.py"
dims=(--dims 8,16,4 --batch 4)
"$mlp" --mode none "${dims[@]}" --steps 1 --save-dir "$work/good" >/dev/null
good="$work/good/step-00000001"
