#!/usr/bin/env bash
# kill -9 of one rank in the middle of a save, on the emulated 2-node cluster: the job dies, the
# previous checkpoint is still committed, every committed checkpoint verifies, `latest` names one
# of them, and a new job loads it with the parameters of training straight to its step.
#   ckpt_kill.sh CLUSTER_SH CKPT_KILL HSDP_CKPT WORK_DIR
set -uo pipefail
cluster=$1; prog=$2; ckpt=$3; work=$4
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
root="$work/root"
"$cluster" --nodes 2 --ranks-per-node 4 --timeout 120 -- "$prog" save "$root"
rc=$?
[ $rc -ne 0 ] || { echo "FAIL: the job with a killed rank exited 0"; exit 1; }
[ $rc -ne 124 ] || { echo "FAIL: the job hung"; exit 1; }
echo "ok: the job ended with exit $rc"
ls -a "$root"
"$ckpt" verify "$root/step-00000002" || { echo "FAIL: the previous checkpoint does not verify"; exit 1; }
for d in "$root"/step-*; do
  "$ckpt" verify "$d" >/dev/null || { echo "FAIL: $d is visible but does not verify"; exit 1; }
done
latest=$(cat "$root/latest")
case $latest in
  step-00000002) echo "ok: latest is still the previous checkpoint (the killed save never committed)";;
  step-00000003) echo "note: the save of step 3 had committed before the job was torn down";;
  *) echo "FAIL: latest names '$latest'"; exit 1;;
esac
"$cluster" --nodes 2 --ranks-per-node 4 --timeout 120 -- "$prog" load "$root" || { echo "FAIL: load"; exit 1; }
if [ "$latest" != step-00000002 ]; then
  "$cluster" --nodes 2 --ranks-per-node 4 --timeout 120 -- "$prog" load "$root/step-00000002" || { echo "FAIL: load"; exit 1; }
fi
echo "ok: kill -9 mid-save"
