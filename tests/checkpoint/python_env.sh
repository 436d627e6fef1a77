#!/usr/bin/env bash
# A Python environment with the `safetensors` package (and numpy) under the build tree, for the
# tests that read hsdp's exports with another implementation. Exit 77 (ctest: skipped) with a
# clear message when PyPI cannot be reached.
#   python_env.sh VENV_DIR
set -u
venv=$1
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import safetensors, numpy" 2>/dev/null; then
  echo "python_env: $venv has safetensors and numpy"; exit 0
fi
python3 -m venv "$venv" || { echo "python_env: SKIP: python3 -m venv failed"; exit 77; }
if ! timeout 240 "$venv/bin/pip" install -q --disable-pip-version-check safetensors numpy; then
  echo "python_env: SKIP: cannot install safetensors and numpy from PyPI (unreachable?)"
  rm -rf "$venv"
  exit 77
fi
"$venv/bin/python" -c "import safetensors, numpy; print('python_env: safetensors', safetensors.__version__, 'numpy', numpy.__version__)"
