// The conformance suite's collectives of runs (non-contiguous blocks, as the hierarchical
// schedules move chunks of every shard in place): reduce-scatter and all-gather of runs against
// MPI's collective of the packed blocks.
#pragma once

#include "tests/collectives/conformance/conformance_fixture.h"

namespace hsdp::conformance {

// A reduce-scatter of non-contiguous blocks (ireduceScatterRuns, how the hierarchical schedules
// reduce a chunk of every shard in place) against MPI_Reduce_scatter_block of the same blocks
// packed by the test: exact on small integers in float, bf16 and int32; random floats bit for bit
// equal to the backend's own reduce-scatter of the packed blocks (the same sums) and within
// rounding of MPI's, sum and avg; odd run lengths and strides, one run per block (contiguous but
// for the gap), runs longer than a tile of the cross-memory-attach path; the input untouched.
TYPED_TEST_P(Conformance, ReduceScatterRunsMatchesMpiOfThePackedBlocks) {
  if (!TypeParam::kRuns) GTEST_SKIP() << TypeParam::name() << " has no reduce-scatter of runs";
  struct Layout {
    size_t run, runs, stride;
  };
  const size_t big = largeRun();
  const Layout layouts[] = {{0, 2, 5},       {1, 1, 1},      {7, 1, 9},
                            {1000, 2, 1500}, {101, 3, 4099}, {big, 2, big + big / 4 + 1}};
  for (const Case& c : TypeParam::cases()) {
    const size_t n = static_cast<size_t>(c.comm->size());
    for (const Layout& l : layouts) {
      SCOPED_TRACE(strCat(c.name, " runs of ", l.run, " x ", l.runs, " stride ", l.stride));
      const BlockRuns layout{l.run, l.runs, l.stride};
      const size_t block = l.run * l.runs,
                   total = l.run == 0 ? 1 : (n * l.runs - 1) * l.stride + l.run;
      auto pack = [&](const auto& full) {
        std::remove_cvref_t<decltype(full)> packed(n * block);
        for (size_t q = 0; q < n; ++q)
          for (size_t p = 0; p < l.runs; ++p)
            std::copy_n(full.begin() + layout.offset(q, p), l.run,
                        packed.begin() + (q * l.runs + p) * l.run);
        return packed;
      };
      auto runsOf = [&](auto* send, auto* recv, auto* scratch, DType dtype, RedOp op) {
        auto w = c.comm->ireduceScatterRuns(send, recv, layout, dtype, op, scratch);
        ASSERT_OK(w.status());
        ASSERT_OK((*w)->wait());
      };
      auto exact = [&](auto zero) {
        using T = decltype(zero);
        const T guard = fromFloat<T>(-3);
        const std::vector<T> full = exactValues<T>(worldRank(), total);
        const auto want = mpiReduceScatter(pack(full), block, c.oracle);
        Buffer<T> send(this->mem(), full, guard), recv(this->mem(), block, guard),
            scratch(this->mem(), n * block, guard);
        runsOf(send.data(), recv.data(), scratch.data(), dtypeOf<T>(), RedOp::kSum);
        EXPECT_TRUE(exactly(recv.read(), want, guard)) << dtypeName(dtypeOf<T>());
        EXPECT_TRUE(exactly(send.read(), toOracle(full), guard)) << "the input changed";
      };
      exact(float{});
      exact(bf16{});
      exact(int32_t{});
      // Random floats: the same bits as the backend's reduce-scatter of the packed blocks.
      const std::vector<float> full = randomValues(worldRank() + 70, total), packed = pack(full);
      const std::vector<float> sum = mpiReduceScatter(packed, block, c.oracle);
      for (RedOp op : {RedOp::kSum, RedOp::kAvg}) {
        Buffer<float> send(this->mem(), full, -3.0f), recv(this->mem(), block, -3.0f),
            scratch(this->mem(), n * block, -3.0f), psend(this->mem(), packed, -3.0f),
            precv(this->mem(), block, -3.0f);
        runsOf(send.data(), recv.data(), scratch.data(), DType::kFloat32, op);
        ASSERT_OK(c.comm->reduceScatter(psend.data(), precv.data(), block, DType::kFloat32, op));
        const std::vector<float> got = recv.read(), ref = precv.read();
        EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)))
            << (op == RedOp::kSum ? "sum" : "avg") << " differs from the packed reduce-scatter";
        std::vector<float> want = sum;
        if (op == RedOp::kAvg)
          for (float& x : want) x /= float(n);
        EXPECT_TRUE(near(got, want, 1e-6f, 1e-6f * n, -3.0f)) << "against MPI";
      }
    }
  }
}

