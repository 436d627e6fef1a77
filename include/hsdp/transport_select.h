// Per-level transport selection. The Mesh builds every group with the bootstrap transport (MPI)
// and then asks for the transport the user chose for that level:
//   HSDP_TRANSPORT_INTRA = mpi            (the intra-node shard phase)
//   HSDP_TRANSPORT_INTER = mpi            (the inter-node shard phase and replica all-reduce)
// Further names (ucx, nccl) become valid as their transports land. An unknown name is an error
// naming the variable and the value.
#pragma once

#include <memory>

#include "hsdp/transport.h"

namespace hsdp {

enum class MeshLevel { kIntra, kInter };

const char* meshLevelName(MeshLevel level);

// Collective over `bootstrap`'s members. Returns `bootstrap` itself when the level's transport is
// the bootstrap's (mpi), else a new communicator of the chosen transport over the same members,
// in the same rank order.
StatusOr<std::unique_ptr<Comm>> selectLevelTransport(MeshLevel level,
                                                     std::unique_ptr<Comm> bootstrap);

}  // namespace hsdp
