// Per-level transport selection. The Mesh builds every group with the bootstrap transport (MPI)
// and then asks for the transport the program chose for that level (MeshSpec::intra_transport /
// inter_transport), else the environment's:
//   HSDP_TRANSPORT_INTRA = mpi | ucx | nccl   (the intra-node shard phase)
//   HSDP_TRANSPORT_INTER = mpi | ucx | nccl   (the inter-node shard phase and replica all-reduce)
// Default (neither set): mpi, i.e. the bootstrap itself. Other names come from the transport
// registry (hsdp/transport_registry.h): what this build has, plus any transport the application
// registered. An unknown name is an error naming the variable, the value and the available names;
// a transport this build lacks (ucx without UCX, nccl without CUDA) says how to get it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "hsdp/transport.h"

namespace hsdp {

enum class MeshLevel { kIntra, kInter };

const char* meshLevelName(MeshLevel level);

// The names HSDP_TRANSPORT_INTRA / _INTER accept, for messages and docs: "mpi, ucx".
std::string availableTransports();

// Collective over `bootstrap`'s members. Returns `bootstrap` itself when the level's transport is
// the bootstrap's (mpi), else a new communicator of the chosen transport over the same members,
// in the same rank order, which takes ownership of `bootstrap`. `chosen` (the program's choice,
// e.g. MeshSpec::intra_transport) wins over the environment; "" reads the environment. Errors
// name where the name came from (the variable, or `chosen_by`).
StatusOr<std::unique_ptr<Comm>> selectLevelTransport(MeshLevel level,
                                                     std::unique_ptr<Comm> bootstrap,
                                                     std::string_view chosen = {},
                                                     std::string_view chosen_by = {});

}  // namespace hsdp
