#!/usr/bin/env bash
# hsdp-plan's files through hsdp/files.h: --layers naming a FIFO, a device or a sparse file over
# hsdp::kMaxUnitsFileBytes, and --svg onto a FIFO or over the --layers input. Each must exit 2
# within 20 s (expect_exit.sh's bound: an open FIFO would block forever), naming the path.
#   plan_bad_files.sh HSDP_PLAN
set -u
plan=$1
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkfifo "$tmp/fifo"
truncate -s 100M "$tmp/big"  # sparse: no disk used
printf 'fc1 1e9\nfc2 2e9\n' >"$tmp/units.txt"
m=(--nodes 2 --gpus-per-node 8)
fails=0
expect() { bash "$here/expect_exit.sh" 2 "$@" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fails=$((fails + 1)); }; }
expect "'$tmp/fifo' is a FIFO" "$plan" --layers "$tmp/fifo" "${m[@]}"
expect "'/dev/zero' is a device node" "$plan" --layers /dev/zero "${m[@]}"
expect "'$tmp/big' is 104857600 bytes, over the limit of 67108864" "$plan" --layers "$tmp/big" "${m[@]}"
expect "--svg: cannot write '$tmp/fifo'" "$plan" --params 1e9 "${m[@]}" --svg "$tmp/fifo"
expect "--svg: cannot write '$tmp/units.txt'" "$plan" --layers "$tmp/units.txt" "${m[@]}" \
  --svg "$tmp/units.txt"
# The input is intact after the refused write.
if [ "$(cat "$tmp/units.txt")" != "$(printf 'fc1 1e9\nfc2 2e9')" ]; then
  echo "FAIL: --layers file changed by a refused --svg"; fails=$((fails + 1))
fi
# And a good one still works.
bash "$here/expect_exit.sh" 0 "chart: $tmp/plan.svg" "$plan" --layers "$tmp/units.txt" "${m[@]}" \
  --svg "$tmp/plan.svg" >"$tmp/out" 2>&1 || { cat "$tmp/out"; fails=$((fails + 1)); }
[ $fails -eq 0 ] && echo "plan_bad_files: OK" || echo "plan_bad_files: $fails failed"
exit $((fails > 0))
