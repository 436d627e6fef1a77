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
# whose executable's path matches EXE, when given: a rank that is a script's interpreter). With
# elastic_job set, only the ranks of that job (HSDP_ELASTIC_JOB): other elastic tests may run
# the same program beside this one.
ranks_of() {
  local p env
  for p in $(pgrep -f "$1"); do
    env=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null) || continue
    [ -z "${elastic_job:-}" ] || grep -qx "HSDP_ELASTIC_JOB=$elastic_job" <<<"$env" || continue
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

# etcd_cluster_start N DIR: N etcd members on 127.0.0.1 (a client and a peer port each, one
# --initial-cluster), their data and logs under DIR, stopped at exit (pids_to_kill). Sets
# etcd_urls (the comma list), etcd_url (an array, member k's URL), etcd_pid (an array). Returns 1
# when they do not all answer a linearizable read (a leader elected) within 20 s.
etcd_cluster_start() {
  local n=$1 dir=$2 k i ports initial=
  ports=$(python3 -c "import socket
s=[socket.socket() for _ in range(2*$n)]
[x.bind(('127.0.0.1',0)) for x in s]
print(' '.join(str(x.getsockname()[1]) for x in s))")
  read -r -a ports <<<"$ports"
  etcd_url=() etcd_pid=() etcd_urls=
  for ((k = 0; k < n; ++k)); do
    initial+="${initial:+,}m$k=http://127.0.0.1:${ports[$((2 * k + 1))]}"
    etcd_url+=("http://127.0.0.1:${ports[$((2 * k))]}")
    etcd_urls+="${etcd_urls:+,}${etcd_url[$k]}"
  done
  for ((k = 0; k < n; ++k)); do
    etcd --name "m$k" --data-dir "$dir/m$k" --listen-client-urls "${etcd_url[$k]}" \
      --advertise-client-urls "${etcd_url[$k]}" \
      --listen-peer-urls "http://127.0.0.1:${ports[$((2 * k + 1))]}" \
      --initial-advertise-peer-urls "http://127.0.0.1:${ports[$((2 * k + 1))]}" \
      --initial-cluster "$initial" --initial-cluster-state new --pre-vote=true >"$dir/m$k.log" 2>&1 &
    etcd_pid+=($!)
    pids_to_kill+=($!)
    disown $!  # killed on purpose by the tests: no "Killed" line from this shell
  done
  for ((k = 0; k < n; ++k)); do
    for ((i = 0; i < 200; ++i)); do
      curl -sf -m 1 -X POST -d '{"key":"aA=="}' "${etcd_url[$k]}/v3/kv/range" >/dev/null && break
      sleep 0.1
    done
    [ "$i" -lt 200 ] || { echo "etcd member $k did not answer: $(tail -3 "$dir/m$k.log")"; return 1; }
  done
}
# etcd_get URLS KEY: KEY's value (decoded) read through the first member of URLS that answers.
etcd_get() {
  local u key64
  key64=$(printf '%s' "$2" | base64 -w0)
  for u in ${1//,/ }; do
    curl -sf -m 3 -X POST -d "{\"key\":\"$key64\"}" "$u/v3/kv/range" |
      python3 -c 'import base64,json,sys
kv=json.load(sys.stdin).get("kvs",[])
print(base64.b64decode(kv[0]["value"]).decode() if kv else "")' && return 0
  done
  return 1
}
# show_logs DIR: the launcher's log and the lines of each group's rank 0 that tell what happened.
show_logs() {
  local f
  echo "--- launcher"
  cat "$1/launcher.log"
  for f in "$1"/g*.rank0.log; do
    echo "--- $(basename "$f")"
    grep -aE "elastic|parity|rror" "$f" | cut -c1-400 | tail -8
  done
}
# verdict NAME: exits 1 after the logs when a check failed, else prints "NAME: OK".
verdict() {
  if [ "$fails" -ne 0 ]; then
    show_logs "$tmp"
    echo "$1: $fails failure(s)"
    exit 1
  fi
  echo "$1: OK"
}