// An all-gather into non-contiguous blocks (iallGatherRuns, how the pipelined hierarchical
// all-gather lands each chunk's pieces in place) against MPI_Allgather of the contiguous blocks,
// placed into the runs by the test: bit for bit in float, bf16 and int32, out of place and in
// place (this rank's block already in its runs), with the gaps between runs and the guard behind
// the buffer untouched; odd run lengths and strides, one and several runs per block, runs longer
// than the transports' small-message limits (rings, cross-memory attach, datatypes). Every
// backend: a transport that cannot land runs in place unpacks from `pack` (the default).
TYPED_TEST_P(Conformance, AllGatherRunsMatchesMpiAllgatherPlacedInRuns) {
  struct Layout {
    size_t run, runs, stride;
  };
  const size_t big = largeRun();
  const Layout layouts[] = {{0, 2, 5},
                            {1, 1, 1},
                            {7, 1, 9},
                            {3, 4, 3},
                            {1000, 2, 1500},
                            {101, 3, 4099},
                            {big, 2, big + big / 4 + 1}};
  for (const Case& c : TypeParam::cases()) {
    const size_t n = static_cast<size_t>(c.comm->size()), r = static_cast<size_t>(c.comm->rank());
    for (const Layout& l : layouts) {
      SCOPED_TRACE(
          strCat(c.name, " allGatherRuns of ", l.run, " x ", l.runs, " stride ", l.stride));
      const BlockRuns layout{l.run, l.runs, l.stride};
      const size_t block = l.run * l.runs,
                   total = l.run == 0 ? 1 : (n * l.runs - 1) * l.stride + l.run;
      auto check = [&](auto zero) {
        using T = decltype(zero);
        const T guard = fromFloat<T>(-3);
        std::vector<T> mine(block);
        const std::vector<float> rnd = randomValues(worldRank() + 90, block);
        for (size_t i = 0; i < block; ++i) {
          if constexpr (std::is_same_v<T, int32_t>)
            mine[i] = worldRank() * 1000003 + int32_t(i);
          else
            mine[i] = fromFloat<T>(rnd[i]);
        }
        // The truth: MPI's gather of the contiguous blocks, placed run by run; the gaps keep
        // the guard value.
        const auto gathered = mpiAllGather(mine, c.oracle);
        std::vector<OracleT<T>> want(total, asFloat(guard));
        for (size_t q = 0; q < n; ++q)
          for (size_t p = 0; p < l.runs; ++p)
            std::copy_n(gathered.begin() + (q * l.runs + p) * l.run, l.run,
                        want.begin() + layout.offset(q, p));
        auto run = [&](const T* send, T* recv, T* pack) {
          auto w = c.comm->iallGatherRuns(send, recv, layout, dtypeOf<T>(), pack);
          ASSERT_OK(w.status());
          ASSERT_OK((*w)->wait());
        };
        Buffer<T> send(this->mem(), mine, guard), recv(this->mem(), total, guard),
            pack(this->mem(), n * block, guard);
        run(send.data(), recv.data(), pack.data());
        EXPECT_TRUE(exactly(recv.read(), want, guard))
            << dtypeName(dtypeOf<T>()) << " out of place";
        EXPECT_TRUE(exactly(send.read(), toOracle(mine), guard)) << "the input changed";
        // In place: this rank's block sits in its runs, every other element holds the guard.
        std::vector<T> staged(total, guard);
        for (size_t p = 0; p < l.runs; ++p)
          std::copy_n(mine.begin() + p * l.run, l.run, staged.begin() + layout.offset(r, p));
        Buffer<T> inplace(this->mem(), staged, guard);
        run(inplace.data() + layout.offset(r, 0), inplace.data(), pack.data());
        EXPECT_TRUE(exactly(inplace.read(), want, guard)) << dtypeName(dtypeOf<T>()) << " in place";
      };
      check(float{});
      check(bf16{});
      check(int32_t{});
    }
  }
}

}  // namespace hsdp::conformance
