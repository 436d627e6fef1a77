#!/usr/bin/env bash
# A fault on one rank in the middle of a save, on the emulated 2-node cluster: the job ends, the
# previous checkpoint is still committed, every committed checkpoint verifies, `latest` names one
# of them, and a new job loads it with the parameters of training straight to its step.
#   ckpt_kill.sh CLUSTER_SH CKPT_KILL HSDP_CKPT WORK_DIR [FAULT]
# FAULT (ckpt_kill.cc): kill (SIGKILL, the default; mpirun ends the job), stop (SIGSTOP; the
# watchdog ends it, HSDP_TIMEOUT_S=10, naming the stopped rank), cut (the last node's link down;
# the watchdog ends it naming the unreachable node). TCP in the cluster gives up on the cut link
# after ~25 s (--tcp-retries 6): after the watchdog's 10 s, so that the report is hsdp's (Open
# MPI's TCP transport ends the job on its own once its sends time out), and soon enough for
# mpirun's own connection to node 1 to end the job.
set -uo pipefail
cluster=$1; prog=$2; ckpt=$3; work=$4; fault=${5:-kill}
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
root="$work/root"
export HSDP_TIMEOUT_S=10
t0=$(date +%s)
"$cluster" --nodes 2 --ranks-per-node 4 --timeout 150 --tcp-retries 6 --keep-output "$work/out" \
  -- "$prog" save "$root" "$fault"
rc=$?
echo "the job with the fault ($fault) ended with exit $rc after $(($(date +%s) - t0)) s"
[ $rc -ne 0 ] || { echo "FAIL: the job with a faulty rank exited 0"; exit 1; }
[ $rc -ne 124 ] || { echo "FAIL: the job hung"; exit 1; }
case $fault in
  stop) named='rank 7 \(hsdp-node1, stopped' ;;
  cut) named='unreachable: hsdp-node1|hsdp-node1, unreachable' ;;
  *) named= ;;
esac
if [ -n "$named" ]; then
  grep -qE "$named" "$work/out/stderr.log" ||
    { echo "FAIL: no line names the fault (/$named/)"; tail -20 "$work/out/stderr.log"; exit 1; }
  grep -E "hsdp \[rank [0-9]+\]: timeout" "$work/out/stderr.log" | head -1
fi
ls -a "$root"
"$ckpt" verify "$root/step-00000002" || { echo "FAIL: the previous checkpoint does not verify"; exit 1; }
for d in "$root"/step-*; do
  "$ckpt" verify "$d" >/dev/null || { echo "FAIL: $d is visible but does not verify"; exit 1; }
done
latest=$(cat "$root/latest")
case $latest in
  step-00000002) echo "ok: latest is still the previous checkpoint (the interrupted save never committed)";;
  step-00000003) echo "note: the save of step 3 had committed before the job was torn down";;
  *) echo "FAIL: latest names '$latest'"; exit 1;;
esac
unset HSDP_TIMEOUT_S
"$cluster" --nodes 2 --ranks-per-node 4 --timeout 120 -- "$prog" load "$root" || { echo "FAIL: load"; exit 1; }
if [ "$latest" != step-00000002 ]; then
  "$cluster" --nodes 2 --ranks-per-node 4 --timeout 120 -- "$prog" load "$root/step-00000002" || { echo "FAIL: load"; exit 1; }
fi
echo "ok: $fault mid-save"
