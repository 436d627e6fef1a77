// The conformance suite on handles and groups: many collectives in flight completed in any order,
// a group of mixed operations, and bad arguments and dependent groups rejected with the
// communicator left usable.
#pragma once

#include "tests/collectives/conformance/conformance_fixture.h"

namespace hsdp::conformance {

// Rounds of a reduce-scatter, an all-gather and an all-reduce all in flight on one communicator,
// completed in an order that differs from rank to rank, half by polling test(), half by wait():
// progress may not depend on the order in which the caller completes handles.
TYPED_TEST_P(Conformance, ManyOutstandingHandlesCompleteInAnyOrder) {
  constexpr int kRounds = 4;
  const size_t count = 1001;
  for (const Case& c : TypeParam::cases()) {
    SCOPED_TRACE(c.name);
    const int n = c.comm->size();
    struct Round {
      std::vector<float> in;
      std::unique_ptr<Buffer<float>> send, rs, ag, ar;
    };
    std::vector<Round> rounds(kRounds);
    std::vector<WorkHandle> works;
    for (int o = 0; o < kRounds; ++o) {
      Round& r = rounds[o];
      r.in = exactValues<float>(worldRank() + o, n * count);
      r.send = std::make_unique<Buffer<float>>(this->mem(), r.in, -3.0f);
      r.rs = std::make_unique<Buffer<float>>(this->mem(), count, -3.0f);
      r.ag = std::make_unique<Buffer<float>>(this->mem(), n * count, -3.0f);
      r.ar = std::make_unique<Buffer<float>>(
          this->mem(), std::vector<float>(r.in.begin(), r.in.begin() + count), -3.0f);
      auto rs =
          c.comm->ireduceScatter(r.send->data(), r.rs->data(), count, DType::kFloat32, RedOp::kSum);
      auto ag = c.comm->iallGather(r.send->data(), r.ag->data(), count, DType::kFloat32);
      auto ar = c.comm->iallReduce(r.ar->data(), count, DType::kFloat32, RedOp::kSum);
      ASSERT_TRUE(rs.ok() && ag.ok() && ar.ok());
      works.push_back(std::move(*rs));
      works.push_back(std::move(*ag));
      works.push_back(std::move(*ar));
    }
    std::vector<size_t> order(works.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::mt19937 gen(77 + worldRank());
    std::shuffle(order.begin(), order.end(), gen);
    for (size_t k = 0; k < order.size(); ++k) {
      Work& w = *works[order[k]];
      if (k % 2 == 0) {
        for (;;) {
          auto done = w.test();
          ASSERT_TRUE(done.ok()) << done.status().toString();
          if (*done) break;
        }
      }
      ASSERT_OK(w.wait());  // after test() said done: the same result at once
    }
    for (int o = 0; o < kRounds; ++o) {
      Round& r = rounds[o];
      SCOPED_TRACE(strCat("round ", o));
      EXPECT_TRUE(exactly(r.rs->read(), mpiReduceScatter(r.in, count, c.oracle), -3.0f));
      EXPECT_TRUE(exactly(
          r.ag->read(),
          mpiAllGather(std::vector<float>(r.in.begin(), r.in.begin() + count), c.oracle), -3.0f));
      EXPECT_TRUE(exactly(
          r.ar->read(),
          mpiAllReduce(std::vector<float>(r.in.begin(), r.in.begin() + count), c.oracle), -3.0f));
    }
  }
}

// A group of mixed collectives (uneven counts, an empty one, an in-place gather, int32 and bf16,
// an average) equals each collective done by MPI, completed through test() only.
TYPED_TEST_P(Conformance, GroupOfMixedOperationsMatchesMpi) {
  for (const Case& c : TypeParam::cases()) {
    SCOPED_TRACE(c.name);
    Memory& m = this->mem();
    const int n = c.comm->size(), r = c.comm->rank(), w = worldRank();
    const size_t c1 = 7, c2 = 1003, c4 = 100003;
    const std::vector<float> ag_in = randomValues(w, c1);
    const std::vector<float> rs_in = exactValues<float>(w, n * c2);
    const std::vector<float> mine = randomValues(w + 100, c4);
    std::vector<float> staged(n * c4, 0.0f);
    std::copy(mine.begin(), mine.end(), staged.begin() + r * c4);
    const std::vector<int32_t> ar_in = exactValues<int32_t>(w, c2, 4);
    const std::vector<float> avg_in = randomValues(w + 7, c1);
    const std::vector<bf16> ag16_in = exactValues<bf16>(w, c1, 4);
    Buffer<float> ag_send(m, ag_in, -3.0f), ag_out(m, n * c1, -3.0f), rs_send(m, rs_in, -3.0f),
        rs_out(m, c2, -3.0f), empty_out(m, 0, -3.0f), inplace(m, staged, -3.0f),
        avg(m, avg_in, -3.0f);
    Buffer<int32_t> ar(m, ar_in, -3);
    Buffer<bf16> ag16_send(m, ag16_in, toBf16(-3)), ag16_out(m, n * c1, toBf16(-3));
    const std::vector<CollectiveOp> ops = {
        CollectiveOp::allGather(ag_send.data(), ag_out.data(), c1, DType::kFloat32),
        CollectiveOp::reduceScatter(rs_send.data(), rs_out.data(), c2, DType::kFloat32,
                                    RedOp::kSum),
        CollectiveOp::allGather(ag_send.data(), empty_out.data(), 0, DType::kFloat32),
        CollectiveOp::allGather(inplace.data() + r * c4, inplace.data(), c4, DType::kFloat32),
        CollectiveOp::allReduce(ar.data(), c2, DType::kInt32, RedOp::kSum),
        CollectiveOp::allReduce(avg.data(), c1, DType::kFloat32, RedOp::kAvg),
        CollectiveOp::allGather(ag16_send.data(), ag16_out.data(), c1, DType::kBFloat16),
    };
    auto work = c.comm->igroup(ops);
    ASSERT_OK(work.status());
    for (;;) {
      auto done = (*work)->test();
      ASSERT_OK(done.status());
      if (*done) break;
    }
    ASSERT_OK((*work)->wait());
    std::vector<float> want_avg = mpiAllReduce(avg_in, c.oracle);
    for (float& x : want_avg) x /= float(n);
    EXPECT_TRUE(exactly(ag_out.read(), mpiAllGather(ag_in, c.oracle), -3.0f)) << "all-gather";
    EXPECT_TRUE(exactly(rs_out.read(), mpiReduceScatter(rs_in, c2, c.oracle), -3.0f))
        << "reduce-scatter";
    EXPECT_TRUE(exactly(empty_out.read(), std::vector<float>{}, -3.0f)) << "an empty operation";
    EXPECT_TRUE(exactly(inplace.read(), mpiAllGather(mine, c.oracle), -3.0f)) << "in place";
    EXPECT_TRUE(exactly(ar.read(), mpiAllReduce(ar_in, c.oracle), -3)) << "int32 all-reduce";
    EXPECT_TRUE(near(avg.read(), want_avg, 1e-5f, 1e-6f, -3.0f)) << "avg";
    EXPECT_TRUE(exactly(ag16_out.read(), mpiAllGather(ag16_in, c.oracle), toBf16(-3))) << "bf16";
  }
}

// Bad arguments are InvalidArgument on every rank (each rank passes the same ones), name what is
// wrong, and leave the communicator usable; so are groups whose operations depend on each other.
TYPED_TEST_P(Conformance, BadArgumentsAndDependentGroupsAreRejected) {
  if (!TypeParam::kRejectsBadArguments)
    GTEST_SKIP() << TypeParam::name() << " defers argument checks to its levels";
  for (const Case& c : TypeParam::cases()) {
    SCOPED_TRACE(c.name);
    Memory& m = this->mem();
    const int n = c.comm->size();
    Buffer<int32_t> ints(m, 5, 1);
    Status s = c.comm->allReduce(ints.data(), 5, DType::kInt32, RedOp::kAvg);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    EXPECT_NE(s.message().find("avg"), std::string::npos) << s.message();
    Buffer<int32_t> block_ints(m, static_cast<size_t>(n), 1), one_int(m, 1, 1);
    s = c.comm->reduceScatter(block_ints.data(), one_int.data(), 1, DType::kInt32, RedOp::kAvg);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    EXPECT_NE(s.message().find("reduceScatter: avg of"), std::string::npos) << s.message();
    s = c.comm->allGather(nullptr, block_ints.data(), 1, DType::kInt32);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    EXPECT_NE(s.message().find("null send buffer"), std::string::npos) << s.message();
    auto runs = c.comm->iallGatherRuns(one_int.data(), block_ints.data(), BlockRuns{4, 2, 3},
                                       DType::kInt32, nullptr);
    ASSERT_FALSE(runs.ok());
    EXPECT_EQ(runs.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(runs.status().message().find("all-gather runs of 4 elements 3 apart overlap"),
              std::string::npos)
        << runs.status().message();
    if (TypeParam::kBroadcast) {
      s = c.comm->broadcast(ints.data(), 1, DType::kInt32, n);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    }
    Buffer<float> a(m, 3, 0.0f), out(m, n * 3, 0.0f);
    std::vector<CollectiveOp> ops = {
        CollectiveOp::allGather(a.data(), out.data(), 3, DType::kFloat32),
        CollectiveOp::allReduce(ints.data(), 5, DType::kInt32, RedOp::kAvg)};
    auto g = c.comm->igroup(ops);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("operation 1"), std::string::npos) << g.status().message();
    Buffer<float> x(m, n * 8, 0.0f), y(m, n * 8, 0.0f);
    std::vector<CollectiveOp> dependent = {
        CollectiveOp::reduceScatter(x.data(), y.data(), 8, DType::kFloat32, RedOp::kSum),
        CollectiveOp::allGather(y.data(), x.data(), 8, DType::kFloat32)};
    g = c.comm->igroup(dependent);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("operations 0 (reduceScatter) and 1 (allGather)"),
              std::string::npos)
        << g.status().message();
    std::vector<CollectiveOp> two_writers = {
        CollectiveOp::allReduce(y.data() + 4, 4, DType::kFloat32, RedOp::kSum),
        CollectiveOp::allReduce(x.data(), 1, DType::kFloat32, RedOp::kSum),
        CollectiveOp::allReduce(y.data(), 5, DType::kFloat32, RedOp::kSum)};
    g = c.comm->igroup(two_writers);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.status().message().find("operations 0 (allReduce) and 2 (allReduce) write "
                                        "overlapping"),
              std::string::npos)
        << g.status().message();
    // An empty group is complete at once; two operations reading the same bytes are independent.
    auto empty = c.comm->igroup({});
    ASSERT_OK(empty.status());
    auto done = (*empty)->test();
    ASSERT_TRUE(done.ok() && *done);
    const std::vector<float> src = randomValues(worldRank(), 8);
    Buffer<float> shared(m, src, -3.0f), out1(m, n * 8, -3.0f), out2(m, n * 8, -3.0f);
    std::vector<CollectiveOp> shared_read = {
        CollectiveOp::allGather(shared.data(), out1.data(), 8, DType::kFloat32),
        CollectiveOp::allGather(shared.data(), out2.data(), 8, DType::kFloat32)};
    g = c.comm->igroup(shared_read);
    ASSERT_OK(g.status());
    ASSERT_OK((*g)->wait());
    EXPECT_TRUE(exactly(out1.read(), mpiAllGather(src, c.oracle), -3.0f));
    EXPECT_TRUE(exactly(out2.read(), mpiAllGather(src, c.oracle), -3.0f));
    // Still usable: an all-reduce after the rejections matches MPI.
    const std::vector<float> v = exactValues<float>(worldRank(), 17);
    Buffer<float> buf(m, v, -3.0f);
    ASSERT_OK(c.comm->allReduce(buf.data(), v.size(), DType::kFloat32, RedOp::kSum));
    EXPECT_TRUE(exactly(buf.read(), mpiAllReduce(v, c.oracle), -3.0f));
  }
}

}  // namespace hsdp::conformance
