#!/usr/bin/env bash
# `pip wheel ./python` against this build's libhsdp (build/install, as scripts/python-env uses it;
# CMake's build tree pyproject.toml's build/python-pip/<wheel tag>, which scripts/python-env built:
# nothing compiles again): the wheel holds the extension, its type stubs,
# py.typed and the package's Python files, and, installed on its own, `import hsdp` plans a job.
# Then `pip install ./python` with pyproject's own build-dir writes nothing into the source tree.
# Exit 77 without build/pyenv.
set -uo pipefail
build=$1
root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=$build/pyenv/bin/python
[ -x "$py" ] || { echo "no $build/pyenv (run scripts/python-env); skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip --disable-pip-version-check -q wheel --no-build-isolation --no-deps "$root/python" \
  -w "$tmp/dist" -Ccmake.define.hsdp_DIR="$build/install/lib/cmake/hsdp" ||
  { echo "FAIL: pip wheel"; exit 1; }
whl=$(ls "$tmp"/dist/hsdp-*.whl) || { echo "FAIL: no wheel"; exit 1; }
"$py" - "$whl" <<'PY' || exit 1
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
want = {"hsdp/__init__.py", "hsdp/_errors.py", "hsdp/checkpoint.py", "hsdp/collectives.py",
        "hsdp/topology.py", "hsdp/_hsdp.pyi", "hsdp/py.typed"}
missing = sorted(want - names)
ext = [n for n in names if n.startswith("hsdp/_hsdp.") and n.endswith(".so")]
if missing or not ext:
    print("FAIL: the wheel lacks", missing or "the extension", "; it has", sorted(names))
    sys.exit(1)
print("wheel:", sys.argv[1].rsplit("/", 1)[1], len(names), "files")
PY
# Installed on its own (pip install --target), it is the hsdp that imports, and it works.
"$py" -m pip --disable-pip-version-check -q install --no-deps --no-index --target "$tmp/site" \
  "$whl" || { echo "FAIL: pip install of the wheel"; exit 1; }
PYTHONPATH=$tmp/site "$py" -c "
import hsdp, os
assert os.path.dirname(hsdp.__file__) == os.path.join('$tmp/site', 'hsdp'), hsdp.__file__
print(hsdp.plan(params=7.5e9, nodes=2, gpus_per_node=8, intra_shard=8))" || { echo "FAIL: import"; exit 1; }
# `pip install ./python` as README shows it (pyproject's own build-dir) leaves nothing in the
# source tree: its build tree goes under build/ (issue 43: a build tree in python/build/ once
# broke the layering check). The tree is scripts/python-env's (configured there from a clean
# build/ in CI), so this re-runs CMake and links nothing new: what is checked is where the
# install writes, not a second compile of the extension.
stamp=$tmp/stamp
touch "$stamp"
sleep 1
"$py" -m pip --disable-pip-version-check -q install --no-build-isolation --no-deps \
  --target "$tmp/site2" "$root/python" -Ccmake.define.hsdp_DIR="$build/install/lib/cmake/hsdp" \
  || { echo "FAIL: pip install ./python"; exit 1; }
left=$(find "$root/python" -newer "$stamp" -not -path '*/__pycache__*' | head -5)
[ -z "$left" ] || { echo "FAIL: pip install ./python left in the source tree: $left"; exit 1; }
[ ! -e "$root/python/build" ] || { echo "FAIL: python/build exists"; exit 1; }
echo "PASS"
