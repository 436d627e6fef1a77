#!/usr/bin/env bash
# Hostile files around checkpoints (issue 33), each class with fixtures of its own made here:
# symbolic links planted in the save directory and in a checkpoint, FIFOs and copies of device
# nodes (mknod in this directory, never the real /dev), outputs that are the input, sparse and
# oversized files, someone else's directories beside the checkpoints, reshard and export targets
# that cannot work, and a 100,000-rank checkpoint read and written under `ulimit -n 256`.
# Every case: the expected exit code (2 bad input, 3 runtime), a message naming the path or value,
# a bounded time, nothing written outside the target, no temporaries left, the checkpoint intact.
#   ckpt_files.sh BUILD_DIR WORK_DIR EXPECT_ERROR_SH
set -euo pipefail
build=$1; work=$2; expect_error=$3
# shellcheck source=ckpt_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_common.sh"
flags=(--mode zero3 --intra-shard 1 --inter-shard 3 --dims 32,64,10)
run3() { timeout 120 "$mpirun" --oversubscribe --bind-to none -np 3 -x HSDP_RANKS_PER_NODE=1 "$mlp" "${flags[@]}" "$@"; }
run3 --steps 2 --save-dir "$work/good" >/dev/null
good="$work/good/step-00000002"
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }

# tool NAME WANT_RC WANT_TEXT ARGS...: hsdp-ckpt exits WANT_RC within 60 s printing WANT_TEXT.
tool() {
  local name=$1 want_rc=$2 want=$3 rc=0 out; shift 3
  out=$(timeout 60 "$ckpt" "$@" 2>&1) || rc=$?
  if [ $rc -ne "$want_rc" ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "$out" | head -c 2000; fail "$name: exit $rc (want $want_rc), want '$want'"
  else
    ok "$name: exit $rc: $(head -c 300 <<<"$out" | head -n 1)"
  fi
}
# mpi NAME WANT ARGS...: train_mlp on 3 ranks, every rank names WANT, non-zero, no hang.
mpi() {
  local name=$1 want=$2; shift 2
  if "$expect_error" 3 1 "$want" --bind-to none "$mlp" "${flags[@]}" "$@" >"$work/$name.log" 2>&1; then
    ok "$name: every rank reported '$want'"
  else
    cat "$work/$name.log"; fail "$name"
  fi
}
no_temps() {  # DIR NAME: nothing hidden left behind in DIR
  local left
  left=$(find "$1" -maxdepth 1 -name '.*tmp*' | head -5)
  [ -z "$left" ] && ok "$2: no temporaries left in $1" || fail "$2: left $left"
}
copy() { rm -rf "$work/$1"; cp -r "$good" "$work/$1"; }

# --- writes through planted symbolic links -------------------------------------------------------
echo "precious" >"$work/outside"
mkdir -p "$work/plant"
ln -s "$work/outside" "$work/plant/latest.tmp"
ln -s "$work/outside" "$work/plant/latest"
for i in 1 2 3; do ln -s "$work/outside" "$work/plant/.step-0000000$i.tmp"; done
run3 --steps 2 --save-every 1 --save-dir "$work/plant" >/dev/null
if [ "$(cat "$work/outside")" = precious ] && [ ! -L "$work/plant/latest" ] &&
   [ "$(cat "$work/plant/latest")" = step-00000002 ] && "$ckpt" verify "$work/plant" >/dev/null; then
  ok "planted links: the outside file is untouched, latest is a file naming step-00000002"
else
  fail "planted links: outside='$(cat "$work/outside")' latest=$(ls -l "$work/plant/latest")"
fi
mkdir -p "$work/exp"
ln -s "$work/outside" "$work/exp/w.safetensors.tmp"
ln -s "$work/outside" "$work/exp/.w.safetensors.tmp"
tool export_beside_links 0 "wrote $work/exp/w.safetensors" export "$good" "$work/exp/w.safetensors"
[ "$(cat "$work/outside")" = precious ] && ok "export: planted links not written through" ||
  fail "export wrote through a planted link"
ln -s "$work/outside" "$work/exp/link.safetensors"
tool export_onto_link 2 "is a symbolic link" export "$good" "$work/exp/link.safetensors"
ln -s "$work/nowhere" "$work/exp/dangling"
tool reshard_onto_dangling 2 "is a symbolic link" reshard "$good" "$work/exp/dangling" \
  --world 2 --ranks-per-node 2 --intra-shard 2 --inter-shard 1
[ "$(cat "$work/outside")" = precious ] && [ ! -e "$work/nowhere" ] && ok "link targets untouched" ||
  fail "a link target was written"
# A data file that is a link elsewhere (to a valid copy) is refused, not followed.
copy linked; cp "$work/linked/data-00001.bin" "$work/data-copy"
rm "$work/linked/data-00001.bin"; ln -s "$work/data-copy" "$work/linked/data-00001.bin"
tool verify_linked_data 2 "data-00001.bin': a symbolic link" verify "$work/linked"
mpi resume_linked_data "data-00001.bin': a symbolic link" --resume "$work/linked" --steps 3
copy linkedman; mv "$work/linkedman/manifest.json" "$work/man-copy"
ln -s "$work/man-copy" "$work/linkedman/manifest.json"
tool verify_linked_manifest 2 "manifest.json': a symbolic link" verify "$work/linkedman"

# --- the input and system files are not outputs ---------------------------------------------------
sum_before=$(cat "$good"/* | md5sum)
tool export_onto_manifest 2 "is inside the input" export "$good" "$good/manifest.json"
tool export_onto_data 2 "is inside the input" export "$good" "$good/data-00000.bin"
tool export_into_ckpt 2 "is inside the input" export "$good" "$good/new.safetensors"
tool reshard_into_ckpt 2 "is inside the input" reshard "$good" "$good/sub" \
  --world 2 --ranks-per-node 2 --intra-shard 2 --inter-shard 1
tool reshard_onto_parent 2 "existing directory" reshard "$good" "$work/good" \
  --world 2 --ranks-per-node 2 --intra-shard 2 --inter-shard 1
[ "$(cat "$good"/* | md5sum)" = "$sum_before" ] && "$ckpt" verify "$good" >/dev/null &&
  ok "the input checkpoint is unchanged" || fail "the input checkpoint changed"
if [ "$(id -u)" = 0 ] && mknod "$work/null" c 1 3 2>/dev/null && mknod "$work/full" c 1 7; then
  tool export_onto_null_node 2 "is a device node" export "$good" "$work/null"
  tool export_onto_full_node 2 "is a device node" export "$good" "$work/full"
  [ -c "$work/null" ] && [ -c "$work/full" ] && ok "device nodes are still device nodes" ||
    fail "a device node was replaced"
else
  echo "note: device-node cases skipped (mknod needs root)"
fi
mkfifo "$work/fifo-out"
tool export_onto_fifo 2 "is a FIFO" export "$good" "$work/fifo-out"
mkdir -p "$work/adir"
tool export_onto_dir 2 "is an existing directory" export "$good" "$work/adir"
no_temps "$work" "export onto a directory"

# --- pruning deletes only what hsdp wrote ----------------------------------------------------------
mkdir -p "$work/keep/other" "$work/keep/step-00000000" "$work/keep/.tmp-mine"
echo '{"format": "something else"}' >"$work/keep/other/manifest.json"
echo '{"format": "something else"}' >"$work/keep/step-00000000/manifest.json"
echo "user data" >"$work/keep/.tmp-mine/notes"
echo "user data" >"$work/keep/.step-00000001.tmp-x"
run3 --steps 3 --save-every 1 --keep 1 --save-dir "$work/keep" >/dev/null
kept=$(cd "$work/keep" && ls -A | tr '\n' ' ')
if [ -f "$work/keep/other/manifest.json" ] && [ -f "$work/keep/step-00000000/manifest.json" ] &&
   [ -f "$work/keep/.tmp-mine/notes" ] && [ -f "$work/keep/.step-00000001.tmp-x" ] &&
   [ -d "$work/keep/step-00000003" ] && [ ! -e "$work/keep/step-00000001" ] &&
   [ ! -e "$work/keep/step-00000002" ]; then
  ok "--keep 1 pruned only hsdp's checkpoints: $kept"
else
  fail "--keep: left $kept"
fi

# --- FIFOs and device nodes where a file is expected: an error, never a hang ----------------------
copy fifo_man; rm "$work/fifo_man/manifest.json"; mkfifo "$work/fifo_man/manifest.json"
tool fifo_manifest 2 "manifest.json' is a FIFO" verify "$work/fifo_man"
mpi resume_fifo_manifest "manifest.json' is a FIFO" --resume "$work/fifo_man" --steps 3
copy fifo_data; rm "$work/fifo_data/data-00002.bin"; mkfifo "$work/fifo_data/data-00002.bin"
tool fifo_data 2 "data-00002.bin' is a FIFO" verify "$work/fifo_data"
mpi resume_fifo_data "data-00002.bin' is a FIFO" --resume "$work/fifo_data" --steps 3
mkdir -p "$work/fifo_latest"; mkfifo "$work/fifo_latest/latest"
tool fifo_latest 2 "latest' is a FIFO" inspect "$work/fifo_latest"
mkfifo "$work/fifo.safetensors"
mpi init_from_fifo "fifo.safetensors' is a FIFO" --init-from "$work/fifo.safetensors" --steps 1
if [ "$(id -u)" = 0 ] && mknod "$work/zero" c 1 5 2>/dev/null; then
  copy dev_data; rm "$work/dev_data/data-00000.bin"; mknod "$work/dev_data/data-00000.bin" c 1 5
  tool device_data 2 "data-00000.bin' is a device node" verify "$work/dev_data"
  mpi init_from_device "zero' is a device node" --init-from "$work/zero" --steps 1
fi

# A safetensors index whose shard is a FIFO: refused by name, not a blocked open.
mkfifo "$work/w-00001-of-00001.safetensors"
echo '{"metadata": {}, "weight_map": {"fc0.weight": "w-00001-of-00001.safetensors"}}' \
  >"$work/w.safetensors.index.json"
mpi init_from_index_fifo "w-00001-of-00001.safetensors' is a FIFO" \
  --init-from "$work/w.safetensors.index.json" --steps 1

# --- names that are not UTF-8 or hold control characters ---------------------------------------------
odd=$'\xff\x1b[2J'
cp -r "$good" "$work/$odd"
if out=$(timeout 60 "$ckpt" inspect --json "$work/$odd" 2>&1) &&
   python3 -c 'import json,sys; json.loads(sys.stdin.read())' <<<"$out"; then
  ok "inspect --json of a non-UTF-8 path: valid JSON, exit 0"
else
  echo "$out" | head -c 1000; fail "inspect --json of a non-UTF-8 path"
fi
tool odd_path_escaped 2 '\xff\x1b[2J' verify "$work/$odd/nothing"

# --- unbounded reads and sizes the files do not back ------------------------------------------------
mkdir -p "$work/biglatest"; head -c 10000000 /dev/urandom >"$work/biglatest/latest"
tool big_latest 2 "over the limit of 4096 bytes" inspect "$work/biglatest"
copy bigman; truncate -s 2G "$work/bigman/manifest.json"
tool big_manifest 2 "over the limit of 268435456 bytes" verify "$work/bigman"
printf 'step-\x1b[31mred\n' >"$work/biglatest/latest"
tool latest_escaped 2 'step-\x1b[31mred' inspect "$work/biglatest"
# Sizes that only a sparse file backs: a data file said to be 1 TiB (a sparse file of that length)
# and a 2 GiB user entry in it are refused before anything is read or allocated.
sparse() {  # NAME FILE_BYTES USER_BYTES
  copy "$1"
  python3 - "$work/$1" "$2" "$3" <<'EOF'
import json, os, sys
d, size, user = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = json.load(open(f"{d}/manifest.json"))
if user:
    m["user"] = [{"key": "huge", "file": 0, "offset": m["files"][0]["bytes"], "bytes": user, "xxh64": "0000000000000001"}]
    size = m["files"][0]["bytes"] + user
m["files"][0]["bytes"] = size
json.dump(m, open(f"{d}/manifest.json", "w"), indent=1)
os.truncate(f"{d}/data-00000.bin", size)
EOF
}
sparse sparse_file $((1 << 40)) 0
tool sparse_file_verify 2 "is said to be 1099511627776 bytes" verify "$work/sparse_file"
tool sparse_file_reshard 2 "is said to be 1099511627776 bytes" reshard "$work/sparse_file" \
  "$work/sparse-out" --world 2 --ranks-per-node 2 --intra-shard 2 --inter-shard 1
mpi sparse_file_resume "is said to be 1099511627776 bytes" --resume "$work/sparse_file" --steps 3
sparse sparse_user 0 $((2 << 30))
tool sparse_user_export 2 "over the limit of 1073741824 bytes" export "$work/sparse_user" "$work/x.safetensors"
tool sparse_user_diff 2 "over the limit of 1073741824 bytes" diff "$good" "$work/sparse_user"
no_temps "$work" "sparse checkpoints"
[ ! -e "$work/sparse-out" ] && [ ! -e "$work/x.safetensors" ] && ok "nothing at the failed targets" ||
  fail "a failed reshard or export left its target"

# --- reshard and export targets that cannot work leave nothing -------------------------------------
rs=(--world 2 --ranks-per-node 2 --intra-shard 2 --inter-shard 1)
tool reshard_trailing_slash 2 "does not end in a file or directory name" reshard "$good" "$work/new/" "${rs[@]}"
tool reshard_dot 2 "does not end in a file or directory name" reshard "$good" "$work/new/." "${rs[@]}"
tool reshard_empty 2 "empty path" reshard "$good" "" "${rs[@]}"
tool reshard_no_parent 2 "output's directory" reshard "$good" "$work/none/new" "${rs[@]}"
no_temps "$work" "failed reshards"
[ ! -e "$work/new" ] && ok "no output of the failed reshards" || fail "a failed reshard left $work/new"

# --- the open-file limit: a 100,000-rank checkpoint under ulimit -n 256 -----------------------------
big=(--world 100000 --ranks-per-node 100000 --intra-shard 100000 --inter-shard 1)
if (ulimit -n 256 && timeout 600 "$ckpt" reshard "$good" "$work/wide" "${big[@]}" >"$work/wide.log" 2>&1); then
  n=$(find "$work/wide" -name 'data-*.bin' | wc -l)
  [ "$n" -eq 100000 ] && ok "reshard to 100000 ranks under ulimit -n 256: $n data files" ||
    fail "reshard to 100000 ranks wrote $n files"
  if (ulimit -n 256 && timeout 600 "$ckpt" verify "$work/wide" >/dev/null 2>&1 &&
      timeout 600 "$ckpt" export "$work/wide" "$work/wide.safetensors" >/dev/null 2>&1 &&
      timeout 600 "$ckpt" export "$good" "$work/narrow.safetensors" >/dev/null 2>&1) &&
     cmp -s "$work/wide.safetensors" "$work/narrow.safetensors"; then
    ok "verify and export of the 100000-rank checkpoint under ulimit -n 256: the same bytes as the 3-rank one's"
  else
    fail "verify/export of the 100000-rank checkpoint under ulimit -n 256"
  fi
  (ulimit -n 256 && timeout 600 "$ckpt" diff "$good" "$work/wide" | tail -n 1 | grep -qx identical) &&
    ok "diff 3 ranks vs 100000 ranks under ulimit -n 256: identical" || fail "diff under ulimit -n 256"
  rm -rf "$work/wide"
else
  cat "$work/wide.log"; fail "reshard to 100000 ranks under ulimit -n 256"
fi

"$ckpt" verify "$good" >/dev/null || fail "the good checkpoint no longer verifies"
[ "$(cat "$work/outside")" = precious ] || fail "the outside file changed"
[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "ok: every hostile file handled"
