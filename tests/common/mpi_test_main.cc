// main() for GoogleTest binaries run under mpirun. Every rank runs every test; rank 0 prints the
// usual report, other ranks print only their failures (prefixed with the rank), and each rank's
// exit code reflects its own failures, so mpirun fails when any rank fails.
#include "tests/common/mpi_test_main.h"

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!hsdp::testing::startWorld(&argc, &argv)) return 1;
  int rc = RUN_ALL_TESTS();
  hsdp::testing::stopWorld();
  return rc;
}
