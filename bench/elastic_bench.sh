#!/usr/bin/env bash
# The elastic benchmark (docs/elastic.md, docs/elastic_launcher.md): train_mlp zero3 as 3 replica
# groups x 2 ranks on this machine, medians of REPEATS runs, one table at the end:
#   1. steady-state step time, elastic off (one 6-rank mpirun, 3 replicas of a 2-rank shard
#      group) vs on (hsdp-elastic --groups 3 --np 2, the same global batch): the median of the
#      time_ms column over the steps after the first 5 (group 0's rows), and the wall time between
#      consecutive rows (which also holds what time_ms does not: beginStep's quorum);
#   2. kill -9 of one rank of group 1 after it printed step 10: seconds from the kill to group 0's
#      first step row after it and to its first row without group 1 (after "groups 0,2 present"),
#      the rows it printed between the kill and that line, and that line's attempt number (the
#      attempts of the step aborted: the work lost);
#   3. the heal of the restarted group 1 on a bigger model (--heal-dims; killed after step 3):
#      bytes per rank, seconds and GB/s as the engine prints them (each rank of the group heals
#      from its same-position peer at once: 2 streams), the time from the kill to that line,
#      against one loopback TCP stream of 256 MiB (python3 sockets) right after each such run;
#   4. restart from a checkpoint side by side: the 6-rank mpirun with --save-dir --save-every 5,
#      one rank killed after step 12, a fresh mpirun --resume: seconds from the kill to its step
#      13, vs the elastic runs of 2 from the kill to group 0's step 13 (3 steps after each kill).
# Every time is taken from timestamps rank 0's lines get as they are written (a python3 reader
# on its stdout); the bench polls the logs every 10 ms. Every process a run starts is stopped at
# its end (and on any exit: trap): hsdp-elastic with SIGTERM (it stops its groups and its local
# etcd), mpirun by its session. Needs mpirun, etcd and python3. ~4-5 min with the defaults.
#   bench/elastic_bench.sh [--repeats N] [--steps N] [--dims LIST] [--heal-dims LIST] [--build DIR]
#                          [--logs DIR]
set -uo pipefail
usage() {
  sed -n '2,/^#   bench/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
  cat <<'EOF'
Flags:
  --repeats N        runs per number, 1..99 (default 3); each number is their median
  --steps N          steps of the steady-state runs, 10..100000 (default 30)
  --dims LIST        train_mlp --dims of items 1, 2 and 4 (default 64,1024,1024,10)
  --heal-dims LIST   train_mlp --dims of item 3 (default 64,4096,4096,10: ~98 MiB healed per rank)
  --build DIR        the build directory (default ./build): examples/train_mlp, tools/hsdp-elastic
  --logs DIR         keep every run's logs in DIR (created; default: removed at the end)
  -h, --help         this text
EOF
}
bad() { echo "elastic_bench: $*" >&2; exit 2; }
reps=3 steps=30 dims=64,1024,1024,10 heal_dims=64,4096,4096,10 build=./build logs=
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --repeats | --steps | --dims | --heal-dims | --build | --logs)
      [ $# -ge 2 ] || bad "$1 needs a value"
      case $1 in
        --repeats) reps=$2 ;; --steps) steps=$2 ;; --dims) dims=$2 ;;
        --heal-dims) heal_dims=$2 ;; --build) build=$2 ;; --logs) logs=$2 ;;
      esac
      shift 2 ;;
    *) bad "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $reps =~ ^[1-9][0-9]?$ ]] || bad "--repeats must be 1..99 (got '$reps')"
[[ $steps =~ ^[1-9][0-9]{0,5}$ ]] && [ "$steps" -ge 10 ] && [ "$steps" -le 100000 ] ||
  bad "--steps must be 10..100000 (got '$steps')"
for d in "$dims" "$heal_dims"; do
  [[ $d =~ ^[1-9][0-9]{0,5}(,[1-9][0-9]{0,5})+$ ]] ||
    bad "$([ "$d" = "$dims" ] && echo --dims || echo --heal-dims) must be 2 or more positive sizes, comma separated (got '$d')"
done
train=$(cd "$build" 2>/dev/null && pwd)/examples/train_mlp
elastic=$(cd "$build" 2>/dev/null && pwd)/tools/hsdp-elastic
[ -x "$train" ] && [ -x "$elastic" ] ||
  bad "--build '$build' has no examples/train_mlp and tools/hsdp-elastic (ninja -C $build hsdp-elastic train_mlp)"
