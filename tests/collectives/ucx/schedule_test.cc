// The UCX transport's algorithms (collectives/ucx/schedule.h), run in one process for every
// group size from 1 to 17 (and 32): an in-memory executor delivers each message by
// (sender, receiver, message id) exactly as the UCX tag does, so wrong block arithmetic, a
// message id the two ends compute differently, a deadlock or an unconsumed message all show up
// here without MPI or a network. It also checks that no step receives into memory it is
// sending from, which on a real transport would be a race.
#include "collectives/ucx/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "hsdp/status.h"

namespace hsdp::ucx {
namespace {

bool overlaps(const Transfer& a, const Transfer& b) {
  auto* a0 = static_cast<char*>(a.buf);
  auto* b0 = static_cast<char*>(b.buf);
  return a.bytes > 0 && b.bytes > 0 && a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}

// Runs one Schedule per rank to completion; false (with a gtest failure) on deadlock.
bool execute(std::vector<Schedule>& ranks) {
  const int n = static_cast<int>(ranks.size());
  std::map<std::tuple<int, int, uint32_t>, std::vector<char>> mailbox;  // (from, to, msg)
  std::vector<size_t> step(n, 0);
  std::vector<bool> posted(n, false);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < n; ++r) {
      Schedule& s = ranks[r];
      if (step[r] == s.numSteps()) continue;
      const Schedule::Step& st = s.step(step[r]);
      if (!posted[r]) {
        for (uint32_t i = st.recv_begin; i < st.recv_end; ++i) {
          for (uint32_t j = st.send_begin; j < st.send_end; ++j)
            EXPECT_FALSE(overlaps(s.recvAt(i), s.sendAt(j)))
                << "rank " << r << " step " << step[r] << " receives into its send buffer";
          for (uint32_t j = st.recv_begin; j < i; ++j)
            EXPECT_FALSE(overlaps(s.recvAt(i), s.recvAt(j))) << "rank " << r << " step " << step[r];
        }
        for (uint32_t i = st.send_begin; i < st.send_end; ++i) {
          const Transfer& t = s.sendAt(i);
          EXPECT_NE(t.peer, r) << "send to self";
          auto key = std::make_tuple(r, t.peer, t.msg);
          EXPECT_EQ(mailbox.count(key), 0u)
              << "duplicate message " << t.msg << " " << r << "->" << t.peer;
          auto* p = static_cast<const char*>(t.buf);
          mailbox[key] = std::vector<char>(p, p + t.bytes);
        }
        posted[r] = true;
        moved = true;
      }
      bool ready = true;
      for (uint32_t i = st.recv_begin; i < st.recv_end; ++i) {
        const Transfer& t = s.recvAt(i);
        if (!mailbox.count(std::make_tuple(t.peer, r, t.msg))) ready = false;
      }
      if (!ready) continue;
      for (uint32_t i = st.recv_begin; i < st.recv_end; ++i) {
        const Transfer& t = s.recvAt(i);
        auto it = mailbox.find(std::make_tuple(t.peer, r, t.msg));
        EXPECT_EQ(it->second.size(), t.bytes) << "message " << t.msg << " " << t.peer << "->" << r;
        if (t.bytes > 0)
          std::memcpy(t.buf, it->second.data(), std::min(t.bytes, it->second.size()));
        mailbox.erase(it);
      }
      for (uint32_t i = st.op_begin; i < st.op_end; ++i) runLocalOp(s.opAt(i));
      ++step[r];
      posted[r] = false;
      moved = true;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (step[r] != ranks[r].numSteps()) {
      ADD_FAILURE() << "deadlock: rank " << r << " stuck at step " << step[r] << " of "
                    << ranks[r].numSteps();
      return false;
    }
  }
  EXPECT_TRUE(mailbox.empty()) << mailbox.size() << " messages never received";
  return true;
}

const std::vector<int> kSizes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 17, 32};
const std::vector<size_t> kCounts = {0, 1, 7, 100, 1001};

// Small integers: every summation order is exact, in float and in bf16 for up to 32 ranks.
float exactValue(int rank, size_t i) { return float(((rank + 1) * (i % 13 + 3)) % 17 % 5); }

// Element i of a float32 or bfloat16 buffer set to x (rounded to bfloat16).
void setValue(std::vector<char>& v, size_t i, float x, DType dt) {
  if (dt == DType::kFloat32) {
    std::memcpy(v.data() + 4 * i, &x, 4);
  } else {
    bf16 b = toBf16(x);
    std::memcpy(v.data() + 2 * i, &b, 2);
  }
}

std::vector<char> filled(int rank, size_t count, DType dt, size_t salt = 0) {
  std::vector<char> v(count * dtypeSize(dt));
  for (size_t i = 0; i < count; ++i) setValue(v, i, exactValue(rank, i + salt), dt);
  return v;
}

float valueAt(const std::vector<char>& v, size_t i, DType dt) {
  if (dt == DType::kFloat32) {
    float x;
    std::memcpy(&x, v.data() + 4 * i, 4);
    return x;
  }
  bf16 b;
  std::memcpy(&b, v.data() + 2 * i, 2);
  return toFloat(b);
}

