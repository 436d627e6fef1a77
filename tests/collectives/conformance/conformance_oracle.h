// The conformance suite's ground (conformance_suite.h says what the suite is): a communicator
// under test with its MPI twin, where a backend's buffers live (host or device), what of the
// contract a backend does (Contract), a buffer with a guard element behind it, the test values
// (small integers exact under any summation order, random floats), and the oracle: MPI's own
// collectives on the twin, compared bit for bit or within rounding.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "hsdp/dtype.h"
#include "hsdp/parse.h"
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

// What a backend's Comm does of the contract: every backend derives from this and redeclares
// what it leaves out (or, kRuns, has).
struct Contract {
  static constexpr bool kBroadcast = true;            // broadcast() and barrier()
  static constexpr bool kRejectsBadArguments = true;  // bad arguments are an error up front
  static constexpr bool kAllToAll = true;             // iallToAll
  static constexpr bool kRuns = false;                // ireduceScatterRuns of its own
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

// x as To, through float where either side is bf16 (rounded to bf16 on the way there).
template <typename To, typename From>
To convertValue(From x) {
  if constexpr (std::is_same_v<To, bf16>)
    return toBf16(static_cast<float>(x));
  else if constexpr (std::is_same_v<From, bf16>)
    return static_cast<To>(toFloat(x));
  else
    return static_cast<To>(x);
}
template <typename T>
T fromFloat(float x) {
  return convertValue<T>(x);
}
template <typename T>
float asFloat(T x) {
  return convertValue<float>(x);
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

// A count from the environment, or `fallback` when the variable is unset. A bad value ends the
// suite naming it.
inline size_t envCount(const char* name, size_t fallback, size_t min) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  auto n = parseInteger<size_t>(v, name, min, size_t{1} << 24);
  if (!n.ok()) {
    std::fprintf(stderr, "%s\n", n.status().message().c_str());
    std::_Exit(2);  // not exit(): MPI's threads are running
  }
  return *n;
}

// float's large count: 100003, or HSDP_CONFORMANCE_FLOAT_LARGE (20011, the other types' large
// count, in the sanitizer passes (scripts/sanitize) and in the release layouts that do not run
// the whole sweep (tests/collectives/CMakeLists.txt): still past every large-message path: UCX's
// ring above HSDP_UCX_SMALL_BYTES = 32 KiB, pipelined chunks, more than one 64 KiB
// cross-memory-attach tile per block).
inline size_t largeFloatCount() { return envCount("HSDP_CONFORMANCE_FLOAT_LARGE", 100003, 1001); }

// The longest run of the collectives of runs (conformance_runs.h; its stride is a quarter
// longer, plus one): 40000, or HSDP_CONFORMANCE_RUN_LARGE (17011 in the release layouts that do
// not run the whole sweep: over one 64 KiB cross-memory-attach tile of floats and UCX's 32 KiB
// small-message limit; the sanitizer passes keep 40000, bf16 runs over a tile included).
inline size_t largeRun() { return envCount("HSDP_CONFORMANCE_RUN_LARGE", 40000, 1001); }

// Element counts: odd, uneven, and one large enough for every transport's large-message path
// (pipelined chunks, rings); float gets the largest, the other types a smaller large one.
template <typename T = float>
const std::vector<size_t>& counts() {
  static const std::vector<size_t> c = std::is_same_v<T, float>
                                           ? std::vector<size_t>{1, 7, 1000, largeFloatCount()}
                                           : std::vector<size_t>{1, 7, 1000, 20011};
  return c;
}

}  // namespace hsdp::conformance
