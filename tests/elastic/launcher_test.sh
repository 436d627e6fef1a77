#!/usr/bin/env bash
# hsdp-elastic (docs/elastic_launcher.md) with a fake group program, not the engine:
#   launcher_test.sh HSDP_ELASTIC MPIRUN
# 1. 3 groups x 2 ranks under mpirun, the first run of group 1 fails: every rank sees the job's
#    variables, group 1 runs again with HSDP_ELASTIC_RESTARTS=1, exit 0, the local etcd is gone.
# 2. group 1 always fails (--max-restarts 2): exit 7 after 3 runs, the other groups are stopped.
# 2b. group 1 fails after groups 0 and 2 finished: the job is done, it is not restarted, exit 0.
# 3. SIGTERM to hsdp-elastic while the groups sleep: exit 143 within the grace, every process of
#    the job gone, etcd stopped and its directory removed.
# 4. a given --endpoint, --launcher srun (a fake srun that records its command line), host sets
#    and a spare set: the restart moves to the spare hosts; a launcher that ignores SIGTERM is
#    killed after --grace; a fake mpirun's command line (-x for every HSDP_* variable, --host).
# 5. bad flags: exit 2 naming the flag, nothing started.
# Exit 77 (skipped) only when the etcd binary is absent.
set -u
elastic=$1
mpirun=$2
if ! command -v etcd >/dev/null; then
  echo "*** SKIPPED: the etcd binary is not in PATH; hsdp-elastic's test needs it"
  echo "*** (scripts/setup installs etcd-server)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
margs="--oversubscribe --bind-to none"
[ "$(id -u)" -eq 0 ] && margs="$margs --allow-run-as-root"

# The fake group program: one line per rank and run in $out/run.<group>.<restart>.
cat >"$tmp/group.sh" <<'EOF'
#!/usr/bin/env bash
out=$1 mode=$2
g=$HSDP_ELASTIC_GROUP_INDEX r=$HSDP_ELASTIC_RESTARTS rank=${OMPI_COMM_WORLD_RANK:-x}
echo "endpoint=$HSDP_ELASTIC_ENDPOINT job=$HSDP_ELASTIC_JOB index=$g groups=$HSDP_ELASTIC_GROUPS restarts=$r rank=$rank pid=$$" >>"$out/run.$g.$r"
case $mode in
  restart) if [ "$g" = 1 ] && [ "$r" = 0 ] && [ "$rank" = 1 ]; then exit 1; fi
    # Groups 0 and 2 still run when group 1's failure is seen (a group that fails after one
    # finished is not restarted: case 2b).
    if [ "$g" = 1 ]; then sleep 0.3; else sleep 2; fi ;;
  late) [ "$g" = 1 ] && { sleep 2; exit 5; }; true ;;
  fail) [ "$g" = 1 ] && exit 7; sleep 100 & echo "pid=$!" >>"$out/run.$g.$r"; wait ;;
  sleep) sleep 100 & echo "pid=$!" >>"$out/run.$g.$r"; wait ;;
esac
EOF
chmod +x "$tmp/group.sh"

# Every pid named in the run files is gone (a zombie counts as gone).
all_gone() {
  local p s
  for p in $(cat "$1"/run.* 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2); do
    s=$(ps -o stat= -p "$p" 2>/dev/null)
    [ -n "$s" ] && [ "${s:0:1}" != Z ] && return 1
  done
  return 0
}
# The endpoint hsdp-elastic's first line names.
endpoint_of() { sed -n 's/.*coordinator \(http[^ ]*\) .*/\1/p' "$1" | head -1; }
etcd_alive() { pgrep -f -- "--listen-client-urls=$1( |\$)" >/dev/null; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# ---- 1. a failed first run of group 1 is restarted; everything ends with 0 ----------------------
out=$tmp/c1 && mkdir -p "$out"
"$elastic" --groups 3 --np 2 --job lt-$$ --launcher "$mpirun" --launcher-args "$margs" \
  -- "$tmp/group.sh" "$out" restart >"$out/log" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "case 1: exit $rc, want 0"
ep=$(endpoint_of "$out/log")
grep -q "job lt-$$, 3 groups x 2 ranks, coordinator http://127.0.0.1:[0-9]* (local etcd)" \
  "$out/log" || fail "case 1: no start line"
grep -q "group 1 exited with code 1 after [0-9.]* s; restart 1 of 3" "$out/log" ||
  fail "case 1: no restart line"
for g in 0 1 2; do
  [ "$(wc -l <"$out/run.$g.0")" -ge 1 ] || fail "case 1: group $g did not run"
  want=$([ $g = 1 ] && echo 1 || echo 0)
  runs=$(find "$out" -maxdepth 1 -name "run.$g.*" | wc -l)
  [ "$runs" -eq $((want + 1)) ] || fail "case 1: group $g ran $runs times, want $((want + 1))"
  for r in $(seq 0 "$want"); do
    while read -r line; do
      case $line in
        "endpoint=$ep job=lt-$$ index=$g groups=3 restarts=$r rank="[01]" pid="*) ;;
        *) fail "case 1: group $g run $r saw: $line" ;;
      esac
    done <"$out/run.$g.$r"
  done
