// main() for the gpu-labelled GoogleTest binaries. With HSDP_GPU_TEST_MPI it also owns MPI (the
// NCCL tests run under mpirun and use MPI as bootstrap and as the oracle); every rank runs every
// test, rank 0 prints the report, others only their failures.
//
// Exit code: the tests' result; but when no CUDA device is visible and nothing failed, every GPU
// test has skipped itself, and the program exits with kSkipExitCode so that ctest reports the
// test as skipped rather than passed (under mpirun every rank exits so and mpirun passes it on).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "tests/gpu/gpu_test.h"
#include "tests/common/rank_report.h"

#if defined(HSDP_GPU_TEST_MPI)
#include "hsdp/mpi.h"

namespace hsdp::gpu_testing {
namespace {

std::unique_ptr<Comm> g_world;

}  // namespace

Comm& world() { return *g_world; }

}  // namespace hsdp::gpu_testing
#endif

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#if defined(HSDP_GPU_TEST_MPI)
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
  hsdp::gpu_testing::g_world = std::move(*world);
  const int rank = hsdp::gpu_testing::g_world->rank();
  hsdp::testing::reportFailuresOnlyOffRankZero(rank);
#endif
  int rc = RUN_ALL_TESTS();
  std::string why;
  if (rc == 0 && hsdp::gpu_testing::devices(&why) == 0) {
    std::printf("[  SKIPPED ] no CUDA device visible (%s): exit code %d for ctest\n", why.c_str(),
                hsdp::gpu_testing::kSkipExitCode);
    rc = hsdp::gpu_testing::kSkipExitCode;
  }
#if defined(HSDP_GPU_TEST_MPI)
  hsdp::gpu_testing::g_world.reset();  // free the communicator before MPI_Finalize
#endif
  return rc;
}
