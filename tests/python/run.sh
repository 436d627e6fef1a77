#!/usr/bin/env bash
# Runs python/tests (pytest) in the environment scripts/python-env made (build/pyenv), against the
# build tree `$1`; the rest are pytest's arguments. Exit 77 (ctest: skipped) when that environment
# or the package in it is missing: scripts/test always makes it first.
set -uo pipefail
build=$1
shift
py=$build/pyenv/bin/python
if [ ! -x "$py" ] || ! "$py" -c "import hsdp" 2>/dev/null; then
  echo "python tests: no hsdp package in $build/pyenv (run scripts/python-env); skipped"
  exit 77
fi
export HSDP_BUILD_DIR=$build
root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root/python/tests" || exit 1
exec "$py" -m pytest -q -p no:cacheprovider "$@"