std::vector<Algorithm> allGatherAlgorithms(int n) {
  if (n == 1) return {Algorithm::kLocal};
  std::vector<Algorithm> a = {Algorithm::kRing, Algorithm::kBruck};
  if ((n & (n - 1)) == 0) a.push_back(Algorithm::kRecursiveDoubling);
  return a;
}

std::vector<Algorithm> reduceAlgorithms(int n) {
  if (n == 1) return {Algorithm::kLocal};
  return {Algorithm::kRing, Algorithm::kRecursiveDoubling};
}

TEST(UcxSchedule, AllGatherEveryAlgorithmSizeCountAndPlacement) {
  for (int n : kSizes)
    for (Algorithm a : allGatherAlgorithms(n))
      for (size_t count : kCounts)
        for (DType dt : {DType::kFloat32, DType::kBFloat16})
          for (bool in_place : {false, true}) {
            SCOPED_TRACE(strCat("n=", n, " ", algorithmName(a), " count=", count, " ",
                                dtypeName(dt), in_place ? " in place" : ""));
            const size_t B = count * dtypeSize(dt);
            std::vector<std::vector<char>> send(n), recv(n), scratch(n);
            std::vector<Schedule> s(n);
            for (int r = 0; r < n; ++r) {
              send[r] = filled(r, count, dt);
              recv[r].assign(n * B, 0x5a);
              if (in_place && B > 0) std::memcpy(recv[r].data() + r * B, send[r].data(), B);
              scratch[r].resize(allGatherScratchBytes(a, n, count, dt));
              buildAllGather(s[r], a, r, n, in_place ? recv[r].data() + r * B : send[r].data(),
                             recv[r].data(), count, dt, scratch[r].data());
            }
            ASSERT_TRUE(execute(s));
            for (int r = 0; r < n; ++r)
              for (int q = 0; q < n; ++q)
                ASSERT_TRUE(B == 0 || std::memcmp(recv[r].data() + q * B, send[q].data(), B) == 0)
                    << "rank " << r << " block " << q;
          }
}

// Calls f(n, a, count, dt, op) for every group size, reduction algorithm of that size, count,
// dtype (float32, bfloat16) and op (sum, avg), under a trace naming them; stops at the first
// fatal failure, as the loops written out in a test body would.
template <typename F>
void forEachReduction(F f) {
  for (int n : kSizes)
    for (Algorithm a : reduceAlgorithms(n))
      for (size_t count : kCounts)
        for (DType dt : {DType::kFloat32, DType::kBFloat16})
          for (RedOp op : {RedOp::kSum, RedOp::kAvg}) {
            SCOPED_TRACE(strCat("n=", n, " ", algorithmName(a), " count=", count, " ",
                                dtypeName(dt), " ", redOpName(op)));
            f(n, a, count, dt, op);
            if (::testing::Test::HasFatalFailure()) return;
          }
}

// Elements [0, count) of `buf`, a reduction by `op` over n ranks of exactValue(rank, first + i),
// against the exact result: equal for a sum, within dt's rounding of the division for an
// average. One check per buffer (the first element that differs is named), not one assertion
// per element: the sizes up to 32 ranks make millions of elements, slow under the sanitizers.
::testing::AssertionResult reducedExactly(const std::vector<char>& buf, size_t count, int n,
                                          size_t first, DType dt, RedOp op) {
  const float tol = op == RedOp::kSum ? 0 : (dt == DType::kBFloat16 ? 1e-2f : 1e-6f);
  for (size_t i = 0; i < count; ++i) {
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += exactValue(q, first + i);
    const float want = op == RedOp::kSum ? sum : sum / n;
    const float got = valueAt(buf, i, dt);
    if (!(std::fabs(got - want) <= tol * std::max(1.0f, want)))
      return ::testing::AssertionFailure() << "element " << i << ": " << got << ", want " << want;
  }
  return ::testing::AssertionSuccess();
}

TEST(UcxSchedule, ReduceScatterSumAndAvgEveryAlgorithmSizeAndCount) {
  forEachReduction([](int n, Algorithm a, size_t count, DType dt, RedOp op) {
    std::vector<std::vector<char>> in(n), out(n), scratch(n);
    std::vector<Schedule> s(n);
    for (int r = 0; r < n; ++r) {
      in[r] = filled(r, n * count, dt);
      out[r].assign(count * dtypeSize(dt), 0x5a);
      scratch[r].resize(reduceScatterScratchBytes(a, n, count, dt));
      buildReduceScatter(s[r], a, r, n, in[r].data(), out[r].data(), count, dt, op,
                         scratch[r].data());
    }
    ASSERT_TRUE(execute(s));
    for (int r = 0; r < n; ++r)
      ASSERT_TRUE(reducedExactly(out[r], count, n, r * count, dt, op)) << "rank " << r;
  });
}

