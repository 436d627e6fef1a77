#!/usr/bin/env bash
# train_mlp --resume with optimizer settings other than the checkpoint's (issue 33), 2 ranks:
#  - the default (--optimizer-from checkpoint) prints the difference and trains with the
#    checkpoint's lr; --optimizer-from flags prints it and trains with --lr. The truth for the
#    latter: the same checkpoint with its manifest's lr edited to the flag's value, resumed with
#    the default, ends identical (hsdp-ckpt diff); the checkpoint-lr run ends different.
#  - a manifest lr out of range (-1, 1e39) or beta1 1 is refused on every rank with exit 2,
#    naming the checkpoint, the setting and the value.
#   ckpt_optimizer_from.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1; work=$2
mpirun=${MPIEXEC:-mpirun}
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
ckpt="$build/tools/hsdp-ckpt"
flags=(--mode zero3 --dims 8,24,4 --batch 8)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
train() {  # LOG ARGS...: exit code in $rc
  local log=$1; shift
  rc=0
  "$mpirun" --oversubscribe --bind-to none -np 2 -x HSDP_RANKS_PER_NODE=1 \
    "$build/examples/train_mlp" "${flags[@]}" "$@" >"$work/$log" 2>&1 || rc=$?
}
set_lr() {  # DIR KEY VALUE: the manifest's optimizer.KEY := VALUE
  sed -i "s/^\( *\"$2\": \)[^,]*,/\1$3,/" "$1/manifest.json"
  grep -q "\"$2\": $3," "$1/manifest.json" || { echo "cannot edit $2 in $1"; exit 1; }
}

train a.log --steps 2 --lr 0.001 --save-dir "$work/a"
[ $rc -eq 0 ] || { cat "$work/a.log"; echo "FAIL: the first run"; exit 1; }
a="$work/a/step-00000002"

want="resume: checkpoint lr 0.001 differs from --lr 0.0003; using the checkpoint's (--optimizer-from checkpoint)"
train b.log --steps 3 --lr 0.0003 --resume "$a" --save-dir "$work/b"
if [ $rc -eq 0 ] && grep -qF -- "$want" "$work/b.log"; then echo "ok: default: $want"
else cat "$work/b.log"; fail "default resume (exit $rc)"; fi

want="resume: checkpoint lr 0.001 differs from --lr 0.0003; using --lr (--optimizer-from flags)"
train c.log --steps 3 --lr 0.0003 --resume "$a" --save-dir "$work/c" --optimizer-from flags
if [ $rc -eq 0 ] && grep -qF -- "$want" "$work/c.log"; then echo "ok: flags: $want"
else cat "$work/c.log"; fail "--optimizer-from flags (exit $rc)"; fi

# The truth for --optimizer-from flags: the checkpoint's lr edited to 0.0003 by hand.
cp -r "$a" "$work/edited"
set_lr "$work/edited" lr 0.0003
train d.log --steps 3 --lr 0.0003 --resume "$work/edited" --save-dir "$work/d"
if [ $rc -ne 0 ] || grep -q "^resume: checkpoint" "$work/d.log"; then
  cat "$work/d.log"; fail "resuming the edited checkpoint (exit $rc; no difference expected)"
fi
out=$("$ckpt" diff "$work/c" "$work/d" 2>&1) || true
if echo "$out" | grep -qx identical; then echo "ok: --optimizer-from flags == a checkpoint of lr 0.0003"
else echo "$out"; fail "--optimizer-from flags differs from the edited checkpoint's run"; fi
out=$("$ckpt" diff "$work/b" "$work/c" 2>&1) || true
if echo "$out" | grep -qx different; then echo "ok: the checkpoint's lr trains differently"
else echo "$out"; fail "the default and --optimizer-from flags runs are not different"; fi

bad() {  # NAME KEY VALUE WANT: exit 2, every rank names it
  local name=$1 key=$2 value=$3 want=$4
  cp -r "$a" "$work/$name"
  set_lr "$work/$name" "$key" "$value"
  for from in checkpoint flags; do
    train "$name.$from.log" --steps 3 --resume "$work/$name" --optimizer-from $from
    local ranks
    ranks=$(grep -F -- "$want" "$work/$name.$from.log" | grep -o '\[rank [0-9]*\]' | sort -u | wc -l)
    if [ $rc -eq 2 ] && [ "$ranks" -eq 2 ]; then echo "ok: $name ($from): exit 2, both ranks: $want"
    else cat "$work/$name.$from.log"; fail "$name ($from): exit $rc, '$want' from $ranks ranks"; fi
  done
}
bad neg lr -1 "checkpoint '$work/neg' holds invalid optimizer settings: learning rate -1 must be positive"
bad huge lr 1e39 "$work/huge/manifest.json: field 'optimizer.lr' is 1e+39, which does not fit a float"
bad beta beta1 1.0 "checkpoint '$work/beta' holds invalid optimizer settings: beta1 1 must be in [0, 1)"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all ok"
