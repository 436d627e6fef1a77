#!/usr/bin/env bash
# An elastic job on the emulated cluster, one replica group per node (run by
# tests/cluster/cluster.sh --exec, in the switch namespace, as a launcher of its own):
#   cluster.sh --nodes 3 --ranks-per-node R [--rate RATE] --exec -- \
#       elastic_cluster_job.sh CASE OUT HSDP_ELASTIC PROGRAM [ARGS...]
# starts etcd on the switch's address, then hsdp-elastic with one group per node (R ranks each,
# mpirun through the cluster's rsh agent), PROGRAM's output per group and restart in
# OUT/g<group>r<restart>.rank<rank>.log, the launcher's in OUT/launcher.log. ETCD_MEMBERS=3: a
# 3-member etcd instead, one member per node (in its namespace, on its address).
# CASE:
#   run   just the job.
#   cut   after group 2 prints step 10, its node's link goes down (the bridge port) for
#         CUT_SECONDS (default 8), then up again: the node is cut off from the other groups and
#         from etcd.
#   kill  after group 1 prints step KILL_AT (default 5), kill -9 of one of its ranks; the kill's
#         time in OUT/kill.time, and the time group 0 prints step KILL_AT + 1's row in
#         OUT/next_row.time (bench/elastic_cluster_bench.sh reads them).
# Exit status: hsdp-elastic's.
set -u
case_name=$1 out=$2 elastic=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
agent=$here/../cluster/rsh-agent.sh
read -r -a nodes <<<"$CLUSTER_SH_NODES"
sw=$CLUSTER_SH_SWITCH_IP
np=${ELASTIC_NP:-2}
[ "${#nodes[@]}" -ge 3 ] || { echo "elastic_cluster_job.sh: needs 3 nodes" >&2; exit 2; }
mkdir -p "$out"

if [ "${ETCD_MEMBERS:-1}" = 3 ]; then
  # One etcd member per node, in the node's namespace (through the rsh agent), on its address:
  # a node cut off takes its member with it.
  read -r -a addrs <<<"$CLUSTER_SH_HOSTS"
  initial= url= etcd_pid=
  for k in 0 1 2; do
    initial+="${initial:+,}m$k=http://${addrs[$k]}:2380"
    url+="${url:+,}http://${addrs[$k]}:2379"
  done
  for k in 0 1 2; do
    "$agent" "${nodes[$k]}" etcd --name "m$k" --data-dir "$CLUSTER_SH_RUNDIR/etcd$k" \
      --listen-client-urls "http://${addrs[$k]}:2379" --advertise-client-urls "http://${addrs[$k]}:2379" \
      --listen-peer-urls "http://${addrs[$k]}:2380" \
      --initial-advertise-peer-urls "http://${addrs[$k]}:2380" --initial-cluster "$initial" \
      --initial-cluster-state new --pre-vote=true >"$out/etcd$k.log" 2>&1 &
    etcd_pid+=" $!"
  done
else
  url=http://$sw:2379
  etcd --data-dir "$CLUSTER_SH_RUNDIR/etcd" --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster default=http://127.0.0.1:2380 >"$out/etcd.log" 2>&1 &
  etcd_pid=$!
