// The MPI transport on host memory, and hsdp's life inside an MPI process.
//
// Two ways to start:
//  - hsdp owns MPI: Session::init() calls MPI_Init_thread (at the thread level hsdp needs), tunes
//    the process for hsdp first (tuneProcessForHsdp below) and calls MPI_Finalize at the end. The
//    examples and tools do this.
//  - the application owns MPI (it called MPI_Init_thread itself, e.g. a framework that uses MPI
//    too): Session::attach() changes nothing in the process: no environment, no malloc settings,
//    no error handler on MPI_COMM_WORLD, no atexit hook, and it never finalizes MPI. hsdp's world
//    is then a duplicate of MPI_COMM_WORLD (Session::world) or of any communicator the
//    application hands over (adopt), so hsdp's traffic never mixes with the application's.
#pragma once

#include <mpi.h>

#include <memory>

#include "hsdp/transport.h"

namespace hsdp::mpi {

class Session {
 public:
  // Initialises MPI (once per process), after tuneProcessForHsdp(). Errors on the communicators
  // are returned as Status (MPI_ERRORS_RETURN), never as MPI's default abort. A bad HSDP_*
  // setting read here (InvalidArgument) still leaves MPI running until exit, so every rank can
  // report it (worldRank() names the rank) before the job ends. FailedPrecondition when MPI is
  // already initialized: use attach().
  static StatusOr<std::unique_ptr<Session>> init(int* argc, char*** argv);
  // Attaches to an MPI the application initialised (and will finalize) itself; FailedPrecondition
  // when MPI is not initialized or already finalized. The progress thread (HSDP_PROGRESS_THREAD)
  // starts only if the application's thread level is MPI_THREAD_MULTIPLE (else a warning).
  static StatusOr<std::unique_ptr<Session>> attach();
  // This process's rank in MPI_COMM_WORLD, or -1 when MPI is not running.
  static int worldRank();
  // Stops hsdp's progress thread and frees hsdp's MPI objects; MPI_Finalize only after init().
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // A new handle to MPI_COMM_WORLD (a duplicate, so hsdp traffic never mixes with the user's).
  StatusOr<std::unique_ptr<Comm>> world();
  bool ownsMpi() const { return owns_mpi_; }

 private:
  explicit Session(bool owns_mpi) : owns_mpi_(owns_mpi) {}
  bool owns_mpi_;
};

// hsdp's world over the application's own communicator: a duplicate of `comm` (collective over
// its members), with MPI_ERRORS_RETURN on the duplicate only. Needs an initialised MPI and a
// Session (init or attach) alive for bf16 reductions and the progress thread.
StatusOr<std::unique_ptr<Comm>> adopt(MPI_Comm comm);

// What Session::init() does to the process before MPI_Init, for an application that initialises
// MPI itself and wants hsdp's tuning: glibc keeps freed heap pages mapped (HSDP_MALLOC_TUNE: MPI's
// per-call temporaries then reuse pre-faulted pages), Open MPI's TCP eager limit and links
// (HSDP_MPI_TCP_EAGER, HSDP_MPI_TCP_LINKS; a value the user set as OMPI_MCA_* wins). Must be
// called before MPI_Init; FailedPrecondition after. A bad HSDP_* value is InvalidArgument and
// changes nothing.
[[nodiscard]] Status tuneProcessForHsdp();

}  // namespace hsdp::mpi
