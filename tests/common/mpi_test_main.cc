// main() for GoogleTest binaries run under mpirun. Every rank runs every test; rank 0 prints the
// usual report, other ranks print only their failures (prefixed with the rank), and each rank's
// exit code reflects its own failures, so mpirun fails when any rank fails.
#include <gtest/gtest.h>

#include <cstdio>

#include "hsdp/mpi.h"
#include "tests/common/mpi_test_main.h"
#include "tests/common/rank_report.h"

namespace hsdp::testing {
namespace {

std::unique_ptr<Comm> g_world;

}  // namespace

Comm& world() { return *g_world; }

}  // namespace hsdp::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto session = hsdp::mpi::Session::init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().toString().c_str());
    return 1;
  }
  auto world = (*session)->world();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().toString().c_str());
    return 1;
  }
  hsdp::testing::g_world = std::move(*world);
  const int rank = hsdp::testing::g_world->rank();
  hsdp::testing::reportFailuresOnlyOffRankZero(rank);
  int rc = RUN_ALL_TESTS();
  hsdp::testing::g_world.reset();  // free the communicator before MPI_Finalize
  return rc;
}
