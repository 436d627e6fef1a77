// Per-level transport selection. The Mesh builds every group with the bootstrap transport (MPI)
// and then asks for the transport the user chose for that level:
//   HSDP_TRANSPORT_INTRA = mpi | ucx      (the intra-node shard phase)
//   HSDP_TRANSPORT_INTER = mpi | ucx      (the inter-node shard phase and replica all-reduce)
// Default (unset or empty): mpi, i.e. the bootstrap itself. ucx builds a UCX communicator over the
// bootstrap's members (collectives/ucx/ucx_comm.h). Further names (nccl) become valid as their
// transports land. An unknown name is an error naming the variable, the value and the available
// names.
#pragma once

#include <memory>

#include "hsdp/transport.h"

namespace hsdp {

enum class MeshLevel { kIntra, kInter };

const char* meshLevelName(MeshLevel level);

// The names HSDP_TRANSPORT_INTRA / _INTER accept, for messages and docs: "mpi, ucx".
const char* availableTransports();

// Collective over `bootstrap`'s members. Returns `bootstrap` itself when the level's transport is
// the bootstrap's (mpi), else a new communicator of the chosen transport over the same members,
// in the same rank order, which takes ownership of `bootstrap`.
StatusOr<std::unique_ptr<Comm>> selectLevelTransport(MeshLevel level,
                                                     std::unique_ptr<Comm> bootstrap);

}  // namespace hsdp
