// The transport conformance suite: one set of tests that every implementation of the Comm
// contract (include/hsdp/transport.h) passes, against the MPI library's own collectives as the
// oracle. A backend is a type with
//
//   static const char* name();
//   static std::string unavailable();         // "" when it runs here, else why (tests skip)
//   static std::vector<Case>& cases();        // communicators under test, each with its oracle
//   static Memory& memory();                  // where its buffers live (host or device)
//   static constexpr bool kBroadcast;         // broadcast() and barrier() are part of it
//   static constexpr bool kRejectsBadArguments;  // bad arguments are an error before anything
//                                             // starts (a schedule composed of others defers to
//                                             // its levels)
//   static constexpr bool kAllToAll;          // optional: iallToAll is part of it (default false)
//   static constexpr bool kRuns;              // optional: ireduceScatterRuns is (default false;
//                                             // host memory: the default packs on the host)
//
// and an instantiation, e.g. INSTANTIATE_TYPED_TEST_SUITE_P(Mpi, Conformance, MpiBackend):
// tests/collectives/conformance/host_backends_test.cc (MPI, UCX, hierarchical) and
// tests/gpu/nccl_conformance_test.cc (NCCL, on device memory). Inputs are small integers where
// the comparison is exact (any summation order gives the exact sum, in float, bf16 and int32 for
// up to 8 ranks), random floats where it is within rounding. Every result buffer has a guard
// element behind it that must stay untouched.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "hsdp/dtype.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"
#include "tests/common/status_assert.h"

namespace hsdp::conformance {

// A communicator under test and the MPI communicator over the same members in the same rank
// order, on which the oracle's collectives run (host memory).
struct Case {
  std::string name;
  Comm* comm = nullptr;
  MPI_Comm oracle = MPI_COMM_NULL;
};

// Where a backend's buffers live.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
};

class HostMemory : public Memory {
 public:
  void* allocate(size_t bytes) override { return ::operator new(std::max<size_t>(bytes, 1)); }
  void release(void* p) override { ::operator delete(p); }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
};

// n elements of T in a backend's memory plus one guard element, filled from the host.
template <typename T>
class Buffer {
 public:
  Buffer(Memory& m, const std::vector<T>& host, T guard) : m_(m), n_(host.size()) {
    p_ = static_cast<T*>(m_.allocate((n_ + 1) * sizeof(T)));
    std::vector<T> staged = host;
    staged.push_back(guard);
    m_.upload(p_, staged.data(), staged.size() * sizeof(T));
  }
  Buffer(Memory& m, size_t n, T fill) : Buffer(m, std::vector<T>(n, fill), fill) {}
  ~Buffer() { m_.release(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data() { return p_; }
  std::vector<T> read() const {  // the n elements, then the guard
    std::vector<T> h(n_ + 1);
    m_.download(h.data(), p_, h.size() * sizeof(T));
    return h;
  }

 private:
  Memory& m_;
  size_t n_;
  T* p_ = nullptr;
};

// ---- values, types, oracle ----------------------------------------------------------------------

inline float exactValue(int seed, size_t i) { return float(((seed + 1) * (i % 13 + 3)) % 17 % 9); }

inline std::vector<float> randomValues(int seed, size_t n) {
  std::mt19937 gen(1234 + seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

template <typename T>
T fromFloat(float x) {
  if constexpr (std::is_same_v<T, bf16>)
    return toBf16(x);
  else
    return static_cast<T>(x);
}
template <typename T>
float asFloat(T x) {
  if constexpr (std::is_same_v<T, bf16>)
    return toFloat(x);
  else
    return static_cast<float>(x);
}

template <typename T>
std::vector<T> exactValues(int seed, size_t n, int offset = 0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = fromFloat<T>(exactValue(seed, i) - float(offset));
  return v;
}

template <typename T>
DType dtypeOf() {
  if constexpr (std::is_same_v<T, float>)
    return DType::kFloat32;
  else if constexpr (std::is_same_v<T, bf16>)
    return DType::kBFloat16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::kInt64;
}

// The oracle works in float for bf16 (the exact values are exact in both) and in T otherwise.
template <typename T>
using OracleT = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

template <typename T>
MPI_Datatype mpiTypeOf() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, int64_t>)
    return MPI_INT64_T;
}

template <typename T>
std::vector<OracleT<T>> toOracle(const std::vector<T>& v) {
  std::vector<OracleT<T>> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>)
      o[i] = toFloat(v[i]);
    else
      o[i] = v[i];
  }
  return o;
}

template <typename T>
bool sameBits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <typename T>
T expectedAs(OracleT<T> w) {
  if constexpr (std::is_same_v<T, bf16>)
    return toBf16(w);
  else
    return w;
}

// The n result elements of `got` equal `want` exactly (bit for bit in T) and the guard held.
template <typename T>
::testing::AssertionResult exactly(const std::vector<T>& got, const std::vector<OracleT<T>>& want,
                                   T guard) {
  if (got.size() != want.size() + 1)
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size() + 1;
  for (size_t i = 0; i < want.size(); ++i)
    if (!sameBits(got[i], expectedAs<T>(want[i])))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << asFloat(got[i]) << ", MPI says " << float(want[i]);
  if (!sameBits(got.back(), guard))
    return ::testing::AssertionFailure() << "wrote past the end (guard " << asFloat(guard)
                                         << " became " << asFloat(got.back()) << ")";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult near(const std::vector<float>& got,
                                       const std::vector<float>& want, float rel, float abs,
                                       float guard) {
  if (got.size() != want.size() + 1) return ::testing::AssertionFailure() << "size";
  for (size_t i = 0; i < want.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= abs + rel * std::fabs(want[i])))
      return ::testing::AssertionFailure()
             << "element " << i << ": " << got[i] << ", MPI says " << want[i];
  if (!sameBits(got.back(), guard)) return ::testing::AssertionFailure() << "wrote past the end";
  return ::testing::AssertionSuccess();
}

