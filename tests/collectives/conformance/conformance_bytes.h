// The conformance suite's byte counters (Comm::bytesSent, docs/collectives.md "Bytes sent"): what
// a group's ranks count for one collective, summed with MPI over the oracle, against the closed
// form hsdp-plan uses: an all-gather or reduce-scatter of `count` elements per block sends
// n·(n-1)·count elements in all, an all-reduce 2·(n-1)·count (the ring's; a transport's real
// sends where it counts them, as on UCX's ring for these large counts), an all-to-all
// n·(n-1)·count. A counter that counts nothing, counts twice or counts the received bytes fails.
// A case whose name ends in "/small" forces UCX's latency-optimal schedules at every size
// (recursive doubling over the whole buffer): they send more than the model, and count it, so
// there the count must be at least the model's.
#pragma once

#include "tests/collectives/conformance/conformance_fixture.h"

namespace hsdp::conformance {

// Sums `mine` over the oracle's ranks (exact in uint64).
inline uint64_t sumOverRanks(uint64_t mine, MPI_Comm oracle) {
  uint64_t all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_UINT64_T, MPI_SUM, oracle);
  return all;
}

TYPED_TEST_P(Conformance, BytesSentAddUpToTheModel) {
  for (const Case& c : TypeParam::cases()) {
    const uint64_t n = static_cast<uint64_t>(c.comm->size());
    // Over UCX's small-message limit (its ring everywhere) and odd: uneven all-reduce chunks.
    const size_t count = 20011;
    SCOPED_TRACE(strCat(c.name, " count=", count));
    const std::vector<float> mine = exactValues<float>(worldRank(), n * count, 4);
    Buffer<float> send(this->mem(), mine, -3.0f), recv(this->mem(), n * count, -3.0f);
    auto delta = [&](auto&& call) {
      const uint64_t before = c.comm->bytesSent();
      call();
      return sumOverRanks(c.comm->bytesSent() - before, c.oracle);
    };
    const bool small = c.name.size() >= 6 && c.name.compare(c.name.size() - 6, 6, "/small") == 0;
    auto expect = [&](uint64_t model, uint64_t counted, const char* what) {
      if (small)
        EXPECT_LE(model, counted) << what;
      else
        EXPECT_EQ(model, counted) << what;
    };
    const uint64_t block = n * (n - 1) * count * sizeof(float);
    expect(block, delta([&] {
             ASSERT_OK(c.comm->allGather(send.data(), recv.data(), count, DType::kFloat32));
           }),
           "allGather");
    expect(block, delta([&] {
             ASSERT_OK(c.comm->reduceScatter(send.data(), recv.data(), count, DType::kFloat32,
                                             RedOp::kSum));
           }),
           "reduceScatter");
    expect(2 * (n - 1) * count * sizeof(float), delta([&] {
             ASSERT_OK(c.comm->allReduce(send.data(), count, DType::kFloat32, RedOp::kSum));
           }),
           "allReduce");
    expect(2 * (n - 1) * count * sizeof(float), delta([&] {
             auto w = c.comm->iallReduce(send.data(), count, DType::kFloat32, RedOp::kAvg);
             ASSERT_OK(w.status());
             ASSERT_OK((*w)->wait());
           }),
           "iallReduce");
    if (TypeParam::kAllToAll) {
      expect(block, delta([&] {
               auto w = c.comm->iallToAll(send.data(), recv.data(), count, DType::kFloat32);
               ASSERT_OK(w.status());
               ASSERT_OK((*w)->wait());
             }),
             "allToAll");
    }
  }
}

}  // namespace hsdp::conformance
