#!/usr/bin/env bash
# Damaged and mismatching checkpoints, and unusable save directories: train_mlp on 3 ranks
# reports each on every rank, naming the file, exits non-zero, does not hang
# (tests/examples/expect_error.sh); hsdp-ckpt verify names the file and the byte range.
#   ckpt_bad_input.sh BUILD_DIR WORK_DIR EXPECT_ERROR_SH
set -euo pipefail
build=$1; work=$2; expect_error=$3
# shellcheck source=ckpt_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_common.sh"
flags=(--mode zero3 --intra-shard 1 --inter-shard 3)
"$mpirun" --oversubscribe --bind-to none -np 3 -x HSDP_RANKS_PER_NODE=1 "$mlp" "${flags[@]}" --steps 2 \
  --save-dir "$work/good" >/dev/null
good="$work/good/step-00000002"
fails=0
case_() {  # NAME WANT ARGS...: a damaged copy made by the caller in $work/NAME
  local name=$1 want=$2; shift 2
  if "$expect_error" 3 1 "$want" --bind-to none "$mlp" "${flags[@]}" "$@" >"$work/$name.log" 2>&1; then
    echo "ok: $name: every rank reported '$want'"
  else
    cat "$work/$name.log"; echo "FAIL: $name"; fails=$((fails + 1))
  fi
}
damaged() { rm -rf "$work/$1"; cp -r "$good" "$work/$1"; }
verify_fails() {  # NAME WANT: hsdp-ckpt verify exits 1 naming it
  local rc=0 out
  out=$("$ckpt" verify "$work/$1" 2>&1) || rc=$?
  if [ $rc -ne 1 ] || ! echo "$out" | grep -qF -- "$2"; then
    echo "$out"; echo "FAIL: verify of $1 (exit $rc)"; fails=$((fails + 1))
  else
    echo "ok: verify $1: $out"
  fi
}

damaged truncated; truncate -s -100 "$work/truncated/data-00001.bin"
case_ truncated "data-00001.bin' is " --resume "$work/truncated" --steps 4
verify_fails truncated "data-00001.bin' is "
damaged flipped
printf '\x55' | dd of="$work/flipped/data-00002.bin" bs=1 seek=4000 conv=notrunc status=none
case_ flipped "data-00002.bin': bytes [" --resume "$work/flipped" --steps 4
verify_fails flipped "data-00002.bin': bytes ["
damaged missing; rm "$work/missing/data-00000.bin"
case_ missing "data-00000.bin': No such file or directory" --resume "$work/missing" --steps 4
verify_fails missing "data-00000.bin': No such file or directory"
damaged nomanifest; rm "$work/nomanifest/manifest.json"
case_ nomanifest "has no manifest.json (not a committed checkpoint)" --resume "$work/nomanifest" --steps 4
damaged corrupt; head -c 300 "$good/manifest.json" >"$work/corrupt/manifest.json"
case_ corrupt "corrupt/manifest.json: not valid JSON (corrupt manifest)" --resume "$work/corrupt" --steps 4
damaged version; sed -i 's/"format_version": 1/"format_version": 99/' "$work/version/manifest.json"
case_ version "format_version 99; this hsdp reads versions 1 and 2" --resume "$work/version" --steps 4
case_ other_model "does not match the model: parameter 'fc1.weight' has shape [333, 1000] in the checkpoint, [300, 1000] in the model" \
  --resume "$good" --dims 32,1000,300,128,10 --steps 4
case_ past_steps "the checkpoint is at step 2, past --steps 1" --resume "$good" --steps 1
case_ no_checkpoint "no checkpoint at '$work/nothing'" --resume "$work/nothing" --steps 1
case_ unwritable "cannot create directory '/proc/hsdp-ckpt-test" --save-dir /proc/hsdp-ckpt-test/x --steps 1
touch "$work/afile"
case_ under_file "'$work/afile/x': Not a directory" --save-dir "$work/afile/x" --steps 1
# A full disk during a save: a 64 KiB tmpfs (in a mount namespace of its own) holds the first
# checkpoint of a small model, not the second; every rank names the error, the first stays
# committed and verifies.
# Two sizes: which ranks' writes fit differs (at 76k rank 0 and rank 2 fit, rank 1 does not, and
# not even its error part fits: rank 0 must learn of it from the empty marker, not a timeout).
full_disk() {
  local size=$1 d="$work/full" rc=0
  mkdir -p "$d"
  mount -t tmpfs -o size=$size hsdp-ckpt-full "$d" || { echo "SKIP: cannot mount a tmpfs"; return 0; }
  "$expect_error" 3 1 "No space left on device" --bind-to none "$mlp" "${flags[@]}" --dims 32,64,10 \
    --steps 3 --save-every 1 --save-dir "$d" >"$work/full.log" 2>&1 || rc=1
  if [ $rc -eq 0 ] && [ "$(cat "$d/latest")" = step-00000001 ] && "$ckpt" verify "$d" >/dev/null; then
    echo "ok: full disk ($size): every rank reported 'No space left on device'; step 1 still committed and verifying"
  else
    cat "$work/full.log"; ls -la "$d"; echo "FAIL: full disk ($size)"; rc=1
  fi
  umount "$d"
  return $rc
}
export -f full_disk
export work mlp ckpt expect_error
export flags_str="${flags[*]}"
if command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
  for size in 64k 76k; do
    unshare -m bash -c "flags=(\$flags_str); full_disk $size" || fails=$((fails + 1))
  done
else
  echo "note: full-disk case skipped (no mount namespace: not root?)"
fi
# The good checkpoint is untouched by all of it.
"$ckpt" verify "$good" >/dev/null || { echo "FAIL: the good checkpoint no longer verifies"; exit 1; }
[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "ok: every bad input reported"