inline std::vector<float> asFloats(const std::vector<bf16>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = toFloat(v[i]);
  return f;
}

template <typename T>
std::vector<OracleT<T>> mpiAllGather(const std::vector<T>& mine, MPI_Comm c) {
  int n = 0;
  MPI_Comm_size(c, &n);
  const std::vector<OracleT<T>> in = toOracle(mine);
  std::vector<OracleT<T>> out(in.size() * n);
  MPI_Allgather(in.data(), int(in.size()), mpiTypeOf<OracleT<T>>(), out.data(), int(in.size()),
                mpiTypeOf<OracleT<T>>(), c);
  return out;
}

template <typename T>
std::vector<OracleT<T>> mpiReduceScatter(const std::vector<T>& full, size_t count, MPI_Comm c) {
  const std::vector<OracleT<T>> in = toOracle(full);
  std::vector<OracleT<T>> out(count);
  MPI_Reduce_scatter_block(in.data(), out.data(), int(count), mpiTypeOf<OracleT<T>>(), MPI_SUM, c);
  return out;
}

template <typename T>
std::vector<OracleT<T>> mpiAllReduce(const std::vector<T>& v, MPI_Comm c) {
  const std::vector<OracleT<T>> in = toOracle(v);
  std::vector<OracleT<T>> out(in.size());
  MPI_Allreduce(in.data(), out.data(), int(in.size()), mpiTypeOf<OracleT<T>>(), MPI_SUM, c);
  return out;
}

inline int worldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Element counts: odd, uneven, and one large enough for every transport's large-message path
// (pipelined chunks, rings); float gets the largest, the other types a smaller large one.
template <typename T = float>
const std::vector<size_t>& counts() {
  static const std::vector<size_t> c = std::is_same_v<T, float>
                                           ? std::vector<size_t>{1, 7, 1000, 100003}
                                           : std::vector<size_t>{1, 7, 1000, 20011};
  return c;
}

// ---- the suite ----------------------------------------------------------------------------------

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

template <typename Backend>
constexpr bool hasAllToAll() {
  if constexpr (requires { Backend::kAllToAll; })
    return Backend::kAllToAll;
  else
    return false;
}

template <typename Backend>
constexpr bool hasRuns() {
  if constexpr (requires { Backend::kRuns; })
    return Backend::kRuns;
  else
    return false;
}

// A reduce-scatter of non-contiguous blocks (ireduceScatterRuns, how the hierarchical schedules
// reduce a chunk of every shard in place) against MPI_Reduce_scatter_block of the same blocks
// packed by the test: exact on small integers in float, bf16 and int32; random floats bit for bit
// equal to the backend's own reduce-scatter of the packed blocks (the same sums) and within
// rounding of MPI's, sum and avg; odd run lengths and strides, one run per block (contiguous but
// for the gap), runs longer than a tile of the cross-memory-attach path; the input untouched.
TYPED_TEST_P(Conformance, ReduceScatterRunsMatchesMpiOfThePackedBlocks) {
  if (!hasRuns<TypeParam>()) GTEST_SKIP() << TypeParam::name() << " has no reduce-scatter of runs";
  struct Layout {
    size_t run, runs, stride;
  };
  const Layout layouts[] = {{0, 2, 5},       {1, 1, 1},      {7, 1, 9},
                            {1000, 2, 1500}, {101, 3, 4099}, {40000, 2, 50001}};
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
  const Layout layouts[] = {{0, 2, 5},       {1, 1, 1},      {7, 1, 9},        {3, 4, 3},
                            {1000, 2, 1500}, {101, 3, 4099}, {40000, 2, 50001}};
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

// All-to-all (the quantized reduce-scatter's exchange) against MPI_Alltoall: every block at its
// rank, bit for bit, as raw bytes and as int32, with guards behind the result.
TYPED_TEST_P(Conformance, AllToAllMatchesMpi) {
  if (!hasAllToAll<TypeParam>()) GTEST_SKIP() << TypeParam::name() << " has no all-to-all";
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

REGISTER_TYPED_TEST_SUITE_P(
    Conformance, AllGatherMatchesMpiOutOfAndInPlace, ReduceScatterSumIsExactOnIntegers,
    ReduceScatterOfRandomValuesSumAndAvg, AllReduceSumIsExactAndAvgWithinRounding,
    AllReduceOfRandomValuesIsBitwiseIdenticalOnEveryRank, BroadcastFromEveryRootAndBarrier,
    AllToAllMatchesMpi, ReduceScatterRunsMatchesMpiOfThePackedBlocks,
    AllGatherRunsMatchesMpiAllgatherPlacedInRuns, ManyOutstandingHandlesCompleteInAnyOrder,
    GroupOfMixedOperationsMatchesMpi, BadArgumentsAndDependentGroupsAreRejected);

}  // namespace hsdp::conformance
