# Sourced by the checkpoint scripts (ckpt_bad_input.sh, ckpt_files.sh, ckpt_stop.sh and, through
# hostile_common.sh, ckpt_deep_json.sh and ckpt_control_bytes.sh): with build and work set, a
# fresh $work (removed on exit), $mpirun (MPIEXEC, else mpirun from PATH) and the programs:
# train_mlp ($mlp) and hsdp-ckpt ($ckpt).
mpirun=${MPIEXEC:-mpirun}
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
mlp="$build/examples/train_mlp"
ckpt="$build/tools/hsdp-ckpt"
