// Shared by the CPU Adam tests (cpu_adam_test.cc, cpu_adam_config_test.cc: one binary): bitwise
// comparisons that report the ULP distance of the first mismatches, one shard's arrays at chosen
// (mis)alignments, and the optimizer and settings the tests step with.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>

#include "core/adam.h"
#include "core/host_buffer.h"
#include "hsdp/dtype.h"
#include "offload/cpu_adam.h"

namespace hsdp::cpu_adam_testing {

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Distance in units in the last place (0 for equal values; +0 and -0 are 0 apart).
inline int64_t ulpDistance(float a, float b) {
  auto ordered = [](float f) -> int64_t {
    const int32_t i = static_cast<int32_t>(bits(f));
    return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : i;
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// Expects got == want bit for bit; reports the first mismatches with their ULP distance.
inline ::testing::AssertionResult sameBits(const char* what, const float* got, const float* want,
                                           size_t n) {
  size_t bad = 0;
  int64_t worst = 0;
  std::string first;
  for (size_t i = 0; i < n; ++i) {
    if (bits(got[i]) == bits(want[i])) continue;
    worst = std::max(worst, ulpDistance(got[i], want[i]));
    if (bad++ < 5)
      first += strCat("\n  ", what, "[", i, "]: got ", got[i], " want ", want[i], " (",
                      ulpDistance(got[i], want[i]), " ulp)");
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << n << " elements of " << what
                                       << " differ, worst " << worst << " ulp:" << first;
}

inline ::testing::AssertionResult sameBf16(const bf16* got, const bf16* want, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (got[i].bits != want[i].bits)
      return ::testing::AssertionFailure() << "bf16[" << i << "]: got 0x" << std::hex << got[i].bits
                                           << " want 0x" << want[i].bits;
  return ::testing::AssertionSuccess();
}

// One shard's arrays in page-aligned memory, each starting `offset` floats past a 64-byte
// boundary, so tests choose the (mis)alignment of every pointer.
struct Offsets {
  size_t param = 0, grad = 0, m = 0, v = 0, bf16 = 0;
};

class Shard {
 public:
  Shard(size_t n, Offsets off) : n_(n), off_(off) {
    const size_t floats = n + 64;
    param_buf_ = std::move(HostBuffer::allocate(floats * 4).value());
    grad_buf_ = std::move(HostBuffer::allocate(floats * 4).value());
    m_buf_ = std::move(HostBuffer::allocate(floats * 4).value());
    v_buf_ = std::move(HostBuffer::allocate(floats * 4).value());
    bf16_buf_ = std::move(HostBuffer::allocate(floats * 2).value());
  }
  // Random state of a run in progress: parameters of mixed magnitude, gradients from tiny to
  // large (so that eps matters for some elements and not for others), non-negative v.
  void fillRandom(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::uniform_int_distribution<int> mag(-8, 2);
    for (size_t i = 0; i < n_; ++i) {
      const float g = u(rng) * std::ldexp(1.0f, 2 * mag(rng));
      param()[i] = u(rng) * std::ldexp(1.0f, mag(rng));
      grad()[i] = g;
      m()[i] = 0.5f * g + 1e-3f * u(rng);
      v()[i] = g * g * (0.5f + 0.5f * std::fabs(u(rng)));
      bf16out()[i].bits = 0xdead;
    }
  }
  void copyFrom(const Shard& o) {
    std::memcpy(param(), o.param(), n_ * 4);
    std::memcpy(grad(), o.grad(), n_ * 4);
    std::memcpy(m(), o.m(), n_ * 4);
    std::memcpy(v(), o.v(), n_ * 4);
    std::memcpy(bf16out(), o.bf16out(), n_ * 2);
  }
  float* param() const { return param_buf_.as<float>() + off_.param; }
  float* grad() const { return grad_buf_.as<float>() + off_.grad; }
  float* m() const { return m_buf_.as<float>() + off_.m; }
  float* v() const { return v_buf_.as<float>() + off_.v; }
  bf16* bf16out() const { return bf16_buf_.as<bf16>() + off_.bf16; }
  AdamShard view(bool with_bf16) const {
    return AdamShard{param(), grad(), m(), v(), n_, with_bf16 ? bf16out() : nullptr};
  }
  size_t n() const { return n_; }

 private:
  size_t n_;
  Offsets off_;
  HostBuffer param_buf_, grad_buf_, m_buf_, v_buf_, bf16_buf_;
};

inline std::unique_ptr<CpuAdam> makeAdam(CpuIsa isa, int threads) {
  auto a = CpuAdam::create({.isa = isa, .threads = threads});
  EXPECT_TRUE(a.ok()) << a.status().toString();
  return std::move(a).value();
}

inline AdamConfig config(OptimizerKind kind) {
  AdamConfig c;
  c.kind = kind;
  c.lr = 3e-3f;
  c.weight_decay = 0.05f;
  c.eps = 1e-8f;
  return c;
}

}  // namespace hsdp::cpu_adam_testing
