# Sourced by the checkpoint scripts (ckpt_bad_input.sh, ckpt_files.sh, ckpt_stop.sh and, through
# hostile_common.sh, ckpt_deep_json.sh and ckpt_control_bytes.sh): with build and work set, a
# fresh $work (removed on exit), $mpirun (MPIEXEC, else mpirun from PATH) and the programs:
# train_mlp ($mlp) and hsdp-ckpt ($ckpt); same_files DIR_A DIR_B (ckpt_mlp.sh, ckpt_semi_sync.sh).
mpirun=${MPIEXEC:-mpirun}
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
mlp="$build/examples/train_mlp"
ckpt="$build/tools/hsdp-ckpt"
same_files() {  # DIR_A DIR_B: every data file byte-identical
  local n=0
  for f in "$1"/data-*.bin; do
    cmp "$f" "$2/$(basename "$f")" || { echo "FAIL: $(basename "$f") differs"; exit 1; }
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "FAIL: no data files in $1"; exit 1; }
  echo "ok: $n data files identical ($1 vs $2)"
}