if [ -n "$logs" ]; then
  mkdir -p "$logs" 2>/dev/null && [ -w "$logs" ] || bad "--logs '$logs' is not a writable directory"
fi
for b in mpirun etcd python3; do command -v $b >/dev/null || bad "$b is not in PATH"; done

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
margs="--oversubscribe --bind-to none"
tmp=$(mktemp -d /tmp/elastic-bench.XXXXXX)
jobp=ebench-$$  # this run's elastic job names: $jobp-<n>
runs=0          # runs started so far (names the job and the log directory)
sessions=()     # sessions started here (setsid): mpirun jobs and hsdp-elastic
elastics=()     # hsdp-elastic pids
failed=0
# Everything this run started, by id: hsdp-elastic gets SIGTERM (it stops its groups and its
# etcd) and up to 15 s; then what is left of our sessions, of our jobs' ranks (their environment
# names the job) and of an etcd under our directory is killed.
cleanup() {
  local p s i
  for p in "${elastics[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for ((i = 0; i < 150; ++i)); do
    s=0
    for p in "${elastics[@]}"; do kill -0 "$p" 2>/dev/null && s=1; done
    [ $s = 0 ] && break
    sleep 0.1
  done
  for s in "${sessions[@]}"; do
    for p in $(ps -o pid= --sid "$s" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  done
  for p in $(grep -lzE "^HSDP_ELASTIC_JOB=$jobp-[0-9]+$" /proc/[0-9]*/environ 2>/dev/null |
    cut -d/ -f3); do kill -9 "$p" 2>/dev/null; done
  # ([-]: the pattern does not match grep's own command line)
  for p in $(grep -lzE -- "[-]-data-dir=$tmp/" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
    kill -9 "$p" 2>/dev/null
  done
  if [ -n "$logs" ]; then
    cp -r "$tmp"/. "$logs"/ && echo "elastic_bench: logs kept in $logs" >&2
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Rank 0's lines, each prefixed with the time it was read (s since the epoch, the clock of
# `date +%s.%N`), so that every step row carries when it was printed.
cat >"$tmp/ts.py" <<'EOF'
import sys, time
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    out.write(b"%.6f " % time.time() + line)
    out.flush()
EOF
# The program each rank runs: rank 0 through ts.py into P.g<group>r<restart>.log, the others into
# P.g<group>r<restart>.rank<k>.log (P: the run's log prefix; group and restart from hsdp-elastic,
# 0 for a plain mpirun job).
cat >"$tmp/rank.sh" <<EOF
#!/usr/bin/env bash
p=\$1; shift
g=\${HSDP_ELASTIC_GROUP_INDEX:-0} r=\${HSDP_ELASTIC_RESTARTS:-0} k=\${OMPI_COMM_WORLD_RANK:-0}
if [ "\$k" = 0 ]; then
  exec "\$@" > >(exec python3 -u "$tmp/ts.py" >"\$p.g\${g}r\${r}.log") 2>&1
fi
exec "\$@" >"\$p.g\${g}r\${r}.rank\$k.log" 2>&1
EOF
chmod +x "$tmp/rank.sh"

mdl=(--mode zero3 --batch 48)  # train_mlp's model flags, less --dims
now() { date +%s.%N; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "n/a"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# rows LOG: the step rows of a timestamped log as "time step time_ms", in order
rows() {
  awk 'NF == 7 && $2 ~ /^[0-9]+$/ && $5 ~ /^[0-9.]+$/ && $7 ~ /^[0-9.]+$/ { print $1, $2, $5 }' "$1" 2>/dev/null
}
# wait_row LOG STEP SECS [PID]: until LOG has the row of STEP (1: timed out or PID ended first)
has_row() { rows "$1" | awk -v s="$2" '$2 == s { f = 1 } END { exit !f }'; }
wait_row() {
  local i
  for ((i = 0; i < $3 * 100; ++i)); do
    has_row "$1" "$2" && return 0
    [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null && break
    sleep 0.01
  done
  has_row "$1" "$2"
}
# wait_grep LOG ERE SECS: until a line of LOG matches
wait_grep() {
  local i
  for ((i = 0; i < $3 * 100; ++i)); do
    grep -qaE "$2" $1 2>/dev/null && return 0  # $1 may be a glob
    sleep 0.01
  done
  return 1
}
note() { echo "elastic_bench: $*" >&2; }
fail_run() { note "$*"; failed=$((failed + 1)); }
# steady_stats LOG: the medians over the steps after the first 5 of time_ms, of the wall time
# between a row and the one before (ms), and of that wall time less the row's time_ms
steady_stats() {
  local r
  r=$(rows "$1")
  printf '%s %s %s\n' "$(awk '$2 > 5 { print $3 }' <<<"$r" | median)" \
    "$(awk '$2 > 5 && p != "" { print ($1 - p) * 1000 } { p = $1 }' <<<"$r" | median)" \
    "$(awk '$2 > 5 && p != "" { print ($1 - p) * 1000 - $3 } { p = $1 }' <<<"$r" | median)"
}
# forget PID: a session stopped and reaped, no longer for cleanup to stop
forget() {
  local a=() p
  for p in "${sessions[@]}"; do [ "$p" != "$1" ] && a+=("$p"); done
  sessions=("${a[@]}")
  a=()
  for p in "${elastics[@]}"; do [ "$p" != "$1" ] && a+=("$p"); done
  elastics=("${a[@]}")
}
new_run() { runs=$((runs + 1)); run_dir=$tmp/run$runs; mkdir -p "$run_dir"; }
# stop_session SID: SIGKILL to every process of the session (an mpirun job started with setsid)
stop_session() {
  local p
  for p in $(ps -o pid= --sid "$1" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
  wait "$1" 2>/dev/null
  forget "$1"
}
# start_mpirun LOGPREFIX ARGS...: the 6-rank job (3 replicas of a 2-rank shard group) in a session
# of its own; its pid (= the session) in $mpi_pid
start_mpirun() {
  local p=$1
  shift
  setsid mpirun $margs -np 6 -x HSDP_RANKS_PER_NODE=2 "$tmp/rank.sh" "$p" "$train" \
    --intra-shard 2 --inter-shard 1 "$@" >"$p.mpirun.log" 2>&1 </dev/null &
  mpi_pid=$!
  sessions+=("$mpi_pid")
}
# start_elastic ARGS...: hsdp-elastic, 3 groups x 2 ranks, in a session of its own ($el_pid,
# job $el_job, logs $run_dir/e.g<group>r<restart>.log); its local etcd under $tmp
start_elastic() {
  el_job=$jobp-$runs
  TMPDIR=$tmp setsid "$elastic" --groups 3 --np 2 --job "$el_job" --launcher mpirun \
    --launcher-args "$margs" --grace 3 -- "$tmp/rank.sh" "$run_dir/e" "$train" "$@" \
    >"$run_dir/launcher.out" 2>"$run_dir/launcher.log" </dev/null &
  el_pid=$!
  sessions+=("$el_pid")
  elastics+=("$el_pid")
}
# stop_elastic: SIGTERM, up to 20 s for it to stop its groups and etcd, then SIGKILL
stop_elastic() {
  local i
  kill -TERM "$el_pid" 2>/dev/null
  for ((i = 0; i < 200; ++i)); do kill -0 "$el_pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$el_pid" 2>/dev/null; then
    fail_run "hsdp-elastic (job $el_job) still running 20 s after SIGTERM; killed"
    kill -9 "$el_pid" 2>/dev/null
  fi
  wait "$el_pid" 2>/dev/null
  forget "$el_pid"
}
# el_ranks GROUP RESTART: "pid rank" of each rank of that group of this run's job
el_ranks() {
  local f p e
  for f in $(grep -lzx "HSDP_ELASTIC_JOB=$el_job" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}
    p=${p%/environ}
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = train_mlp ] || continue
    e=$(tr '\0' '\n' <"$f" 2>/dev/null) || continue
    grep -qx "HSDP_ELASTIC_GROUP_INDEX=$1" <<<"$e" && grep -qx "HSDP_ELASTIC_RESTARTS=$2" <<<"$e" &&
      echo "$p $(sed -n 's/^OMPI_COMM_WORLD_RANK=//p' <<<"$e")"
  done
}

# ---- 1. steady state, off and on, interleaved --------------------------------------------------
off_ms=() off_wall=() off_gap=() on_ms=() on_wall=() on_gap=()
header_checked=0
steady_off() {
  new_run
  start_mpirun "$run_dir/o" "${mdl[@]}" --dims "$dims" --steps "$steps"
  if ! wait_row "$run_dir/o.g0r0.log" "$steps" 300 "$mpi_pid"; then
    fail_run "off run $runs: no step $steps row (see below)"
    tail -n 5 "$run_dir/o.g0r0.log" "$run_dir/o.mpirun.log" >&2
  fi
  stop_session "$mpi_pid"
  if [ $header_checked = 0 ]; then
    grep -qa "replicas 3" "$run_dir/o.g0r0.log" ||
      fail_run "the off run's mesh is not 3 replicas: $(grep -a '^[0-9.]* mesh:' "$run_dir/o.g0r0.log")"
    header_checked=1
  fi
  read -r a b c < <(steady_stats "$run_dir/o.g0r0.log")
  off_ms+=("$a") off_wall+=("$b") off_gap+=("$c")
}
steady_on() {
  new_run
  start_elastic "${mdl[@]}" --dims "$dims" --steps "$steps"
  local i
  for ((i = 0; i < 3000; ++i)); do kill -0 "$el_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$el_pid" 2>/dev/null && fail_run "on run $runs: hsdp-elastic still running after 300 s"
  stop_elastic
  has_row "$run_dir/e.g0r0.log" "$steps" ||
    { fail_run "on run $runs: group 0 has no step $steps row"; tail -n 5 "$run_dir/launcher.log" "$run_dir/e.g0r0.log" >&2; }
  grep -aE "present|not committed" "$run_dir/e.g0r0.log" | grep -qv "groups 0,1,2 present" &&
    note "on run $runs: not every step had the 3 groups: $(grep -aE "present|not committed" "$run_dir/e.g0r0.log" | grep -v "groups 0,1,2 present" | head -1)"
  read -r a b c < <(steady_stats "$run_dir/e.g0r0.log")
  on_ms+=("$a") on_wall+=("$b") on_gap+=("$c")
}
note "1/4 steady state: $reps x (off, on), $steps steps each"
for ((rep = 0; rep < reps; ++rep)); do steady_off; steady_on; done

# ---- 2 and 3. kill -9 of a rank of group 1 ---------------------------------------------------
# kill_run DIMS KILL_STEP WHAT: starts the elastic job (steps enough never to end by itself),
# kills rank 1 of group 1 right after group 1 printed KILL_STEP ($t_kill), then, for WHAT
#   recover  waits for group 0's step 13 and the 'groups 0,2 present' line
#   heal     waits for the restarted group 1's heal line
# and stops the job. Results are read from the logs in $run_dir afterwards.
kill_run() {
  new_run
  start_elastic "${mdl[@]}" --dims "$1" --steps 100000
  t_kill=
  local victim=
  if ! wait_row "$run_dir/e.g1r0.log" 1 120 "$el_pid"; then
    fail_run "kill run $runs: group 1 never printed step 1"
  else
    victim=$(el_ranks 1 0 | awk '$2 == 1 { print $1 }')
    [ -n "$victim" ] || fail_run "kill run $runs: rank 1 of group 1 not found in /proc"
  fi
  if [ -n "$victim" ] && wait_row "$run_dir/e.g1r0.log" "$2" 120 "$el_pid"; then
    kill -9 "$victim"
    t_kill=$(now)
    echo "$t_kill kill -9 $victim (rank 1 of group 1)" >"$run_dir/kill.log"
    case $3 in
      recover)
        wait_row "$run_dir/e.g0r0.log" 13 60 && wait_grep "$run_dir/e.g0r0.log" "groups 0,2 present" 1 ||
          fail_run "kill run $runs: group 0 has no step 13 or no 'groups 0,2 present' within 60 s of the kill" ;;
      heal)
        wait_grep "$run_dir/e.g1r[1-9].log" "elastic: group 1 healed" 180 ||
          fail_run "kill run $runs: the restarted group 1 did not heal within 180 s of the kill" ;;
    esac
  elif [ -n "$victim" ]; then
    fail_run "kill run $runs: group 1 never printed step $2"
  fi
  stop_elastic
  if [ -z "$t_kill" ] || [ $failed -gt 0 ] && [ "${shown:-0}" = 0 ]; then
    shown=1
    tail -n 4 "$run_dir/launcher.log" "$run_dir"/e.g*.log >&2
  fi
}
next_commit=() rows_between=() aborted=() el_13=()
note "2/4 kill -9 of a rank of group 1 after step 10: $reps runs"
for ((rep = 0; rep < reps; ++rep)); do
  kill_run "$dims" 10 recover
  [ -n "$t_kill" ] || continue
  log=$run_dir/e.g0r0.log
  # Group 1 printed step 10 before the kill, so step 10 was committed: group 0 may still print
  # its own row of it after the kill. The survivors' next commit is their first row of a later
  # step; the rows of later steps before 'groups 0,2 present' would be commits with the dead group
  # still in the quorum; that line's attempt number A says A attempts of its step were aborted.
  read -r nc nb na n13 < <(awk -v t="$t_kill" '
    NF == 7 && $2 ~ /^[0-9]+$/ && $5 ~ /^[0-9.]+$/ && $1 > t && $2 > 10 {
      if (nc == "") nc = $1 - t
      if (!present) nb++
      if ($2 == 13 && n13 == "") n13 = $1 - t
    }
    /groups 0,2 present/ && $1 > t && !present { present = 1; na = $6 + 0 }
    END { print (nc == "" ? "n/a" : nc), (present ? nb + 0 : "n/a"), (present ? na : "n/a"),
                (n13 == "" ? "n/a" : n13) }' "$log")
  next_commit+=("$nc") rows_between+=("$nb") aborted+=("$na") el_13+=("$n13")
done

# One TCP stream of 256 MiB over loopback, sender and receiver in two processes: GB/s (1e9).
loopback() {
  python3 - <<'EOF'
import os, socket, time
n = 256 << 20
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
if os.fork() == 0:
    c = socket.create_connection(srv.getsockname())
    c.sendall(bytearray(n))
    c.close()
    os._exit(0)
conn, _ = srv.accept()
buf = memoryview(bytearray(4 << 20))
got, t0 = 0, time.perf_counter()
while got < n:
    k = conn.recv_into(buf)
    if k == 0:
        break
    got += k
t1 = time.perf_counter()
os.wait()
print("%.3f" % (got / (t1 - t0) / 1e9) if got == n else "n/a")
EOF
}
note "3/4 heal on --dims $heal_dims (kill after step 3), each run followed by a loopback TCP stream: $reps runs"
heal_b=() heal_t=() heal_r=() heal_after=() loop_r=()
for ((rep = 0; rep < reps; ++rep)); do
  kill_run "$heal_dims" 3 heal
  loop_r+=("$(loopback)")
  line=$(grep -ahE "elastic: group 1 healed to step" "$run_dir"/e.g1r[1-9].log 2>/dev/null | head -1)
  [[ $line =~ ^([0-9.]+)\ .*:\ ([0-9]+)\ bytes\ per\ rank\ in\ ([0-9.]+)\ s\ \(([0-9.]+)\ GB/s\) ]] || continue
  heal_after+=("$(awk -v a="$t_kill" -v b="${BASH_REMATCH[1]}" 'BEGIN { print b - a }')")
  heal_b+=("${BASH_REMATCH[2]}") heal_t+=("${BASH_REMATCH[3]}") heal_r+=("${BASH_REMATCH[4]}")
done

# ---- 4. restart from a checkpoint ------------------------------------------------------------
note "4/4 restart from a checkpoint (kill after step 12, --resume): $reps runs"
ckpt_13=() ckpt_down=()
for ((rep = 0; rep < reps; ++rep)); do
  new_run
  ck=(--save-dir "$run_dir/ckpt" --save-every 5 --steps 100000)
  start_mpirun "$run_dir/c1" "${mdl[@]}" --dims "$dims" "${ck[@]}"
  victim=
  wait_row "$run_dir/c1.g0r0.log" 1 120 "$mpi_pid" &&
    victim=$(ps -o pid=,comm= --sid "$mpi_pid" | awk '$2 == "train_mlp" { p = $1 } END { print p }')
  if [ -z "$victim" ] || ! wait_row "$run_dir/c1.g0r0.log" 12 120 "$mpi_pid"; then
    fail_run "checkpoint run $runs: no step 12 row, or no rank found"
    tail -n 5 "$run_dir/c1.g0r0.log" "$run_dir/c1.mpirun.log" >&2
    stop_session "$mpi_pid"
    continue
  fi
  kill -9 "$victim"
  t_kill=$(now)
  echo "$t_kill kill -9 $victim" >"$run_dir/kill.log"
  for ((i = 0; i < 6000; ++i)); do kill -0 "$mpi_pid" 2>/dev/null || break; sleep 0.01; done
  kill -0 "$mpi_pid" 2>/dev/null && fail_run "checkpoint run $runs: mpirun still running 60 s after a rank's kill -9; killed"
  t_down=$(now)
  ckpt_down+=("$(awk -v a="$t_kill" -v b="$t_down" 'BEGIN { print b - a }')")
  stop_session "$mpi_pid"
  start_mpirun "$run_dir/c2" "${mdl[@]}" --dims "$dims" "${ck[@]}" --resume latest
  if wait_row "$run_dir/c2.g0r0.log" 13 120 "$mpi_pid"; then
    ckpt_13+=("$(rows "$run_dir/c2.g0r0.log" | awk -v t="$t_kill" '$2 == 13 { print $1 - t; exit }')")
    first=$(rows "$run_dir/c2.g0r0.log" | awk 'NR == 1 { print $2 }')
    [ "$first" = 11 ] || note "checkpoint run $runs: the resumed run's first step is $first (want 11: --save-every 5)"
  else
    fail_run "checkpoint run $runs: the resumed run has no step 13 row"
    tail -n 5 "$run_dir/c2.g0r0.log" "$run_dir/c2.mpirun.log" >&2
  fi
  stop_session "$mpi_pid"
done

# ---- the table -------------------------------------------------------------------------------
med() { printf '%s\n' "$@" | grep -E '^[0-9.eE+-]+$' | median; }
fmt() { [ "$2" = n/a ] && echo n/a || LC_ALL=C printf "$1" "$2"; }  # fmt FORMAT VALUE
ratio() { [ "$1" = n/a ] || [ "$2" = n/a ] && echo n/a || awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
m_off=$(med "${off_ms[@]}") m_on=$(med "${on_ms[@]}") w_off=$(med "${off_wall[@]}") w_on=$(med "${on_wall[@]}")
g_off=$(med "${off_gap[@]}") g_on=$(med "${on_gap[@]}")
h_r=$(med "${heal_r[@]}") l_r=$(med "${loop_r[@]}")
echo
echo "elastic_bench: 3 groups x 2 ranks, train_mlp zero3 dims $dims batch 48, localhost, median of $reps"
printf '%-44s %s\n' metric value
printf '%-44s %s\n' "step time off (ms)" "$(fmt %.2f "$m_off")"
printf '%-44s %s\n' "step time on (ms)" "$(fmt %.2f "$m_on")"
printf '%-44s %s\n' "on/off" "$(ratio "$m_on" "$m_off")x"
printf '%-44s %s\n' "wall per step off / on (ms)" "$(fmt %.2f "$w_off") / $(fmt %.2f "$w_on") ($(ratio "$w_on" "$w_off")x)"
printf '%-44s %s\n' "  wall less time_ms off / on (ms)" "$(fmt %.2f "$g_off") / $(fmt %.2f "$g_on")"
printf '%-44s %s\n' "kill -> survivors' next commit (s)" "$(fmt %.3f "$(med "${next_commit[@]}")")"
printf '%-44s %s\n' "steps lost by the survivors" "$(fmt %s "$(med "${aborted[@]}")") (attempts aborted; $(fmt %s "$(med "${rows_between[@]}")") new rows before 'groups 0,2 present')"
printf '%-44s %s\n' "heal bytes per rank ($heal_dims)" "$(fmt %.0f "$(med "${heal_b[@]}")")"
printf '%-44s %s\n' "heal time (s)" "$(fmt %.3f "$(med "${heal_t[@]}")")"
printf '%-44s %s\n' "kill -> group 1 healed (s)" "$(fmt %.3f "$(med "${heal_after[@]}")")"
printf '%-44s %s\n' "heal rate (GB/s) / loopback (GB/s)" "$(fmt %.2f "$h_r") / $(fmt %.2f "$l_r") ($(ratio "$h_r" "$l_r")x)"
printf '%-44s %s\n' "restart from checkpoint -> step 13 (s)" "$(fmt %.3f "$(med "${ckpt_13[@]}")")"
printf '%-44s %s\n' "  of which mpirun's exit after the kill (s)" "$(fmt %.3f "$(med "${ckpt_down[@]}")")"
printf '%-44s %s\n' "elastic -> step 13 (s)" "$(fmt %.3f "$(med "${el_13[@]}")")"
if [ $failed -gt 0 ]; then
  note "$failed measurement(s) failed (above); their numbers are left out of the medians"
  exit 1
fi
