#include "hsdp/transport_select.h"

#include "collectives/ucx/ucx_comm.h"
#include "hsdp/env.h"
#include "hsdp/log.h"

namespace hsdp {

const char* meshLevelName(MeshLevel level) {
  return level == MeshLevel::kIntra ? "intra" : "inter";
}

const char* availableTransports() { return "mpi, ucx"; }

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
  return invalidArgument(var, "='", name, "' is not an available transport for the ",
                         meshLevelName(level), " level (available: ", availableTransports(), ")");
}

}  // namespace hsdp
