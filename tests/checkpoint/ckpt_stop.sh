#!/usr/bin/env bash
# hsdp-ckpt stopped mid-way (issue 41): SIGTERM (and SIGINT) during a reshard to 10^5 ranks and
# during an export: exit 143 (130), the message names what was left unfinished, no temporary
# and no output left behind, the input byte for byte unchanged. Also: a progress line on a
# terminal (script(1) gives one), none when stderr is a file or with --quiet.
#   ckpt_stop.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1; work=$2
# shellcheck source=ckpt_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/ckpt_common.sh"
"$mlp" --mode none --dims 32,2048,2048,2048,2048,10 --batch 4 --steps 1 --save-dir "$work/good" >/dev/null
good="$work/good/step-00000001"
sums() { (cd "$good" && sha256sum ./* | sha256sum); }
before=$(sums)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
# Starts CMD in the background, waits until PATTERN (a glob under $work) exists, stops the
# process, sends SIG, resumes it and checks the exit code and that nothing is left.
stop_case() {  # NAME SIG CODE WANT PATTERN -- CMD...
  local name=$1 sig=$2 code=$3 want=$4 pattern=$5; shift 6
  "$@" >"$work/$name.log" 2>&1 &
  local pid=$! i rc=0
  for i in $(seq 1 3000); do
    compgen -G "$pattern" >/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.01
  done
  kill -STOP $pid 2>/dev/null || true
  kill -"$sig" $pid 2>/dev/null || true
  kill -CONT $pid 2>/dev/null || true
  wait $pid || rc=$?
  local left
  left=$(find "$work" -maxdepth 1 -name '.*tmp-*' | head -3)
  if [ $rc -ne "$code" ] || ! grep -qF -- "$want" "$work/$name.log" || [ -n "$left" ]; then
    cat "$work/$name.log"; fail "$name: exit $rc (want $code), left: ${left:-nothing}"
  else
    echo "ok: $name: exit $rc: $(tail -1 "$work/$name.log")"
  fi
}
stop_case reshard_term TERM 143 "stopped by SIGTERM while" "$work/.r.tmp-*/data-00100.bin" -- \
  "$ckpt" reshard "$good" "$work/r" --world 100000 --ranks-per-node 100 --intra-shard 1 \
  --inter-shard 1 --mode none
test -e "$work/r" && fail "reshard_term: the output exists"
stop_case reshard_int INT 130 "stopped by SIGINT while" "$work/.r.tmp-*/data-00100.bin" -- \
  "$ckpt" reshard "$good" "$work/r" --world 100000 --ranks-per-node 100 --intra-shard 1 \
  --inter-shard 1 --mode none
stop_case export_term TERM 143 "stopped by SIGTERM while exporting" "$work/.x.safetensors.tmp-*" -- \
  "$ckpt" export "$good" "$work/x.safetensors" --dtype bf16
test -e "$work/x.safetensors" && fail "export_term: the output exists"
[ "$(sums)" = "$before" ] && echo "ok: the input is unchanged" || fail "the input changed"
# Progress: on a terminal a line with the phase, amounts, rate; none into a file or with --quiet.
if command -v script >/dev/null; then
  script -qec "$ckpt verify $good" "$work/tty.log" >/dev/null
  grep -q "verifying .* of .*" "$work/tty.log" && echo "ok: progress on a terminal" ||
    { cat "$work/tty.log"; fail "no progress line on a terminal"; }
  script -qec "$ckpt verify --quiet $good" "$work/quiet.log" >/dev/null
  grep -q "verifying" "$work/quiet.log" && fail "--quiet printed progress" || echo "ok: --quiet"
fi
"$ckpt" verify "$good" >"$work/plain.log" 2>&1
grep -q "verifying" "$work/plain.log" && fail "progress into a file" || echo "ok: no progress into a file"
[ "$fails" -eq 0 ] || { echo "$fails FAILED"; exit 1; }
