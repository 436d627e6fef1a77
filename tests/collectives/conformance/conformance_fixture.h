// The typed test suite Conformance<Backend> that every family of the conformance suite adds its
// tests to (conformance_suite.h registers them): the skip of a backend that does not run here,
// and the checks each test repeats for every element type.
#pragma once

#include "tests/collectives/conformance/conformance_oracle.h"

namespace hsdp::conformance {

template <typename Backend>
class Conformance : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = Backend::unavailable();
    if (!why.empty()) GTEST_SKIP() << Backend::name() << ": " << why;
  }
  static Memory& mem() { return Backend::memory(); }

  template <typename T>
  static void allGather(const Case& c) {
    const int n = c.comm->size(), r = c.comm->rank();
    const T guard = fromFloat<T>(-3);
    for (size_t count : counts<T>()) {
      SCOPED_TRACE(strCat(c.name, " allGather ", dtypeName(dtypeOf<T>()), " count=", count));
      std::vector<T> mine;
      if constexpr (std::is_same_v<T, float>)
        mine = randomValues(worldRank(), count);
      else
        mine = exactValues<T>(worldRank(), count, 4);
      const auto want = mpiAllGather(mine, c.oracle);
      Buffer<T> send(mem(), mine, guard), recv(mem(), n * count, guard);
      ASSERT_OK(c.comm->allGather(send.data(), recv.data(), count, dtypeOf<T>()));
      EXPECT_TRUE(exactly(recv.read(), want, guard)) << "out of place";
      // In place: this rank's block already sits in the result.
      std::vector<T> staged(n * count, fromFloat<T>(0));
      std::copy(mine.begin(), mine.end(), staged.begin() + r * count);
      Buffer<T> inplace(mem(), staged, guard);
      ASSERT_OK(c.comm->allGather(inplace.data() + r * count, inplace.data(), count, dtypeOf<T>()));
      EXPECT_TRUE(exactly(inplace.read(), want, guard)) << "in place";
    }
  }

  template <typename T>
  static void reduceScatterExact(const Case& c) {
    const int n = c.comm->size();
    const T guard = fromFloat<T>(-3);
    for (size_t count : counts<T>()) {
      SCOPED_TRACE(
          strCat(c.name, " reduceScatter sum ", dtypeName(dtypeOf<T>()), " count=", count));
      const std::vector<T> full = exactValues<T>(worldRank(), n * count);
      const auto want = mpiReduceScatter(full, count, c.oracle);
      Buffer<T> send(mem(), full, guard), recv(mem(), count, guard);
      ASSERT_OK(c.comm->reduceScatter(send.data(), recv.data(), count, dtypeOf<T>(), RedOp::kSum));
      EXPECT_TRUE(exactly(recv.read(), want, guard));
    }
  }

  template <typename T>
  static void allReduceExact(const Case& c) {
    const T guard = fromFloat<T>(-3);
    for (size_t count : counts<T>()) {
      SCOPED_TRACE(strCat(c.name, " allReduce sum ", dtypeName(dtypeOf<T>()), " count=", count));
      const std::vector<T> v = exactValues<T>(worldRank() + 2, count, 4);
      const auto want = mpiAllReduce(v, c.oracle);
      Buffer<T> buf(mem(), v, guard);
      ASSERT_OK(c.comm->allReduce(buf.data(), count, dtypeOf<T>(), RedOp::kSum));
      EXPECT_TRUE(exactly(buf.read(), want, guard));
    }
  }
};

TYPED_TEST_SUITE_P(Conformance);

}  // namespace hsdp::conformance
