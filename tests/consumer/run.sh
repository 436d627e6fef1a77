#!/usr/bin/env bash
# The consumer test (ctest: consumer.*): hsdp as a package a user builds on.
#   1. cmake --install the build tree into a temporary prefix; nothing installed may point back
#      into the build or source tree;
#   2. configure and build tests/consumer (a project of its own) with find_package(hsdp) and
#      run its programs under mpirun: tied_frozen_model against its closed form on 1, 3 and 4
#      ranks (zero3, zero2, zero1, none; virtual nodes 2 x 2 with inter_shard 2), attach_app on
#      an MPI the application initialised (with and without the progress thread), and
#      docs/api.md's first program as written there, its output checked against the data it
#      learns from (the first loss in closed form, the learned parameters the teacher's);
#      train_mlp built from examples/ on the installed package (public headers, hsdp::hsdp and
#      hsdp::cli: COMPONENTS CLI) and run with --check on 2 ranks; with CUDA, train_mlp_gpu
#      the same way (and the CUDA runtime) on one rank (exit 77, skipped, without a device);
#   docs/api.md names every installed public header;
#   3. find_package's version and components: CUDA found exactly when hsdp was built with it, CLI
#      found (hsdp's programs build on it, so this build has it),
#      an unknown component and a newer version refused with a message that names them;
#   4. pkg-config: a program compiled and linked with `pkg-config --cflags --libs hsdp`.
#
#   run.sh BUILD_DIR MPIRUN [MPIRUN_FLAGS...]
set -euo pipefail
build=$(cd "$1" && pwd)
mpirun=$2
shift 2
mpiflags=("$@")
src=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/hsdp-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() { echo "consumer: FAIL: $*" >&2; exit 1; }
step() { echo "consumer: $*"; }

step "installing into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
for f in include/hsdp/sharded_model.h include/hsdp/version.h include/hsdp/nccl.h \
         include/hsdp/cli.h include/hsdp/flags.h \
         lib/cmake/hsdp/hsdpConfig.cmake lib/cmake/hsdp/hsdpConfigVersion.cmake \
         lib/cmake/hsdp/hsdpTargets.cmake lib/cmake/hsdp/hsdpCliTargets.cmake \
         lib/pkgconfig/hsdp.pc bin/hsdp-env bin/hsdp-plan; do
  [ -e "$prefix/$f" ] || fail "the install lacks $f"
done
ls "$prefix"/lib/libhsdp.* >/dev/null 2>&1 || fail "the install lacks libhsdp"
if grep -rlF -e "$build" -e "$src" "$prefix/lib/cmake" "$prefix/lib/pkgconfig" "$prefix/include"; then
  fail "installed files above name the build or source tree"
fi
built_with_cuda=$(sed -n 's/^#define HSDP_BUILT_WITH_CUDA \([01]\)$/\1/p' "$prefix/include/hsdp/version.h")
[ -n "$built_with_cuda" ] || fail "hsdp/version.h has no HSDP_BUILT_WITH_CUDA"

# docs/api.md's first program: its first cpp block, as written (in "## Bring your own model").
awk '/^## / {sec=$0} /^```cpp/ {inb=1; where=sec; next} inb && /^```/ {exit}
     inb {print} END {if (where != "## Bring your own model") exit 1}' \
    "$src/docs/api.md" >"$work/api_example.cc" ||
  fail "docs/api.md's first cpp block is not in its '## Bring your own model' section"
[ -s "$work/api_example.cc" ] || fail "no example program found in docs/api.md"

