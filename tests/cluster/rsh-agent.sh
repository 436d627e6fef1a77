#!/bin/sh
# rsh agent used by tests/cluster/cluster.sh (passed to mpirun as plm_rsh_agent).
#
# Open MPI calls it like ssh:   rsh-agent.sh [options] HOST COMMAND...
# It looks HOST up in the map file named by $CLUSTER_SH_MAP (lines "HOST NETNS NODENAME",
# written by cluster.sh) and runs COMMAND inside that node's network namespace, in a fresh
# UTS namespace (own host name, so Open MPI's shared-memory names do not collide) and a fresh
# mount namespace with a private /dev/shm (vanishes with the node's processes).
# Options before HOST (-x, -l user, -p port, -o opt, ...) are ignored: the first argument
# that is a host in the map file is taken as HOST.

map=${CLUSTER_SH_MAP:-}
if [ -z "$map" ] || [ ! -r "$map" ]; then
    echo "rsh-agent: CLUSTER_SH_MAP not set or unreadable (run through cluster.sh)" >&2
    exit 255
fi

ns= ; node=
while [ $# -gt 0 ]; do
    arg=$1; shift
    line=$(awk -v h="$arg" '$1 == h { print $2, $3; exit }' "$map")
    if [ -n "$line" ]; then
        ns=${line% *}; node=${line#* }
        break
    fi
done
if [ -z "$ns" ]; then
    echo "rsh-agent: no known host among the arguments" >&2
    exit 255
fi
if [ $# -eq 0 ]; then
    echo "rsh-agent: no command for host $node" >&2
    exit 255
fi

# Like ssh, the remaining words are joined and run by a shell on the "remote" node.
# orted is told to --daemonize (detach, reparent to init); we drop that flag so the daemon
# stays a child of this agent and of mpirun (inside mpirun's PID namespace, see cluster.sh):
# no orphans, and mpirun notices a daemon that dies.
cmd=$(printf '%s\n' "$*" | sed 's/\(orted[[:space:]]\{1,\}\)--daemonize\([[:space:]]\|$\)/\1/')
# shellcheck disable=SC2016
exec ip netns exec "$ns" unshare --uts --mount --propagation private sh -c '
    node=$1; shift
    hostname "$node" || exit 255
    mount -t tmpfs -o mode=1777 "shm-$node" /dev/shm || exit 255
    eval "$1"' rsh-agent "$node" "$cmd"
