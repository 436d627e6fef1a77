// gpu::sumSquares (the device engine's gradient norm) against a host sum in long double, and its
// determinism: the same input gives the same bits every call. Lengths around the block size and
// the scratch limit, aligned and misaligned. Without a device every test skips.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "collectives/nccl/cuda_resources.h"
#include "cuda/kernels.h"
#include "tests/common/gpu_test.h"

namespace hsdp {
namespace {

TEST(SumSquares, MatchesHostAndIsDeterministic) {
  HSDP_REQUIRE_GPU();
  const size_t lengths[] = {0, 1, 3, 255, 256, 257, 1000, 100003, (size_t{4} << 20) + 13};
  const size_t max_n = (size_t{4} << 20) + 14;
  std::vector<float> host(max_n);
  for (size_t i = 0; i < max_n; ++i)
    host[i] = 1e-3f * static_cast<float>(static_cast<int>((i * 7919) % 2001) - 1000);
  auto x = gpu::DeviceBuffer::allocate(max_n * sizeof(float));
  auto acc = gpu::DeviceBuffer::allocate(sizeof(double));
  auto scratch = gpu::DeviceBuffer::allocate(gpu::kSumSquaresScratch * sizeof(double));
  auto f = gpu::DeviceBuffer::allocate(sizeof(float));
  ASSERT_TRUE(x.ok() && acc.ok() && scratch.ok() && f.ok());
  ASSERT_EQ(cudaMemcpy(x->data(), host.data(), max_n * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  for (size_t offset : {size_t{0}, size_t{1}}) {
    for (size_t n : lengths) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " offset " << offset);
      long double want = 0;
      for (size_t i = 0; i < n; ++i)
        want += static_cast<long double>(host[offset + i]) * host[offset + i];
      double runs[2];
      for (double& got : runs) {
        ASSERT_EQ(cudaMemset(acc->data(), 0, sizeof(double)), cudaSuccess);
        ASSERT_OK(gpu::sumSquares(x->as<float>() + offset, n, acc->as<double>(),
                                  scratch->as<double>(), nullptr));
        // Accumulates: a second call adds the same sum again.
        ASSERT_OK(gpu::sumSquares(x->as<float>() + offset, n, acc->as<double>(),
                                  scratch->as<double>(), nullptr));
        ASSERT_EQ(cudaMemcpy(&got, acc->data(), sizeof(double), cudaMemcpyDeviceToHost),
                  cudaSuccess);
      }
      EXPECT_EQ(std::memcmp(&runs[0], &runs[1], sizeof(double)), 0) << runs[0] << " vs " << runs[1];
      EXPECT_NEAR(runs[0], static_cast<double>(2 * want), 1e-12 * static_cast<double>(2 * want));
      ASSERT_OK(gpu::castDoubleToFloat(acc->as<double>(), f->as<float>(), 1, nullptr));
      float got_f = 0;
      ASSERT_EQ(cudaMemcpy(&got_f, f->data(), sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got_f, static_cast<float>(runs[0]));
    }
  }
}

TEST(SumSquares, RejectsNullArrays) {
  // Argument checks happen before any launch: no device needed.
  double d = 0;
  EXPECT_FALSE(gpu::sumSquares(nullptr, 5, &d, &d, nullptr).ok());
  EXPECT_TRUE(gpu::sumSquares(nullptr, 0, nullptr, nullptr, nullptr).ok());
  EXPECT_FALSE(gpu::castDoubleToFloat(nullptr, nullptr, 1, nullptr).ok());
}

}  // namespace
}  // namespace hsdp
