// main() for the gpu-labelled GoogleTest binaries. With HSDP_GPU_TEST_MPI it also owns MPI (the
// NCCL tests run under mpirun and use MPI as bootstrap and as the oracle: the world of
// tests/common/mpi_test_main.h); every rank runs every test, rank 0 prints the report, others
// only their failures.
//
// Exit code: the tests' result; but when no CUDA device is visible and nothing failed, every GPU
// test has skipped itself, and the program exits with kSkipExitCode so that ctest reports the
// test as skipped rather than passed (under mpirun every rank exits so and mpirun passes it on).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tests/common/gpu_test.h"
#if defined(HSDP_GPU_TEST_MPI)
#include "tests/common/mpi_test_main.h"
#endif

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#if defined(HSDP_GPU_TEST_MPI)
  if (!hsdp::testing::startWorld(&argc, &argv)) return 1;
#endif
  int rc = RUN_ALL_TESTS();
  std::string why;
  if (rc == 0 && hsdp::gpu_testing::devices(&why) == 0) {
    std::printf("[  SKIPPED ] no CUDA device visible (%s): exit code %d for ctest\n", why.c_str(),
                hsdp::gpu_testing::kSkipExitCode);
    rc = hsdp::gpu_testing::kSkipExitCode;
  }
#if defined(HSDP_GPU_TEST_MPI)
  hsdp::testing::stopWorld();
#endif
  return rc;
}
