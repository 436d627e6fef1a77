// The conformance suite's dense collectives: all-gather (out of place and in place),
// reduce-scatter and all-reduce (exact sums on integers in float, bf16 and int32; random values
// sum and avg within rounding; the all-reduce bitwise identical on every rank).
#pragma once

#include "tests/collectives/conformance/conformance_fixture.h"

namespace hsdp::conformance {

TYPED_TEST_P(Conformance, AllGatherMatchesMpiOutOfAndInPlace) {
  for (const Case& c : TypeParam::cases()) {
    this->template allGather<float>(c);
    this->template allGather<bf16>(c);
    this->template allGather<int32_t>(c);
  }
}

TYPED_TEST_P(Conformance, ReduceScatterSumIsExactOnIntegers) {
  for (const Case& c : TypeParam::cases()) {
    this->template reduceScatterExact<float>(c);
    this->template reduceScatterExact<bf16>(c);
    this->template reduceScatterExact<int32_t>(c);
  }
}

TYPED_TEST_P(Conformance, ReduceScatterOfRandomValuesSumAndAvg) {
  for (const Case& c : TypeParam::cases()) {
    const int n = c.comm->size();
    for (size_t count : counts()) {
      SCOPED_TRACE(strCat(c.name, " count=", count));
      const std::vector<float> full = randomValues(worldRank() + 50, n * count);
      const std::vector<float> sum = mpiReduceScatter(full, count, c.oracle);
      std::vector<float> avg(sum);
      for (float& x : avg) x /= float(n);
      Buffer<float> send(this->mem(), full, -3.0f), out_sum(this->mem(), count, -3.0f),
          out_avg(this->mem(), count, -3.0f);
      ASSERT_OK(
          c.comm->reduceScatter(send.data(), out_sum.data(), count, DType::kFloat32, RedOp::kSum));
      ASSERT_OK(
          c.comm->reduceScatter(send.data(), out_avg.data(), count, DType::kFloat32, RedOp::kAvg));
      EXPECT_TRUE(near(out_sum.read(), sum, 1e-6f, 1e-6f * n, -3.0f)) << "sum";
      EXPECT_TRUE(near(out_avg.read(), avg, 1e-6f, 1e-6f, -3.0f)) << "avg";
      // bf16 average of exact values: 8 significant bits, rounded at each hop.
      const std::vector<bf16> full16 = exactValues<bf16>(worldRank(), n * count);
      std::vector<float> avg16 = mpiReduceScatter(full16, count, c.oracle);
      for (float& x : avg16) x /= float(n);
      Buffer<bf16> send16(this->mem(), full16, toBf16(-3)), out16(this->mem(), count, toBf16(-3));
      ASSERT_OK(
          c.comm->reduceScatter(send16.data(), out16.data(), count, DType::kBFloat16, RedOp::kAvg));
      EXPECT_TRUE(near(asFloats(out16.read()), avg16, 1.6e-2f, 1e-2f, -3.0f)) << "bf16 avg";
    }
  }
}

TYPED_TEST_P(Conformance, AllReduceSumIsExactAndAvgWithinRounding) {
  for (const Case& c : TypeParam::cases()) {
    this->template allReduceExact<float>(c);
    this->template allReduceExact<bf16>(c);
    this->template allReduceExact<int32_t>(c);
    const int n = c.comm->size();
    for (size_t count : counts()) {
      SCOPED_TRACE(strCat(c.name, " allReduce avg count=", count));
      const std::vector<float> v = randomValues(worldRank() + 9, count);
      std::vector<float> avg = mpiAllReduce(v, c.oracle);
      for (float& x : avg) x /= float(n);
      Buffer<float> buf(this->mem(), v, -3.0f);
      ASSERT_OK(c.comm->allReduce(buf.data(), count, DType::kFloat32, RedOp::kAvg));
      EXPECT_TRUE(near(buf.read(), avg, 1e-5f, 1e-6f, -3.0f));
      const std::vector<bf16> v16 = exactValues<bf16>(worldRank() + 3, count);
      std::vector<float> avg16 = mpiAllReduce(v16, c.oracle);
      for (float& x : avg16) x /= float(n);
      Buffer<bf16> buf16(this->mem(), v16, toBf16(-3));
      ASSERT_OK(c.comm->allReduce(buf16.data(), count, DType::kBFloat16, RedOp::kAvg));
      EXPECT_TRUE(near(asFloats(buf16.read()), avg16, 1.6e-2f, 1e-2f, -3.0f)) << "bf16 avg";
    }
    // 64-bit integers beyond 32 bits.
    std::vector<int64_t> big(1000);
    for (size_t i = 0; i < big.size(); ++i) big[i] = (int64_t(worldRank()) << 33) + int64_t(i);
    Buffer<int64_t> buf(this->mem(), big, -3);
    ASSERT_OK(c.comm->allReduce(buf.data(), big.size(), DType::kInt64, RedOp::kSum));
    EXPECT_TRUE(exactly(buf.read(), mpiAllReduce(big, c.oracle), int64_t(-3))) << "int64";
  }
}

// Replicas all-reduce gradients and must stay bitwise in step: every rank gets the same bits.
TYPED_TEST_P(Conformance, AllReduceOfRandomValuesIsBitwiseIdenticalOnEveryRank) {
  for (const Case& c : TypeParam::cases()) {
    for (size_t count : counts()) {
      SCOPED_TRACE(strCat(c.name, " count=", count));
      const std::vector<float> v = randomValues(worldRank() + 11, count);
      Buffer<float> buf(this->mem(), v, -3.0f);
      ASSERT_OK(c.comm->allReduce(buf.data(), count, DType::kFloat32, RedOp::kAvg));
      const std::vector<float> mine = buf.read();
      std::vector<float> root = mine;
      MPI_Bcast(root.data(), int(count), MPI_FLOAT, 0, c.oracle);
      EXPECT_EQ(0, std::memcmp(root.data(), mine.data(), count * sizeof(float)))
          << "differs from rank 0's";
    }
  }
}

}  // namespace hsdp::conformance