fi
trap 'kill -9 $etcd_pid 2>/dev/null' EXIT
for u in ${url//,/ }; do
  for ((i = 0; i < 200; ++i)); do
    curl -sf "$u/health" >/dev/null && break
    sleep 0.1
  done
done
if [ "${ETCD_MEMBERS:-1}" = 3 ] && [ "$case_name" = cut ]; then
  # The cut takes node 2's member with it. Were that member the leader, it would serve group 2's
  # keepalives until it stepped down, and the other two would elect a new leader (about 1 s),
  # which renews every lease on taking office (etcd's lessor): group 2's 2 s lease could outlive
  # the 4 s cut, the group never be dropped (seen once in ten runs). The case is a member and its
  # group cut off, not the leader: leadership moves to node 0's member first.
  member() {  # member K FIELD -> the leader's id, or member K's own (FIELD: leader | id)
    curl -sf -X POST "http://${addrs[$1]}:2379/v3/maintenance/status" -d '{}' |
      python3 -c 'import json, sys; j = json.load(sys.stdin)
print(j["leader"] if sys.argv[1] == "leader" else j["header"]["member_id"])' "$2"
  }
  id0=$(member 0 id) id2=$(member 2 id)
  echo "leader $(member 0 leader); node 0's member $id0, node 2's $id2" >"$out/etcd.leader"
  for ((i = 0; i < 50; ++i)); do
    [ "$(member 0 leader)" != "$id2" ] && break
    curl -sf -X POST "http://${addrs[2]}:2379/v3/maintenance/transfer-leadership" \
      -d "{\"targetID\":\"$id0\"}" >/dev/null
    sleep 0.2
  done
  [ "$(member 0 leader)" != "$id2" ] || { echo "elastic_cluster_job.sh: etcd's leader stays on node 2" >&2; exit 3; }
fi

cat >"$out/group.sh" <<'EOF'
#!/usr/bin/env bash
out=$1; shift
g=$HSDP_ELASTIC_GROUP_INDEX r=$HSDP_ELASTIC_RESTARTS rank=${OMPI_COMM_WORLD_RANK:-0}
exec "$@" >"$out/g${g}r${r}.rank${rank}.log" 2>&1
EOF
chmod +x "$out/group.sh"

subnet=${sw%.*}.0/24
margs="--mca plm_rsh_agent $agent --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include $subnet"
margs+=" --mca btl_tcp_if_include $subnet --mca pml ob1 --mca btl self,vader,tcp"
margs+=" --mca orte_tmpdir_base $CLUSTER_SH_RUNDIR --bind-to none --oversubscribe"
[ "$(id -u)" -eq 0 ] && margs+=" --allow-run-as-root"
hosts="${nodes[0]}:$np;${nodes[1]}:$np;${nodes[2]}:$np"

"$elastic" --groups 3 --np "$np" --endpoint "$url" --job "cluster-$case_name" \
  --launcher-args "$margs" --group-hosts "$hosts" --grace 5 -- "$out/group.sh" "$out" "$@" \
  2>"$out/launcher.log" &
launcher=$!

if [ "$case_name" = cut ]; then
  for ((i = 0; i < 1200; ++i)); do
    grep -qaE "^ +10 " "$out/g2r0.rank0.log" 2>/dev/null && break
    sleep 0.05
  done
  date +%s.%N >"$out/cut.down"
  ip link set p2 down
  sleep "${CUT_SECONDS:-8}"
  ip link set p2 up
  date +%s.%N >"$out/cut.up"
fi
if [ "$case_name" = kill ]; then
  at=${KILL_AT:-5}
  for ((i = 0; i < 6000; ++i)); do
    grep -qaE "^ +$at(/[0-9]+)? " "$out/g1r0.rank0.log" 2>/dev/null && break
    sleep 0.05
  done
  victim=
  for p in $(pgrep -f "$1"); do
    env=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null) || continue
    grep -qx "HSDP_ELASTIC_GROUP_INDEX=1" <<<"$env" && grep -qx "HSDP_ELASTIC_RESTARTS=0" <<<"$env" &&
      victim=$p
  done
  kill -9 "$victim"
  date +%s.%N >"$out/kill.time"
  # The survivors' next committed step: group 0's row of step KILL_AT + 1 (the row of step
  # KILL_AT was committed before the kill: group 1 printed it).
  for ((i = 0; i < 60000; ++i)); do
    if grep -qaE "^ +$((at + 1))(/[0-9]+)? " "$out/g0r0.rank0.log"; then
      date +%s.%N >"$out/next_row.time"
      break
    fi
    sleep 0.01
  done
fi
wait "$launcher"
