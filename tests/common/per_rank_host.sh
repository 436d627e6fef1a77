#!/usr/bin/env bash
# Runs one MPI rank as if it were alone on its own host, as far as NCCL can tell: several ranks on
# ONE GPU of one host is otherwise refused by NCCL ("Duplicate GPU detected"). Each rank gets its
# own NCCL_HOSTID, and NCCL talks over its socket transport on loopback (no shared memory, P2P or
# InfiniBand between the "hosts"). The other values, when already set, are kept.
#   mpirun -np 4 tests/common/per_rank_host.sh build-gpu/tests/collectives/nccl/nccl_comm_test
set -euo pipefail
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-0}}}
export NCCL_HOSTID=hsdp-virtual-host-$rank  # always per rank: one shared value would defeat it
export NCCL_NET=${NCCL_NET:-Socket}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
export NCCL_IB_DISABLE=${NCCL_IB_DISABLE:-1}
exec "$@"
