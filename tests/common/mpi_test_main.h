// Shared by the MPI GoogleTest binaries: the world communicator of the running job, started and
// stopped by their main() (tests/common/mpi_world.cc).
#pragma once

#include "hsdp/transport.h"

namespace hsdp::testing {

// The job's world (a duplicate of MPI_COMM_WORLD), valid for the whole test run.
Comm& world();

// Starts MPI and the world, and off rank 0 keeps GoogleTest's report to the rank's failures;
// false, with the reason printed, when either does not start. Call after InitGoogleTest.
bool startWorld(int* argc, char*** argv);

// Frees the world, then ends MPI.
void stopWorld();

}  // namespace hsdp::testing
