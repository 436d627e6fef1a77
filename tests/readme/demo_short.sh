#!/usr/bin/env bash
# scripts/demo as README.md shows it, at 3 steps instead of its 30 (ctest readme.demo): the real
# script, train_gpt at the demo's defaults (the small preset, 8 ranks as 2 virtual nodes x 4,
# zero3 4 x 1, eval, a 160-byte sample, --check), in a scratch tree whose scripts/setup does
# nothing (scripts/test's setup phase ran it) and whose build/ is this build. The output must hold
# what README.md's "What the demo shows" lists. readme.commands skips the 30-step `scripts/demo`:
# the same run with 27 more steps of the same code took 171 s of CPU against 42 s here, and
# readme.demo_args checks the command line the demo builds from its defaults.
#   demo_short.sh REPO BUILD_DIR
set -euo pipefail
repo=$(cd -P "$1" && pwd)
build=$(cd -P "$2" && pwd)
tree=$(mktemp -d "${TMPDIR:-/tmp}/hsdp-demo.XXXXXX")
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/scripts"
ln -s "$repo/scripts/demo" "$repo/scripts/mpirun-local" "$tree/scripts/"
printf '#!/usr/bin/env bash\nexit 0\n' >"$tree/scripts/setup"
chmod +x "$tree/scripts/setup"
ln -s "$build" "$tree/build"
rc=0
out=$("$tree/scripts/demo" --steps 3 2>&1) || rc=$?
echo "$out"
[ "$rc" = 0 ] || { echo "demo: FAIL: scripts/demo --steps 3 exited $rc"; exit 1; }
for want in '8 ranks = 2 nodes x 4; intra_shard 4 x inter_shard 1' '^ *split:' '^ *bytes:' \
            'val loss .* after step 3' 'model state per rank' 'sample (160 tokens' \
            '^parity vs reference: max_rel_err=.* PASS$'; do
  grep -q -- "$want" <<<"$out" || { echo "demo: FAIL: no line matching '$want'"; exit 1; }
done
echo "demo: PASS"
