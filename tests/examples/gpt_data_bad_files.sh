#!/usr/bin/env bash
# train_gpt --data on what is not a corpus (hsdp/files.h through gpt::loadCorpus): a FIFO, a
# device, a directory holding a FIFO and a symbolic link to a file outside, a sparse file over
# gpt::kMaxCorpusBytes. Each must exit 2 within 30 s (a FIFO opened for reading would block
# forever, /dev/zero read whole never ends), with every rank printing an error that names the
# path.
#   gpt_data_bad_files.sh MPIRUN TRAIN_GPT [MPIRUN FLAGS...]
set -u
mpirun=$1; prog=$2; shift 2
np=2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkfifo "$tmp/fifo"
mkdir "$tmp/dir" "$tmp/outside"
mkfifo "$tmp/dir/pipe"
printf 'outside\n%%\n' >"$tmp/outside/quotes"
ln -s "$tmp/outside/quotes" "$tmp/dir/link"
truncate -s 2G "$tmp/big"  # sparse: no disk used

fails=0
check() {  # PATH-TO-PASS  TEXT-EVERY-RANK-NAMES
  local data=$1 want=$2 out rc t0 t1 ranks
  shift 2  # the rest: mpirun's flags
  t0=$(date +%s)
  out=$(timeout 30 "$mpirun" "$@" -np $np -x HSDP_RANKS_PER_NODE=1 "$prog" --data "$data" \
        --steps 1 2>&1)
  rc=$?
  t1=$(date +%s)
  ranks=$(grep -F -- ": error: " <<<"$out" | grep -F -- "$want" | grep -o '\[rank [0-9]*\]' |
          sort -u | wc -l)
  if [ $rc -ne 2 ] || [ "$ranks" -ne $np ]; then
    echo "FAIL: --data $data: exit $rc (expected 2), $ranks of $np ranks named '$want'" \
         "($((t1 - t0)) s)"
    echo "$out" | tail -8
    fails=$((fails + 1))
  else
    echo "OK: --data $data: exit 2, every rank named '$want' ($((t1 - t0)) s)"
  fi
}
check "$tmp/fifo" "'$tmp/fifo' is a FIFO" "$@"
check /dev/zero "'/dev/zero' is a device node" "$@"
check "$tmp/dir" "'$tmp/dir/pipe' is a FIFO" "$@"
check "$tmp/big" "'$tmp/big' is 2147483648 bytes, over the limit" "$@"
exit $((fails > 0))
