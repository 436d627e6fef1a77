#!/usr/bin/env bash
# The one runner of the Python tests, in the environment scripts/python-env made (build/pyenv),
# against the build tree `$1`. Exit 77 (ctest: skipped) when that environment or what the tests
# import is missing: scripts/test always makes it first.
#   run.sh BUILD PYTEST_ARGS...            python/tests (pytest)
#   run.sh BUILD --torch PROGRAM.py ARGS...  one program of python/tests/torch (hsdp.torch's
#                                          tests); under mpirun it is one rank
set -uo pipefail
build=$1
shift
py=$build/pyenv/bin/python
root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export HSDP_BUILD_DIR=$build
if [ "${1:-}" = "--torch" ]; then
  shift
  # find_spec, not import: importing torch costs each rank seconds of CPU (a broken install
  # still fails the test, in the program's own import).
  if [ ! -x "$py" ] || ! "$py" -c "import importlib.util as u, sys
sys.exit(not (u.find_spec('hsdp') and u.find_spec('torch')))" 2>/dev/null; then
    echo "torch tests: no hsdp or torch in $build/pyenv (run scripts/python-env); skipped"
    exit 77
  fi
  export PYTHONPATH="$root/python/tests/torch${PYTHONPATH:+:$PYTHONPATH}"
  # One compute thread per rank (ranks share the machine's cores), as the benchmarks run.
  export OMP_NUM_THREADS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
  cd "$root/python/tests/torch" || exit 1
  exec "$py" "$@"
fi
if [ ! -x "$py" ] || ! "$py" -c "import hsdp" 2>/dev/null; then
  echo "python tests: no hsdp package in $build/pyenv (run scripts/python-env); skipped"
  exit 77
fi
cd "$root/python/tests" || exit 1
exec "$py" -m pytest -q -p no:cacheprovider "$@"
