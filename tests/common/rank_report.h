// GoogleTest output under mpirun: rank 0 keeps the usual report, every other rank prints only
// its failures, prefixed with its rank (shared by the MPI and GPU test mains).
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

namespace hsdp::testing {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILURE %s:%d\n%s\n", rank_,
                   r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
};

// Call after InitGoogleTest, before RUN_ALL_TESTS.
inline void reportFailuresOnlyOffRankZero(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace hsdp::testing