TEST(UcxSchedule, AllReduceExactAndBitwiseIdenticalOnEveryRank) {
  forEachReduction([](int n, Algorithm a, size_t count, DType dt, RedOp op) {
    // Exact values: the result equals the sum. Random values: every rank the same bits.
    for (bool random : {false, true}) {
      std::vector<std::vector<char>> buf(n), scratch(n);
      std::vector<Schedule> s(n);
      std::mt19937 gen(n * 1000 + count);
      std::uniform_real_distribution<float> d(-1, 1);
      for (int r = 0; r < n; ++r) {
        buf[r] = filled(r, count, dt);
        if (random)
          for (size_t i = 0; i < count; ++i) setValue(buf[r], i, d(gen), dt);
        scratch[r].resize(allReduceScratchBytes(a, n, count, dt));
        buildAllReduce(s[r], a, r, n, buf[r].data(), count, dt, op, scratch[r].data());
      }
      ASSERT_TRUE(execute(s));
      for (int r = 1; r < n; ++r) ASSERT_EQ(buf[r], buf[0]) << "rank " << r << " differs";
      if (random) continue;
      ASSERT_TRUE(reducedExactly(buf[0], count, n, 0, dt, op));
    }
  });
}

TEST(UcxSchedule, IntegerSums) {
  const int n = 5;
  std::vector<std::vector<int64_t>> buf(n, std::vector<int64_t>(9));
  std::vector<std::vector<char>> scratch(n);
  std::vector<Schedule> s(n);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < 9; ++i) buf[r][i] = (int64_t(1) << 40) * (r + 1) + i;
    scratch[r].resize(allReduceScratchBytes(Algorithm::kRing, n, 9, DType::kInt64));
    buildAllReduce(s[r], Algorithm::kRing, r, n, buf[r].data(), 9, DType::kInt64, RedOp::kSum,
                   scratch[r].data());
  }
  ASSERT_TRUE(execute(s));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < 9; ++i) ASSERT_EQ(buf[r][i], (int64_t(1) << 40) * 15 + 5 * int64_t(i));
}

TEST(UcxSchedule, BroadcastFromEveryRootAndBarrier) {
  for (int n : kSizes) {
    for (int root = 0; root < n; ++root) {
      SCOPED_TRACE(strCat("n=", n, " root=", root));
      std::vector<std::vector<int>> buf(n, std::vector<int>(33));
      std::vector<Schedule> s(n);
      for (int r = 0; r < n; ++r) {
        for (int& x : buf[r]) x = r == root ? 1000 + root : -1;
        buildBroadcast(s[r], r, n, buf[r].data(), 33 * sizeof(int), root);
      }
      ASSERT_TRUE(execute(s));
      for (int r = 0; r < n; ++r)
        for (int x : buf[r]) ASSERT_EQ(x, 1000 + root) << "rank " << r;
    }
    std::vector<char> token(n);
    std::vector<Schedule> s(n);
    for (int r = 0; r < n; ++r) buildBarrier(s[r], r, n, &token[r]);
    ASSERT_TRUE(execute(s));
  }
}

// All-to-all: block j of rank r lands at block r of rank j, for every size and count.
TEST(UcxSchedule, AllToAllDeliversEveryBlockToItsRank) {
  for (int n : kSizes) {
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat("n=", n, " count=", count));
      std::vector<std::vector<int>> send(n, std::vector<int>(n * count)), recv(send);
      std::vector<Schedule> s(n);
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < send[r].size(); ++i) send[r][i] = int(1000000 * r + i);
        buildAllToAll(s[r], r, n, send[r].data(), recv[r].data(), count, DType::kInt32);
      }
      ASSERT_TRUE(execute(s));
      for (int r = 0; r < n; ++r)
        for (int j = 0; j < n; ++j)
          for (size_t i = 0; i < count; ++i)
            ASSERT_EQ(recv[r][j * count + i], send[j][r * count + i]) << "rank " << r;
    }
  }
}

TEST(UcxSchedule, ChoosesLogarithmicAlgorithmsForSmallMessagesOnly) {
  EXPECT_EQ(chooseAllGather(1, 1000, DType::kFloat32, 0), Algorithm::kLocal);
  EXPECT_EQ(chooseAllGather(8, 10, DType::kFloat32, 1024), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(chooseAllGather(6, 10, DType::kFloat32, 1024), Algorithm::kBruck);
  EXPECT_EQ(chooseAllGather(6, 1000, DType::kFloat32, 1024), Algorithm::kRing);
  EXPECT_EQ(chooseReduceScatter(6, 10, DType::kBFloat16, 1024), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(chooseReduceScatter(6, 100, DType::kBFloat16, 1024), Algorithm::kRing);
  EXPECT_EQ(chooseAllReduce(6, 256, DType::kFloat32, 1024), Algorithm::kRecursiveDoubling);
  EXPECT_EQ(chooseAllReduce(6, 257, DType::kFloat32, 1024), Algorithm::kRing);
  // Fewer elements than ranks: ring blocks would be empty, so recursive doubling at any size.
  EXPECT_EQ(chooseAllReduce(8, 7, DType::kFloat32, 0), Algorithm::kRecursiveDoubling);
}

}  // namespace
}  // namespace hsdp::ucx
