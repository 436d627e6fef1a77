#include "common/session.h"

#include "common/failure.h"

namespace examples {

std::optional<int> startMpi(const char* program, int* argc, char*** argv, Started* out) {
  auto session = hsdp::mpi::Session::init(argc, argv);
  if (!session.ok()) {
    printError(program, hsdp::mpi::Session::worldRank(), session.status().toString());
    return session.status().code() == hsdp::StatusCode::kInvalidArgument ? kExitUsage
                                                                         : kExitRuntime;
  }
  out->session = std::move(*session);
  auto world = out->session->world();
  if (!world.ok()) {
    printError(program, hsdp::mpi::Session::worldRank(), world.status().toString());
    return kExitRuntime;
  }
  out->world = std::move(*world);
  return std::nullopt;
}

}  // namespace examples
