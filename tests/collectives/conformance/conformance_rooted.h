// The conformance suite's all-to-all (the quantized reduce-scatter's exchange) and broadcast from
// every root with a barrier: the operations a backend may leave out (kAllToAll, kBroadcast).
#pragma once

#include "tests/collectives/conformance/conformance_fixture.h"

namespace hsdp::conformance {

// All-to-all (the quantized reduce-scatter's exchange) against MPI_Alltoall: every block at its
// rank, bit for bit, as raw bytes and as int32, with guards behind the result.
TYPED_TEST_P(Conformance, AllToAllMatchesMpi) {
  if (!TypeParam::kAllToAll) GTEST_SKIP() << TypeParam::name() << " has no all-to-all";
  for (const Case& c : TypeParam::cases()) {
    const int n = c.comm->size();
    for (size_t count : {size_t{0}, size_t{1}, size_t{1001}}) {
      SCOPED_TRACE(strCat(c.name, " allToAll count=", count));
      const std::vector<int32_t> mine = exactValues<int32_t>(worldRank(), n * count, 4);
      std::vector<int32_t> want(n * count);
      MPI_Alltoall(mine.data(), int(count), MPI_INT32_T, want.data(), int(count), MPI_INT32_T,
                   c.oracle);
      Buffer<int32_t> send(this->mem(), mine, -3), recv(this->mem(), n * count, -3);
      auto w = c.comm->iallToAll(send.data(), recv.data(), count, DType::kInt32);
      ASSERT_OK(w.status());
      ASSERT_OK((*w)->wait());
      EXPECT_TRUE(exactly(recv.read(), want, int32_t(-3)));
      // Bytes (the encoded pieces travel as kUInt8): an odd byte count per block.
      const size_t bytes = 4 * count + 3;
      std::vector<uint8_t> braw(n * bytes), bwant(n * bytes);
      for (size_t i = 0; i < braw.size(); ++i) braw[i] = uint8_t(i * 7 + 13 * worldRank());
      MPI_Alltoall(braw.data(), int(bytes), MPI_UINT8_T, bwant.data(), int(bytes), MPI_UINT8_T,
                   c.oracle);
      std::vector<uint8_t> bgot(n * bytes + 1, 0xee);
      Buffer<uint8_t> bsend(this->mem(), braw, 0xee), brecv(this->mem(), n * bytes, 0xee);
      auto wb = c.comm->iallToAll(bsend.data(), brecv.data(), bytes, DType::kUInt8);
      ASSERT_OK(wb.status());
      ASSERT_OK((*wb)->wait());
      bgot = brecv.read();
      EXPECT_EQ(0, std::memcmp(bgot.data(), bwant.data(), bwant.size()));
      EXPECT_EQ(bgot.back(), 0xee) << "wrote past the end";
    }
  }
}

TYPED_TEST_P(Conformance, BroadcastFromEveryRootAndBarrier) {
  if (!TypeParam::kBroadcast) GTEST_SKIP() << TypeParam::name() << " has no broadcast";
  for (const Case& c : TypeParam::cases()) {
    for (int root = 0; root < c.comm->size(); ++root) {
      SCOPED_TRACE(strCat(c.name, " root=", root));
      const std::vector<int64_t> mine(1001, int64_t(c.comm->rank()) * 1000003);
      Buffer<int64_t> buf(this->mem(), mine, -3);
      ASSERT_OK(c.comm->broadcast(buf.data(), mine.size(), DType::kInt64, root));
      const std::vector<int64_t> want(1001, int64_t(root) * 1000003);
      EXPECT_TRUE(exactly(buf.read(), want, int64_t(-3)));
    }
    ASSERT_OK(c.comm->barrier());
  }
}

}  // namespace hsdp::conformance