done
[ "$(wc -l <"$out/run.1.1")" -eq 2 ] || fail "case 1: group 1's second run: not both ranks"
[ -n "$ep" ] || fail "case 1: no endpoint in the start line"
etcd_alive "$ep" && fail "case 1: the local etcd is still running"

# ---- 2. group 1 always fails: it gives up after 3 runs; the others are stopped ---------------------
out=$tmp/c2 && mkdir -p "$out"
"$elastic" --groups 3 --np 2 --max-restarts 2 --launcher "$mpirun" --launcher-args "$margs" \
  -- "$tmp/group.sh" "$out" fail >"$out/log" 2>&1
rc=$?
[ $rc -eq 7 ] || fail "case 2: exit $rc, want 7"
grep -q "group 1 failed 3 times; giving up (exit 7)" "$out/log" || fail "case 2: no give-up line"
grep -q "restart 2 of 2" "$out/log" || fail "case 2: no second restart"
[ -e "$out/run.1.2" ] && [ ! -e "$out/run.1.3" ] || fail "case 2: group 1's runs: $(ls "$out")"
grep -q "^pid=" "$out/run.0.0" || fail "case 2: group 0 did not start its sleep"
all_gone "$out" || fail "case 2: processes of the job are left"
ep=$(endpoint_of "$out/log")
[ -n "$ep" ] && etcd_alive "$ep" && fail "case 2: the local etcd is still running"

# ---- 2b. group 1 fails after the others finished: not restarted, the job's exit is 0 ------------
out=$tmp/c2b && mkdir -p "$out"
"$elastic" --groups 3 --np 2 --launcher "$mpirun" --launcher-args "$margs" \
  -- "$tmp/group.sh" "$out" late >"$out/log" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "case 2b: exit $rc, want 0"
grep -q "group 1 exited with code 5 after [0-9.]* s, after group [02] finished the job; not restarted" \
  "$out/log" || fail "case 2b: no line saying group 1 is not restarted: $(tail -3 "$out/log")"
[ ! -e "$out/run.1.1" ] || fail "case 2b: group 1 was restarted"

# ---- 3. SIGTERM to hsdp-elastic: everything stops within the grace, exit 143 -----------------------
out=$tmp/c3 && mkdir -p "$out"
"$elastic" --groups 3 --np 2 --grace 5 --launcher "$mpirun" --launcher-args "$margs" \
  -- "$tmp/group.sh" "$out" sleep >"$out/log" 2>&1 &
pid=$!
for _ in $(seq 100); do  # until every rank of every group sleeps
  n=$(cat "$out"/run.*.0 2>/dev/null | grep -c '^pid=')
  [ "$n" -eq 6 ] && break
  sleep 0.1
done
[ "$n" -eq 6 ] || fail "case 3: $n of 6 ranks started"
ep=$(endpoint_of "$out/log")
datadir=$(pgrep -a -f -- "--listen-client-urls=$ep( |\$)" | grep -o 'data-dir=[^ ]*' | cut -d= -f2)
[ -n "$ep" ] && etcd_alive "$ep" || fail "case 3: the local etcd ($ep) not found running"
[ -n "$datadir" ] && [ -d "$datadir" ] || fail "case 3: the local etcd's data directory not found"
t0=$(now_ms)
kill -TERM "$pid"
wait "$pid"
rc=$?
t=$(($(now_ms) - t0))
[ $rc -eq 143 ] || fail "case 3: exit $rc, want 143"
[ $t -lt 5000 ] || fail "case 3: took $t ms, the grace is 5 s"
grep -q "SIGTERM received; stopping the job" "$out/log" || fail "case 3: no stop line"
all_gone "$out" || fail "case 3: processes of the job are left"
[ -n "$ep" ] && etcd_alive "$ep" && fail "case 3: the local etcd is still running"
[ -n "$datadir" ] && [ -e "$(dirname "$datadir")" ] && fail "case 3: etcd's directory is left"

