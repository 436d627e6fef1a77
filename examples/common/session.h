// MPI start for the examples: hsdp owns MPI (hsdp::mpi::Session::init), and the world
// communicator the programs build their mesh on. An application that initialises MPI itself
// attaches instead (Session::attach, docs/api.md).
#pragma once

#include <memory>
#include <optional>

#include "hsdp/mpi.h"
#include "hsdp/transport.h"

namespace examples {

struct Started {
  std::unique_ptr<hsdp::mpi::Session> session;  // declared first: finalizes MPI last
  std::unique_ptr<hsdp::Comm> world;
};

// Starts the session and fills *out. Returns the exit code when the program must end now (a bad
// HSDP_* setting: kExitUsage; MPI failing: kExitRuntime), reported by every rank; nullopt to go
// on.
std::optional<int> startMpi(const char* program, int* argc, char*** argv, Started* out);

}  // namespace examples
