#!/usr/bin/env bash
# Bad-input check for a single-process tool: passes only if PROGRAM exits with CODE (not a crash
# or a timeout) and its output contains the expected text.
#   expect_exit.sh CODE "expected text" PROGRAM [ARGS...]
set -u
code=$1; want=$2; shift 2
out=$(timeout 20 "$@" 2>&1)
rc=$?
echo "$out"
if [ "$rc" -ne "$code" ]; then echo "expect_exit: FAIL: exit code $rc, expected $code"; exit 1; fi
if ! grep -qF -- "$want" <<<"$out"; then echo "expect_exit: FAIL: output lacks '$want'"; exit 1; fi
echo "expect_exit: OK: exit $rc and '$want'"
