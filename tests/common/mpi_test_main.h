// Shared by the MPI GoogleTest binaries: the world communicator of the running job.
#pragma once

#include "hsdp/transport.h"

namespace hsdp::testing {

// The job's world (a duplicate of MPI_COMM_WORLD), valid for the whole test run.
Comm& world();

}  // namespace hsdp::testing
