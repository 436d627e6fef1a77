#!/usr/bin/env bash
# The whole fault matrix on the emulated 2 x 4 cluster: 4 faults (stop, kill, cut, orted) x 2
# layouts (zero3 I4 J2, HSDP I4 J1) x the inter level on MPI and UCX, each case by
# fault_matrix.sh, then a table of the times to exit (the one in docs/reliability.md).
#   tests/faults/run_matrix.sh [BUILD_DIR]      (root; about 8 minutes)
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-$HERE/../../build}
results=$(mktemp)
failed=0
for inter in mpi ucx; do
  for layout in zero3 hsdp; do
    for fault in stop kill cut orted; do
      if out=$("$HERE/fault_matrix.sh" --case $fault --layout $layout --inter $inter \
                 --timeout 20 --results "$results" -- "$build/examples/train_mlp" 2>&1); then
        echo "$out" | head -1
      else
        echo "$out"
        failed=1
      fi
    done
  done
done
echo
echo "| fault | layout | inter | last surviving rank exited (s) | job ended (s) | exit code |"
echo "| --- | --- | --- | --- | --- | --- |"
sed -n 's/^fault_matrix: \([a-z]*\) \([a-z0-9]*\) inter=\([a-z]*\): last surviving rank exited \([0-9.]*\) s after the fault, job ended after \([0-9.]*\) s, exit code \([0-9]*\).*/| \1 | \2 | \3 | \4 | \5 | \6 |/p' "$results"
rm -f "$results"
exit $failed
