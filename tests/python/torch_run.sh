#!/usr/bin/env bash
# Runs one program of python/tests/torch (the hsdp.torch tests) with build/pyenv's python: run
# under mpirun it is one rank. Exit 77 (ctest: skipped) when build/pyenv lacks hsdp or torch:
# scripts/test (scripts/python-env) always installs both first.
#   torch_run.sh BUILD PROGRAM.py ARGS...
set -uo pipefail
build=$1
shift
py=$build/pyenv/bin/python
if [ ! -x "$py" ] || ! "$py" -c "import hsdp, torch" 2>/dev/null; then
  echo "torch tests: no hsdp or torch in $build/pyenv (run scripts/python-env); skipped"
  exit 77
fi
root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export HSDP_BUILD_DIR=$build PYTHONPATH="$root/python/tests/torch${PYTHONPATH:+:$PYTHONPATH}"
# One compute thread per rank (ranks share the machine's cores), as the benchmarks run.
export OMP_NUM_THREADS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
cd "$root/python/tests/torch" || exit 1
exec "$py" "$@"