# docs/api.md's "Public headers" table names every installed header, and no other.
for h in "$prefix"/include/hsdp/*.h; do
  grep -qF "| \`${h##*/}\` |" "$src/docs/api.md" || fail "docs/api.md does not list hsdp/${h##*/}"
done
for h in $(sed -n 's/^| `\([a-z0-9_]*\.h\)` |.*/\1/p' "$src/docs/api.md"); do
  [ -e "$prefix/include/hsdp/$h" ] || fail "docs/api.md lists hsdp/$h, which is not installed"
done

step "configuring and building tests/consumer against the install"
# The build tree must not be found by accident: only the prefix is on the search path.
# Release at -O1, as hsdp's own tests build: what is checked is that the package builds and links
# and the programs' results, none of which needs -O3's compile time (the examples' sources).
cmake -S "$src/tests/consumer" -B "$work/app" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
      -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
      -DHSDP_API_EXAMPLE="$work/api_example.cc" -DHSDP_EXAMPLES_DIR="$src/examples" \
      >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
grep -q "consumer: hsdp .* from $prefix/lib/cmake/hsdp" "$work/configure.log" ||
  { cat "$work/configure.log"; fail "find_package did not find the installed package"; }
cmake --build "$work/app" -j 2 >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }

run() {  # run NP RPN PROGRAM ARGS...
  local np=$1 rpn=$2
  shift 2
  local env=()
  [ "$rpn" = 0 ] || env=(-x HSDP_RANKS_PER_NODE="$rpn")
  step "mpirun -np $np ${env[*]} ${*##*/}"
  "$mpirun" "${mpiflags[@]}" -np "$np" "${env[@]}" "$@" || fail "${*##*/} on $np ranks"
}
run 3 0 "$work/app/tied_frozen_model" --mode zero3 --steps 4
run 4 2 "$work/app/tied_frozen_model" --mode zero3 --inter-shard 2 --steps 3
run 4 2 "$work/app/tied_frozen_model" --mode zero2 --steps 3
run 3 0 "$work/app/tied_frozen_model" --mode zero1 --steps 2
run 1 0 "$work/app/tied_frozen_model" --mode none --steps 3
run 4 0 "$work/app/attach_app"
run 3 0 -x HSDP_PROGRESS_THREAD=1 "$work/app/attach_app"

# docs/api.md's program learns y = w.x + b from a teacher (w_j = 0.1 (j+1), j < 16; b = 0.5) on
# data each rank draws (x_ij = sin(0.7 g + 1.3 j + 0.1 g j), g the global sample index). The
# truth here is this test's own: the first loss (parameters zero) in closed form, the learned
# parameters the teacher's (the minimum of a noiseless least-squares problem), the loss 10^4
# lower at the end.
step "mpirun -np 4 -x HSDP_RANKS_PER_NODE=2 api_example"
api_out=$("$mpirun" "${mpiflags[@]}" -np 4 -x HSDP_RANKS_PER_NODE=2 "$work/app/api_example") ||
  fail "api_example on 4 ranks"
echo "$api_out"
want0=$(awk 'BEGIN { R = 4; N = 32; D = 16; s = 0
  for (r = 0; r < R; r++) for (i = 0; i < N; i++) {
    g = r * N + i; y = 0.5
    for (j = 0; j < D; j++) y += 0.1 * (j + 1) * sin(0.7 * g + 1.3 * j + 0.1 * g * j)
    s += 0.5 * y * y }
  printf "%.6f", s / (R * N) }')
first=$(echo "$api_out" | awk '$1 == "step" && $2 == 0 {print $4}')
last=$(echo "$api_out" | awk '$1 == "step" && $2 == 199 {print $4}')
awk -v a="$first" -v w="$want0" 'BEGIN {d = a - w; exit !(a != "" && d * d < (0.01 * w) ^ 2)}' ||
  fail "api_example: first loss '$first', closed form $want0"
awk -v a="$first" -v b="$last" 'BEGIN {exit !(b != "" && b < a * 1e-4)}' ||
  fail "api_example: the loss did not fall 10^4 ($first -> $last)"
echo "$api_out" | awk '$1 == "param" { n++; want = $2 < 16 ? 0.1 * ($2 + 1) : 0.5
                                         d = $3 - want; if (d * d > 1e-6) bad++ }
                       END {exit !(n == 17 && bad == 0)}' ||
  fail "api_example: the learned parameters are not the teacher's to 1e-3"

# hsdp's MLP example on the installed package, checked against its reference.
run 2 0 "$work/app/train_mlp" --steps 3 --check

if [ "$built_with_cuda" = 1 ]; then
  [ -x "$work/app/train_mlp_gpu" ] || fail "train_mlp_gpu was not built against the CUDA install"
  # One rank: the parity run where a device is visible, exit 77 (skip) where none is.
  step "mpirun -np 1 train_mlp_gpu --steps 3 --check"
  rc=0
  "$mpirun" "${mpiflags[@]}" -np 1 "$work/app/train_mlp_gpu" --steps 3 --check || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || fail "train_mlp_gpu on 1 rank: exit $rc"
fi

step "find_package versions and components"
components() {  # components VERSION COMPONENTS -> configure log in $work/comp.log, status
  rm -rf "$work/comp"
  cmake -S "$src/tests/consumer/components" -B "$work/comp" -G Ninja \
        -DCMAKE_PREFIX_PATH="$prefix" -DWANT_VERSION="$1" -DWANT_COMPONENTS="$2" \
        >"$work/comp.log" 2>&1
}
if [ "$built_with_cuda" = 1 ]; then
  components 0.2 CUDA || { cat "$work/comp.log"; fail "COMPONENTS CUDA refused by a CUDA build"; }
else
  if components 0.2 CUDA; then fail "COMPONENTS CUDA accepted by a build without CUDA"; fi
  grep -q "built without CUDA" "$work/comp.log" || { cat "$work/comp.log"; fail "no reason given"; }
fi
components 0.2 CLI || { cat "$work/comp.log"; fail "COMPONENTS CLI refused by a build with CLI11"; }
if components 0.2 NoSuchPart; then fail "an unknown component was accepted"; fi
grep -q "no component 'NoSuchPart'" "$work/comp.log" || { cat "$work/comp.log"; fail "unknown component not named"; }
if components 9.0 ""; then fail "version 9.0 was accepted"; fi
grep -q "9.0" "$work/comp.log" || { cat "$work/comp.log"; fail "refused version not named"; }

step "pkg-config"
cat >"$work/pc.cc" <<'CC'
#include <cstdio>
#include <cstring>
#include "hsdp/version.h"
int main() { std::printf("%s\n", hsdp::version()); return std::strcmp(hsdp::version(), HSDP_VERSION_STRING); }
CC
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs hsdp) ||
  fail "pkg-config hsdp"
# shellcheck disable=SC2086
c++ -std=c++20 "$work/pc.cc" -o "$work/pc" $flags || fail "compile and link with: $flags"
"$work/pc" || fail "the pkg-config program reports another version"
echo "consumer: PASS"
