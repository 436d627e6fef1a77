// The MPI transport on host memory. A Session owns MPI's lifetime (MPI_Init_thread ...
// MPI_Finalize); world() hands out the world communicator behind the Comm interface.
#pragma once

#include <memory>

#include "hsdp/transport.h"

namespace hsdp::mpi {

class Session {
 public:
  // Initialises MPI (once per process). Errors on the communicators are returned as Status
  // (MPI_ERRORS_RETURN), never as MPI's default abort. A bad HSDP_* setting read here
  // (InvalidArgument) still leaves MPI running until exit, so every rank can report it
  // (worldRank() names the rank) before the job ends.
  static StatusOr<std::unique_ptr<Session>> init(int* argc, char*** argv);
  // This process's rank in MPI_COMM_WORLD, or -1 when MPI is not running.
  static int worldRank();
  ~Session();  // MPI_Finalize
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // A new handle to MPI_COMM_WORLD (a duplicate, so hsdp traffic never mixes with the user's).
  StatusOr<std::unique_ptr<Comm>> world();

 private:
  Session() = default;
};

}  // namespace hsdp::mpi
