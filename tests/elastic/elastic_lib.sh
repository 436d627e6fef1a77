# Sourced by the elastic end-to-end tests (tests/elastic/elastic_train_test.sh, elastic_save_test.sh,
# tests/python/torch_elastic_test.sh): a work folder removed at exit (copied to $KEEP_LOGS when
# set), the launcher and any pid in pids_to_kill stopped at exit, failures counted, mpirun's
# arguments, the waits and the parity check. Sets tmp, launcher, pids_to_kill, fails, margs.
tmp=$(mktemp -d)
launcher=
pids_to_kill=()
fails=0
elastic_cleanup() {
  [ -n "$launcher" ] && kill -TERM "$launcher" 2>/dev/null
  for p in "${pids_to_kill[@]}"; do kill -9 "$p" 2>/dev/null; done
  [ -n "${KEEP_LOGS:-}" ] && cp -r "$tmp" "$KEEP_LOGS"
  rm -rf "$tmp"
}
trap elastic_cleanup EXIT
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
margs="--oversubscribe --bind-to none"
[ "$(id -u)" -eq 0 ] && margs="$margs --allow-run-as-root"

# ranks_of PATTERN GROUP RESTART [EXE]: the pids of group GROUP's ranks of restart RESTART
# (their environment says which) among the processes whose command line matches PATTERN (and
# whose executable's path matches EXE, when given: a rank that is a script's interpreter).
ranks_of() {
  local p env
  for p in $(pgrep -f "$1"); do
    env=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null) || continue
    grep -qx "HSDP_ELASTIC_GROUP_INDEX=$2" <<<"$env" || continue
    grep -qx "HSDP_ELASTIC_RESTARTS=$3" <<<"$env" || continue
    [ -z "${4:-}" ] || readlink "/proc/$p/exe" | grep -q "$4" || continue
    echo "$p"
  done
}
wait_for() {  # wait_for FILE REGEX SECONDS: until a line of FILE matches (0), or the time is up
  local i
  for ((i = 0; i < $3 * 20; ++i)); do
    grep -qaE "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
finish() {  # finish [SECONDS]: waits for the launcher (180 s at most); its exit code in $rc
  local i limit=${1:-180}
  for ((i = 0; i < limit * 10; ++i)); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$launcher" 2>/dev/null; then
    fail "hsdp-elastic still running after $limit s"
    kill -TERM "$launcher"
  fi
  wait "$launcher"
  rc=$?
  launcher=
}
expect_pass() {  # expect_pass LOG...: each of $tmp/LOG has a parity PASS line
  for f in "$@"; do
    grep -qaE "parity vs (eigen )?reference: .* PASS" "$tmp/$f" ||
      fail "$f: no parity PASS: $(grep -a -E 'parity|error|rror' "$tmp/$f" | tail -3)"
  done
}
