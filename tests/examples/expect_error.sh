#!/usr/bin/env bash
# Bad-input check for an MPI program: runs it under mpirun and passes only if the job exits
# non-zero (not by timeout), within the time limit, and EVERY rank printed an error line that
# contains the expected text.
#   expect_error.sh NP RANKS_PER_NODE|- "expected text" PROGRAM [ARGS...]
# Extra environment for the ranks: pass as HSDP_*=value in the environment of this script.
set -u
np=$1; rpn=$2; want=$3; shift 3
mpirun=${MPIEXEC:-mpirun}
xargs=()
for v in $(env | grep -o '^HSDP_[A-Z_]*'); do xargs+=(-x "$v"); done
if [ "$rpn" != "-" ]; then export HSDP_RANKS_PER_NODE=$rpn; xargs+=(-x HSDP_RANKS_PER_NODE); fi
out=$(timeout 60 "$mpirun" --oversubscribe -np "$np" "${xargs[@]}" "$@" 2>&1)
rc=$?
echo "$out"
if [ $rc -eq 0 ]; then echo "expect_error: FAIL: exit code 0, expected non-zero"; exit 1; fi
if [ $rc -eq 124 ]; then echo "expect_error: FAIL: timed out (hang)"; exit 1; fi
ranks=$(echo "$out" | grep -F -- "$want" | grep -o '\[rank [0-9]*\]' | sort -u | wc -l)
if [ "$ranks" -ne "$np" ]; then
  echo "expect_error: FAIL: '$want' printed by $ranks distinct ranks, expected $np"; exit 1
fi
if echo "$out" | grep -q -E 'Backtrace|Segmentation|core dumped'; then
  echo "expect_error: FAIL: crash trace in output"; exit 1
fi
echo "expect_error: OK: exit $rc, all $np ranks reported '$want'"
