#!/usr/bin/env bash
# Runs an MPI program that fails on purpose and checks how the job ended:
#   expect_fault.sh --np N [--rc CODE] [--within SECONDS] [--every TEXT] [--skip-rank R]
#                   [--some REGEX] [--none REGEX] -- PROGRAM [ARGS...]
#   --rc CODE       the job's exit code (default 3)
#   --within S      the job ends within S seconds of the fault: of the line
#                   "fault_program [rank R]: stopping at <unix time>" when the program prints one,
#                   else of the start
#   --every TEXT    every rank (but --skip-rank) prints a line "hsdp [rank r]: ..." holding TEXT
#   --some REGEX    at least one output line matches (grep -E)
#   --none REGEX    no output line matches
# Always: the job does not time out, no process of it is left afterwards (PROGRAM gets a last
# argument pair "--tag <unique>" to be found by), and no watchdog segment (/dev/shm/hsdp-wd-*)
# is left. HSDP_* variables of this environment go to every rank. Exit 77 (skipped) when
# PROGRAM says it skipped (no CUDA device).
set -u
np=; want_rc=3; within=60; every=; skip=-1; some=(); none=()
while [ $# -gt 0 ]; do
  case $1 in
    --np) np=$2; shift 2 ;;
    --rc) want_rc=$2; shift 2 ;;
    --within) within=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --skip-rank) skip=$2; shift 2 ;;
    --some) some+=("$2"); shift 2 ;;
    --none) none+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "expect_fault: unknown argument $1"; exit 2 ;;
  esac
done
[ -n "$np" ] && [ $# -ge 1 ] || { echo "expect_fault: usage: --np N ... -- PROGRAM"; exit 2; }
tag=xf$$-$RANDOM
mpirun=${MPIEXEC:-mpirun}
xargs=()
for v in $(env | grep -o '^HSDP_[A-Z_]*'); do xargs+=(-x "$v"); done
shm_before=$(ls /dev/shm 2>/dev/null | grep '^hsdp-wd-' | sort)
out=$(mktemp)
t0=$(date +%s.%N)
timeout -k 5 $((within + 60)) "$mpirun" --oversubscribe --bind-to none -np "$np" "${xargs[@]}" "$@" --tag "$tag" >"$out" 2>&1
rc=$?
t1=$(date +%s.%N)
cat "$out"
fail() { echo "expect_fault: FAIL: $*"; rm -f "$out"; exit 1; }
if grep -q "no CUDA device, skipped\|built without CUDA, skipped" "$out"; then
  echo "expect_fault: SKIP (no CUDA device)"; rm -f "$out"; exit 77
fi
[ $rc -eq 124 ] || [ $rc -eq 137 ] && fail "the job hung (killed by timeout)"
[ "$rc" -eq "$want_rc" ] || fail "exit code $rc, expected $want_rc"
start=$(sed -n 's/^fault_program \[rank [0-9]*\]: stopping at \([0-9.]*\)$/\1/p' "$out" | head -1)
[ -n "$start" ] || start=$t0
took=$(awk -v a="$start" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
awk -v t="$took" -v w="$within" 'BEGIN { exit !(t <= w) }' || fail "took ${took} s after the fault, limit ${within} s"
if [ -n "$every" ]; then
  for ((r = 0; r < np; r++)); do
    [ "$r" -eq "$skip" ] && continue
    grep -F "hsdp [rank $r]: " "$out" | grep -qF -- "$every" || fail "rank $r printed no line with '$every'"
  done
fi
for re in "${some[@]}"; do grep -qE -- "$re" "$out" || fail "no line matches '$re'"; done
for re in "${none[@]}"; do grep -qE -- "$re" "$out" && fail "a line matches '$re'"; done
grep -qE 'Backtrace|Segmentation|core dumped' "$out" && fail "crash trace in output"
for i in $(seq 20); do pgrep -f -- "--tag $tag" >/dev/null || break; sleep 0.1; done
pgrep -af -- "--tag $tag" && fail "processes of the job are left"
# Only segments that are new since the start and still there a moment later count: jobs of other
# tests running beside this one create theirs and remove them within their start-up.
shm_new() { comm -13 <(echo "$shm_before") <(ls /dev/shm 2>/dev/null | grep '^hsdp-wd-' | sort); }
left=$(shm_new)
if [ -n "$left" ]; then
  sleep 2
  left=$(comm -12 <(echo "$left") <(shm_new))
fi
[ -z "$left" ] || fail "watchdog segments left in /dev/shm: $left"
echo "expect_fault: OK: exit $rc, ${took} s after the fault"
rm -f "$out"
exit 0
