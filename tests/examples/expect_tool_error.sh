#!/usr/bin/env bash
# Bad-input check for a program run without mpirun: passes only if it exits 2 within 30 s and
# prints "<program>: error: " followed by text containing the expected text (the project's style,
# CLI11's own errors included), and no crash trace.
#   expect_tool_error.sh PROGRAM_NAME "expected text" PROGRAM [ARGS...]
set -u
name=$1; want=$2; shift 2
out=$(timeout 30 "$@" 2>&1)
rc=$?
echo "$out"
if [ $rc -eq 124 ]; then echo "expect_tool_error: FAIL: timed out"; exit 1; fi
if [ $rc -ne 2 ]; then echo "expect_tool_error: FAIL: exit code $rc, expected 2"; exit 1; fi
if ! echo "$out" | grep -F -- "$name: error: " | grep -q -F -- "$want"; then
  echo "expect_tool_error: FAIL: no '$name: error: ...$want' line"; exit 1
fi
echo "expect_tool_error: OK: exit 2, '$name: error: ...$want'"
