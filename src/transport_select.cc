#include "hsdp/transport_select.h"

#include "hsdp/env.h"
#include "hsdp/log.h"

namespace hsdp {

const char* meshLevelName(MeshLevel level) {
  return level == MeshLevel::kIntra ? "intra" : "inter";
}

StatusOr<std::unique_ptr<Comm>> selectLevelTransport(MeshLevel level,
                                                     std::unique_ptr<Comm> bootstrap) {
  const char* var = level == MeshLevel::kIntra ? "HSDP_TRANSPORT_INTRA" : "HSDP_TRANSPORT_INTER";
  std::string name = env::getString(var);
  if (name.empty() || name == bootstrap->transportName()) return bootstrap;
  return invalidArgument(var, "='", name, "' is not an available transport for the ",
                         meshLevelName(level), " level (available: mpi)");
}

}  // namespace hsdp
