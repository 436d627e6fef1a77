#include "hsdp/transport_select.h"

#include "hsdp/env.h"
#include "hsdp/log.h"
#include "hsdp/transport_registry.h"

namespace hsdp {

const char* meshLevelName(MeshLevel level) {
  return level == MeshLevel::kIntra ? "intra" : "inter";
}

std::string availableTransports() { return transportNamesJoined(); }

namespace {
// Unset, a level uses the world's own transport (mpi over an MPI world, nccl over an NCCL one).
const env::StringParam kTransportIntra{
    "HSDP_TRANSPORT_INTRA", env::StringParam::Kind::kEnum, "",
    "Transport of the intra-node level (intra-shard group): mpi, ucx (UCP over UCX's "
    "shared-memory transports; see docs/ucx.md), or nccl in CUDA builds (device buffers; "
    "docs/gpu.md); unset: the world's. MeshSpec::intra_transport wins when set."};
const env::StringParam kTransportInter{
    "HSDP_TRANSPORT_INTER", env::StringParam::Kind::kEnum, "",
    "Transport of the inter-node level (inter-shard and replica groups), unset: the world's; "
    "mpi, ucx (UCP collectives over UCX's network transports; see docs/ucx.md), or nccl in CUDA "
    "builds. MeshSpec::inter_transport wins when set."};
}  // namespace

StatusOr<std::unique_ptr<Comm>> selectLevelTransport(MeshLevel level,
                                                     std::unique_ptr<Comm> bootstrap,
                                                     std::string_view chosen,
                                                     std::string_view chosen_by) {
  const env::StringParam& param = level == MeshLevel::kIntra ? kTransportIntra : kTransportInter;
  const std::string var =
      chosen.empty() || chosen_by.empty() ? param.name() : std::string(chosen_by);
  std::string name = chosen.empty() ? param.get() : std::string(chosen);
  if (name.empty() || name == bootstrap->transportName()) return bootstrap;
  if (!hasTransport(name)) {
    // Unknown, or known but not built in: the registry's reason (and how to get it) either way.
    StatusOr<std::unique_ptr<Comm>> none = createTransport(name, std::move(bootstrap));
    if (none.status().code() == StatusCode::kFailedPrecondition)
      return failedPrecondition(var, "=", name, ": ", none.status().message(),
                                " (available: ", availableTransports(), ")");
    return invalidArgument(var, "='", name, "' is not an available transport for the ",
                           meshLevelName(level), " level (available: ", availableTransports(), ")");
  }
  // Every rank reads the same variable, so every member of the group takes this branch and the
  // factory's collective creation matches up.
  const int size = bootstrap->size();
  StatusOr<std::unique_ptr<Comm>> comm = createTransport(name, std::move(bootstrap));
  if (!comm.ok())
    return comm.status().withContext(
        strCat(var, "=", name, ": building the ", meshLevelName(level), " level's communicator"));
  HSDP_INFO(kMesh, meshLevelName(level), " level group of ", size, " ranks on ", name);
  return comm;
}

}  // namespace hsdp