# ---- 4. a given endpoint, srun (a fake one), host sets and a spare set, SIGKILL after the grace ------
out=$tmp/c4 && mkdir -p "$out/bin"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
peer=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
etcd --name lt --data-dir "$out/etcd" --listen-client-urls "http://127.0.0.1:$port" \
  --advertise-client-urls "http://127.0.0.1:$port" --listen-peer-urls "http://127.0.0.1:$peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "lt=http://127.0.0.1:$peer" >"$out/etcd.log" 2>&1 &
etcd_pid=$!
# The fake srun: records its arguments and variables; group 0 fails twice (exit 3, then 5),
# group 1 ignores SIGTERM and sleeps.
cat >"$out/bin/srun" <<EOF
#!/usr/bin/env bash
echo "\$* | \$HSDP_ELASTIC_ENDPOINT \$HSDP_ELASTIC_GROUP_INDEX \$HSDP_ELASTIC_RESTARTS" \\
  >>"$out/srun.\$HSDP_ELASTIC_GROUP_INDEX"
if [ "\$HSDP_ELASTIC_GROUP_INDEX" = 0 ]; then  # once group 1 ignores SIGTERM
  for _ in \$(seq 100); do [ -s "$out/run.1.0" ] && break; sleep 0.1; done
  exit \$((3 + 2 * HSDP_ELASTIC_RESTARTS))
fi
trap '' TERM
echo "pid=\$\$" >>"$out/run.1.0"
sleep 100 & echo "pid=\$!" >>"$out/run.1.0"
while :; do wait; done
EOF
chmod +x "$out/bin/srun"
python3 - "http://127.0.0.1:$port/health" <<'PY'  # until etcd serves
import sys, time, urllib.request
for _ in range(150):
    try:
        if b"true" in urllib.request.urlopen(sys.argv[1], timeout=1).read(): break
    except Exception: time.sleep(0.1)
PY
"$elastic" --groups 2 --np 4 --endpoint "http://127.0.0.1:$port" --launcher "$out/bin/srun" \
  --launcher-args "--mpi=pmix -l" --group-hosts "a,b;c" --spare-hosts "d,e" --max-restarts 1 \
  --grace 1 -- prog --flag x >"$out/log" 2>&1
rc=$?
[ $rc -eq 5 ] || fail "case 4: exit $rc, want 5"
grep -q "coordinator http://127.0.0.1:$port (given)" "$out/log" || fail "case 4: no start line"
grep -q "restart 1 of 1 on spare hosts d,e" "$out/log" || fail "case 4: no move to the spare"
grep -q "group 1 did not stop within the grace; SIGKILL" "$out/log" || fail "case 4: no SIGKILL"
e="http://127.0.0.1:$port"
[ "$(sed -n 1p "$out/srun.0")" = "--ntasks 4 --mpi=pmix -l --nodelist a,b prog --flag x | $e 0 0" ] ||
  fail "case 4: group 0's first command: $(sed -n 1p "$out/srun.0")"
[ "$(sed -n 2p "$out/srun.0")" = "--ntasks 4 --mpi=pmix -l --nodelist d,e prog --flag x | $e 0 1" ] ||
  fail "case 4: group 0's second command: $(sed -n 2p "$out/srun.0")"
[ "$(cat "$out/srun.1")" = "--ntasks 4 --mpi=pmix -l --nodelist c prog --flag x | $e 1 0" ] ||
  fail "case 4: group 1's command: $(cat "$out/srun.1")"
all_gone "$out" || fail "case 4: processes of the job are left"
# mpirun's command line (a fake mpirun): -x for the contract and every HSDP_* variable, --host;
# a user's HSDP_ELASTIC_RESTARTS is replaced by the launcher's.
printf '#!/usr/bin/env bash\necho "$* | $HSDP_ELASTIC_RESTARTS" >"%s/mpirun.args"\n' "$out" \
  >"$out/bin/mpirun"
