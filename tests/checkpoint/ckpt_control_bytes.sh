#!/usr/bin/env bash
# Control bytes from files never reach a terminal (issue 41): every control byte, DEL, an OSC
# title, a clear-screen and colour codes planted in each string field of a manifest (one copy
# per field) and of a safetensors header; hsdp-ckpt inspect (text and --json), verify, export,
# diff, train_mlp --resume/--init-from and, where the package is built, the Python reprs and
# errors: stdout and stderr hold no byte below 0x20 but newline, and no 0x7f.
#   ckpt_control_bytes.sh BUILD_DIR WORK_DIR SCRIPT_DIR
set -euo pipefail
build=$1; work=$2; here=$3
# shellcheck source=hostile_common.sh
source "$here/hostile_common.sh"
py="$build/pyenv/bin/python"
"$py" -c "import hsdp" 2>/dev/null || py=""
out="$work/out"
mkdir -p "$out"
n=0
run() {  # every output of the command into its own file (the exit status does not matter)
  n=$((n + 1))
  "$@" >"$out/$n.stdout" 2>"$out/$n.stderr" </dev/null || true
}
# The Python reprs and errors of every planted copy, in one process after the loop (one import
# of hsdp for all of them, not one each): a line naming each copy, then its output; an
# unexpected exception prints its traceback (on stderr, as a process of its own would) and the
# next copy goes on. Every copy must have been reached.
pyrun() {
  [ -n "$py" ] || return 0
  run "$py" -c "
import sys, traceback, hsdp
for c in sys.argv[2:]:
    print('copy', c, flush=True)
    try:
        ck = hsdp.checkpoint.open(c)
        print(ck)
        print(list(ck.parameters.values()))
        print(hsdp.checkpoint.diff(c, sys.argv[1]).tensors)
    except hsdp.Error as e:
        print('error:', e)
    except Exception:
        traceback.print_exc()
" "$good" "$@"
  local reached
  reached=$(grep -c "^copy $work/c\." "$out/$n.stdout" || true)
  [ "$reached" = $# ] || { echo "FAIL: the Python run reached $reached of $# copies"; exit 1; }
}
fields=$(python3 "$hj" plant "$good" - list)
copies=()
for field in $fields; do
  c="$work/c.${#copies[@]}"
  copies+=("$c")
  python3 "$hj" plant "$good" "$c" "$field"
  run "$ckpt" inspect "$c"
  run "$ckpt" inspect --json "$c"
  run "$ckpt" verify "$c"
  run "$ckpt" export "$c" "$work/x.safetensors"
  run "$ckpt" diff "$c" "$good"
  run "$ckpt" diff "$good" "$c"
  run "$ckpt" reshard "$c" "$work/r" --world 2 --ranks-per-node 2 --intra-shard 2 --inter-shard 1
  run "$mlp" --mode none "${dims[@]}" --steps 2 --resume "$c"
  rm -rf "$work/x.safetensors" "$work/r"
done
pyrun "${copies[@]}"
rm -rf "${copies[@]}"
for field in name metadata dtype; do
  python3 "$hj" plant-safetensors "$work/p.safetensors" "$field"
  run "$mlp" --mode none "${dims[@]}" --steps 0 --init-from "$work/p.safetensors"
done
echo "$(echo $fields | wc -w) manifest fields, 3 safetensors fields, $n runs"
grep -l "pwned\|red" "$out"/* >/dev/null || { echo "FAIL: no run echoed the planted text at all"; exit 1; }
python3 "$hj" clean "$out"/* && echo "ok: no raw control byte or DEL in any output"
