#include "hsdp/transport_select.h"

#include "collectives/ucx/ucx_comm.h"
#if defined(HSDP_HAVE_CUDA)
#include "collectives/nccl/nccl_comm.h"
#endif
#include "hsdp/env.h"
#include "hsdp/log.h"

namespace hsdp {

const char* meshLevelName(MeshLevel level) {
  return level == MeshLevel::kIntra ? "intra" : "inter";
}

#if defined(HSDP_HAVE_CUDA)
const char* availableTransports() { return "mpi, ucx, nccl"; }
#else
const char* availableTransports() { return "mpi, ucx"; }
#endif

StatusOr<std::unique_ptr<Comm>> selectLevelTransport(MeshLevel level,
                                                     std::unique_ptr<Comm> bootstrap) {
  const char* var = level == MeshLevel::kIntra ? "HSDP_TRANSPORT_INTRA" : "HSDP_TRANSPORT_INTER";
  std::string name = env::getString(var);
  if (name.empty() || name == bootstrap->transportName()) return bootstrap;
  if (name == "ucx") {
    // Every rank reads the same variable, so every member of the group takes this branch and
    // the collective creation below matches up.
    const int size = bootstrap->size();
    StatusOr<std::unique_ptr<Comm>> comm = ucx::createUcxComm(std::move(bootstrap));
    if (!comm.ok())
      return comm.status().withContext(
          strCat(var, "=ucx: building the ", meshLevelName(level), " level's communicator"));
    HSDP_INFO(kMesh, meshLevelName(level), " level group of ", size, " ranks on ucx");
    return comm;
  }
  if (name == "nccl") {
#if defined(HSDP_HAVE_CUDA)
    // Collective over the bootstrap's members, like ucx above (collectives/nccl/nccl_comm.h).
    const int size = bootstrap->size();
    StatusOr<std::unique_ptr<Comm>> comm = nccl::createNcclComm(std::move(bootstrap));
    if (!comm.ok())
      return comm.status().withContext(
          strCat(var, "=nccl: building the ", meshLevelName(level), " level's communicator"));
    HSDP_INFO(kMesh, meshLevelName(level), " level group of ", size, " ranks on nccl");
    return comm;
#else
    return failedPrecondition(var, "=nccl: this hsdp was built without CUDA/NCCL (configured "
                              "with HSDP_WITH_CUDA=OFF, or no CUDA toolkit and NCCL were found); "
                              "reconfigure with -DHSDP_WITH_CUDA=ON (available: ",
                              availableTransports(), ")");
#endif
  }
  return invalidArgument(var, "='", name, "' is not an available transport for the ",
                         meshLevelName(level), " level (available: ", availableTransports(), ")");
}

}  // namespace hsdp