chmod +x "$out/bin/mpirun"
env -i PATH="$PATH" HSDP_ELASTIC_RESTARTS=9 HSDP_LT_MARK=1 "$elastic" --groups 1 --np 3 \
  --endpoint "$e" --launcher "$out/bin/mpirun" --launcher-args "--oversubscribe" \
  --group-hosts "h0:2,h1" -- prog a >"$out/log2" 2>&1 || fail "case 4: the fake mpirun: exit $?"
x="-x HSDP_ELASTIC_ENDPOINT -x HSDP_ELASTIC_JOB -x HSDP_ELASTIC_GROUP_INDEX -x HSDP_ELASTIC_GROUPS"
x="$x -x HSDP_ELASTIC_RESTARTS -x HSDP_LT_MARK"
[ "$(cat "$out/mpirun.args")" = "-np 3 --oversubscribe $x --host h0:2,h1 prog a | 0" ] ||
  fail "case 4: mpirun's command: $(cat "$out/mpirun.args")"
kill "$etcd_pid" && wait "$etcd_pid"

# ---- 5. bad flags: exit 2 naming the flag, nothing started --------------------------------------
bad() {  # bad <text the error holds> <flags...>
  local want=$1
  shift
  "$elastic" "$@" >"$tmp/bad.log" 2>&1
  local rc=$?
  [ $rc -eq 2 ] || fail "bad input $*: exit $rc, want 2"
  grep -qF -- "$want" "$tmp/bad.log" || fail "bad input $*: no '$want' in: $(cat "$tmp/bad.log")"
  grep -q "coordinator" "$tmp/bad.log" && fail "bad input $*: something was started"
}
bad "--groups 0 must be positive" --groups 0 --np 2 -- true
bad "--np 0 must be positive" --groups 2 --np 0 -- true
bad "--groups is required" --np 2 -- true
bad "no program to run" --groups 2 --np 2
bad "no program to run" --groups 2 --np 2 --
bad "--group-hosts 'a;b;c' names 3 host sets; --groups is 2" --groups 2 --np 2 \
  --group-hosts "a;b;c" -- true
bad "--group-hosts 'a;;b': host set 2 is empty" --groups 2 --np 2 --group-hosts "a;;b" -- true
bad "--group-hosts set 1 'a,,b': element 2 is empty" --groups 2 --np 2 --group-hosts "a,,b;c" -- true
bad "--spare-hosts 'd;e f': 'e f' in host set 2" --groups 2 --np 2 --spare-hosts "d;e f" -- true
bad "--max-restarts -1 must be >= 0" --groups 2 --np 2 --max-restarts -1 -- true
bad "--max-restarts 'x' is not an integer" --groups 2 --np 2 --max-restarts x -- true
bad "--launcher 'torchrun' is not mpirun or srun" --groups 2 --np 2 --launcher torchrun -- true
bad "--job 'a/b' is not a job name" --groups 2 --np 2 --job a/b -- true
bad "--endpoint 'localhost:2379' is not an etcd URL" --groups 2 --np 2 --endpoint localhost:2379 \
  -- true
bad "--endpoint 'http://127.0.0.1:1' does not answer" --groups 2 --np 2 \
  --endpoint http://127.0.0.1:1 -- true
# A job-local etcd's directory that cannot be made (not there, a file): named, exit non-zero,
# nothing started and nothing left.
for d in "$tmp/no/such/dir" /etc/hostname; do
  HSDP_ETCD_DIR=$d "$elastic" --groups 1 --np 1 -- true >"$tmp/bad.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] || fail "HSDP_ETCD_DIR=$d: exit 0"
  grep -qF "HSDP_ETCD_DIR='$d'" "$tmp/bad.log" || fail "HSDP_ETCD_DIR=$d not named: $(cat "$tmp/bad.log")"
  grep -q "group 0 started" "$tmp/bad.log" && fail "HSDP_ETCD_DIR=$d: a group was started"
done
[ -e "$tmp/no" ] && fail "HSDP_ETCD_DIR: a directory was made"

if [ $fails -ne 0 ]; then
  echo "launcher_test: $fails check(s) failed; the logs:"
  for f in "$tmp"/c*/log; do echo "== $f"; cat "$f"; done
  exit 1
fi
echo "launcher_test: all checks passed"
