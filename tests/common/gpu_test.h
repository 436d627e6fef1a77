// Shared by the gpu-labelled GoogleTest binaries (tests/common/gpu_test_main.cc is their main();
// those of several ranks use the MPI world of tests/common/mpi_test_main.h).
// Without a CUDA device every GPU test skips with CUDA's reason, and the program exits with
// kSkipExitCode, which ctest (SKIP_RETURN_CODE) reports as skipped: CI has no GPU.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "collectives/nccl/cuda_resources.h"
#include "tests/common/status_assert.h"

namespace hsdp::gpu_testing {

constexpr int kSkipExitCode = 77;

// Devices visible to this process (0 without a driver or device; `why` says which).
inline int devices(std::string* why = nullptr) { return gpu::deviceCount(why); }

}  // namespace hsdp::gpu_testing

// First statement of every test that needs a device.
#define HSDP_REQUIRE_GPU()                                     \
  do {                                                         \
    std::string hsdp_why_;                                     \
    if (::hsdp::gpu_testing::devices(&hsdp_why_) == 0)         \
      GTEST_SKIP() << "no CUDA device visible: " << hsdp_why_; \
  } while (0)
