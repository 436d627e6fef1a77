// CPU Adam (offload/cpu_adam.h) against independent truths:
//  - hsdp::adamStep (core/optimizer.cc), the engine's reference step, for the scalar path;
//  - the scalar path, element by element, for every vector ISA this CPU runs, at every thread
//    count, on random data with odd lengths and unaligned, mutually misaligned pointers;
//  - hsdp::toBf16 (include/hsdp/dtype.h) for the bf16 copy-out, special values included;
//  - closed forms (constant gradient, pure decoupled decay) for the whole update.
//
// The bound for "same as scalar" is 0 ULP, i.e. bitwise equality, and that is not optimism:
// every path performs the same IEEE-754 single-precision operations (*, +, -, /, sqrt, each
// correctly rounded, in scalar SSE as in AVX2/AVX-512 lanes) in the same order, with no FMA
// contraction (the kernels are built with -ffp-contract=off and use no FMA or rsqrt/rcp
// approximations). Threads only split the index range. A mismatch report still prints the ULP
// distance, which tells a reordering (a few ULP) from a wrong formula or element (far more).
// A future kernel that fuses (FMA) would change the bound to a few ULP of the intermediate terms
// and must say so here.
#include "offload/cpu_adam.h"

#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/adam.h"
#include "core/host_buffer.h"
#include "hsdp/dtype.h"
#include "offload/cpu_adam_internal.h"
#include "offload/cpu_adam_kernels.h"
#include "offload/worker_pool.h"
#include "tests/common/scoped_env.h"

namespace hsdp {
namespace {

std::string isaList() {
  std::string s;
  for (CpuIsa isa : supportedCpuIsas()) s += strCat(s.empty() ? "" : " ", cpuIsaName(isa));
  return s;
}

// Prints, once, which paths this machine exercises (the report of what could not run).
class IsaReport : public ::testing::Environment {
 public:
  void SetUp() override {
    std::printf("[ cpu_adam ] ISA paths exercised on this CPU: %s\n", isaList().c_str());
    for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2})
      if (!cpuIsaSupported(isa))
        std::printf("[ cpu_adam ] NOT exercised (CPU or build lacks it): %s\n", cpuIsaName(isa));
  }
};
const auto* const kIsaReport = ::testing::AddGlobalTestEnvironment(new IsaReport);

using testing::ScopedEnv;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Distance in units in the last place (0 for equal values; +0 and -0 are 0 apart).
int64_t ulpDistance(float a, float b) {
  auto ordered = [](float f) -> int64_t {
    const int32_t i = static_cast<int32_t>(bits(f));
    return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : i;
  };
  const int64_t d = ordered(a) - ordered(b);
  return d < 0 ? -d : d;
}

// Expects got == want bit for bit; reports the first mismatches with their ULP distance.
::testing::AssertionResult sameBits(const char* what, const float* got, const float* want,
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
  return ::testing::AssertionFailure()
         << bad << " of " << n << " elements of " << what << " differ, worst " << worst
         << " ulp:" << first;
}

::testing::AssertionResult sameBf16(const bf16* got, const bf16* want, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (got[i].bits != want[i].bits)
      return ::testing::AssertionFailure() << "bf16[" << i << "]: got 0x" << std::hex
                                           << got[i].bits << " want 0x" << want[i].bits;
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

std::unique_ptr<CpuAdam> makeAdam(CpuIsa isa, int threads) {
  auto a = CpuAdam::create({.isa = isa, .threads = threads});
  EXPECT_TRUE(a.ok()) << a.status().toString();
  return std::move(a).value();
}

AdamConfig config(OptimizerKind kind) {
  AdamConfig c;
  c.kind = kind;
  c.lr = 3e-3f;
  c.weight_decay = 0.05f;
  c.eps = 1e-8f;
  return c;
}

// ---- the scalar path is hsdp::adamStep -------------------------------------------------------

TEST(CpuAdam, ScalarPathIsAdamStepBitForBit) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    SCOPED_TRACE(optimizerName(kind));
    const AdamConfig cfg = config(kind);
    Shard a(1001, {}), ref(1001, {});
    a.fillRandom(7);
    ref.copyFrom(a);
    auto adam = makeAdam(CpuIsa::kScalar, 1);
    for (int64_t t = 1; t <= 3; ++t) {
      ASSERT_TRUE(adam->step(cfg, t, a.view(false)).ok());
      adamStep(cfg, t, ref.param(), ref.grad(), ref.m(), ref.v(), ref.n());
    }
    EXPECT_TRUE(sameBits("param", a.param(), ref.param(), a.n()));
    EXPECT_TRUE(sameBits("exp_avg", a.m(), ref.m(), a.n()));
    EXPECT_TRUE(sameBits("exp_avg_sq", a.v(), ref.v(), a.n()));
  }
}

// ---- every ISA, thread count, length and alignment against the scalar path -------------------

struct Case {
  size_t n;
  Offsets off;
  int threads;
};

TEST(CpuAdam, EveryIsaMatchesScalarElementByElement) {
  // Odd lengths around the vector widths (8, 16) and one long shard split over threads; the
  // pointers start 1-3 floats past 64-byte boundaries, each differently, so heads, tails and
  // unaligned full-width loads all occur; one case has everything aligned.
  // A shard larger than the last-level cache takes the streaming-store path for the bf16 copy
  // (where the copy is aligned, as in the all-aligned case); capped so the test stays quick on
  // machines with huge caches, where that path then goes untested (printed).
  const size_t stream_n = cpu_adam_detail::bf16StreamThresholdBytes() / 30 + 1001;
  const Offsets skew{1, 3, 0, 2, 5};
  std::vector<Case> cases = {
      {1, skew, 1},   {7, skew, 1},   {15, skew, 1},       {17, skew, 1},
      {33, {}, 1},    {100, skew, 2}, {1000003, skew, 3},  {1000003, {}, 2},
  };
  if (stream_n <= 4'000'000) cases.push_back({stream_n | 1, {}, 2});
  else std::printf("[ cpu_adam ] streaming bf16 stores not exercised: LLC too large\n");
  for (const Case& cs : cases) {
    // The random state is generated once per case; every combination starts from a copy.
    Shard base(cs.n, {});
    base.fillRandom(static_cast<uint32_t>(cs.n));
    Shard got(cs.n, cs.off), want(cs.n, {});
    for (CpuIsa isa : supportedCpuIsas()) {
      auto adam = makeAdam(isa, cs.threads);
      auto ref = makeAdam(CpuIsa::kScalar, 1);
      for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
        for (float scale : {1.0f, 0.37f}) {
          for (bool with_bf16 : {false, true}) {
            SCOPED_TRACE(strCat(cpuIsaName(isa), " ", optimizerName(kind), " scale=", scale,
                                " bf16=", with_bf16, " n=", cs.n, " threads=", cs.threads,
                                " param offset=", cs.off.param));
            const AdamConfig cfg = config(kind);
            got.copyFrom(base);
            want.copyFrom(base);
            // Two consecutive steps from a random mid-training state.
            for (int64_t t = 5; t <= 6; ++t) {
              ASSERT_TRUE(adam->step(cfg, t, got.view(with_bf16), scale).ok());
              ASSERT_TRUE(ref->step(cfg, t, want.view(with_bf16), scale).ok());
            }
            ASSERT_TRUE(sameBits("param", got.param(), want.param(), cs.n));
            ASSERT_TRUE(sameBits("exp_avg", got.m(), want.m(), cs.n));
            ASSERT_TRUE(sameBits("exp_avg_sq", got.v(), want.v(), cs.n));
            if (with_bf16) {
              ASSERT_TRUE(sameBf16(got.bf16out(), want.bf16out(), cs.n));
              // And the copy-out is the bf16 rounding of the parameter it just wrote.
              for (size_t i = 0; i < cs.n; ++i)
                ASSERT_EQ(got.bf16out()[i].bits, toBf16(got.param()[i]).bits) << i;
            }
          }
        }
      }
    }
  }
}

TEST(CpuAdam, ThreadCountDoesNotChangeBits) {
  const CpuIsa isa = supportedCpuIsas().front();
  const AdamConfig cfg = config(OptimizerKind::kAdamW);
  const size_t n = 5 * CpuAdam::kMinElementsPerThread + 12345;
  Shard base(n, {3, 0, 1, 2, 7});
  base.fillRandom(99);
  Shard want(n, {});
  want.copyFrom(base);
  ASSERT_TRUE(makeAdam(isa, 1)->step(cfg, 2, want.view(true), 0.5f).ok());
  for (int threads : {2, 3, 5, 8}) {
    SCOPED_TRACE(strCat("threads=", threads));
    Shard got(n, {3, 0, 1, 2, 7});
    got.copyFrom(base);
    ASSERT_TRUE(makeAdam(isa, threads)->step(cfg, 2, got.view(true), 0.5f).ok());
    EXPECT_TRUE(sameBits("param", got.param(), want.param(), n));
    EXPECT_TRUE(sameBits("exp_avg", got.m(), want.m(), n));
    EXPECT_TRUE(sameBits("exp_avg_sq", got.v(), want.v(), n));
    EXPECT_TRUE(sameBf16(got.bf16out(), want.bf16out(), n));
  }
}

// The workers adopt the caller's floating-point environment: under round-upward, the split run
// equals the one-thread run, and both differ from round-to-nearest (so the mode took effect).
TEST(CpuAdam, WorkersComputeInTheCallersRoundingMode) {
  const CpuIsa isa = supportedCpuIsas().front();
  const AdamConfig cfg = config(OptimizerKind::kAdam);
  const size_t n = 4 * CpuAdam::kMinElementsPerThread;
  Shard base(n, {});
  base.fillRandom(5);
  Shard nearest(n, {}), up1(n, {}), up4(n, {});
  nearest.copyFrom(base);
  up1.copyFrom(base);
  up4.copyFrom(base);
  auto one = makeAdam(isa, 1);
  auto four = makeAdam(isa, 4);
  ASSERT_TRUE(one->step(cfg, 3, nearest.view(false)).ok());
  ASSERT_EQ(std::fesetround(FE_UPWARD), 0);
  const Status s1 = one->step(cfg, 3, up1.view(false));
  const Status s4 = four->step(cfg, 3, up4.view(false));
  std::fesetround(FE_TONEAREST);
  ASSERT_TRUE(s1.ok() && s4.ok());
  EXPECT_TRUE(sameBits("param", up4.param(), up1.param(), n));
  EXPECT_FALSE(sameBits("param", up1.param(), nearest.param(), n));
}

// ---- bf16 copy-out on values chosen to stress the rounding ------------------------------------

TEST(CpuAdam, Bf16CopyOutIsToBf16IncludingSpecialValues) {
  // AdamW with weight decay 0, zero gradient and zero moments leaves p unchanged (p * 1 - 0 / eps)
  // except that arithmetic quiets a signalling NaN, so the copy-out must be toBf16 of these very
  // values. (bf16Bits of a signalling NaN itself is covered by the sweep below.)
  const uint32_t special[] = {
      0x3f808000u,  // 1.00390625: a tie, rounds down to even 0x3f80
      0x3f818000u,  // a tie that rounds up to even 0x3f82
      0x3f808001u,  // just above a tie: rounds up
      0x7f7fffffu,  // largest float: rounds to +inf
      0x00000001u,  // smallest denormal (AVX512_BF16 hardware would flush it)
      0x807fffffu,  // largest negative denormal
      0x80000000u,  // -0
      0x7f800000u,  // +inf
      0xff800000u,  // -inf
      0x7fc00000u,  // quiet NaN
      0x7f800001u,  // signalling NaN: must come out a NaN, not inf
      0xffffffffu,  // negative NaN with full payload
  };
  const size_t n = 37;  // head, one AVX-512 vector and a tail at offset 1
  AdamConfig cfg;
  cfg.kind = OptimizerKind::kAdamW;
  cfg.weight_decay = 0.0f;
  for (CpuIsa isa : supportedCpuIsas()) {
    SCOPED_TRACE(cpuIsaName(isa));
    Shard s(n, {1, 1, 1, 1, 1});
    std::vector<float> before(n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t u = special[i % std::size(special)];
      std::memcpy(&s.param()[i], &u, 4);
      before[i] = s.param()[i];
      s.grad()[i] = s.m()[i] = s.v()[i] = 0.0f;
    }
    ASSERT_TRUE(makeAdam(isa, 1)->step(cfg, 1, s.view(true)).ok());
    for (size_t i = 0; i < n; ++i) {
      if (std::isnan(before[i])) {
        EXPECT_TRUE(std::isnan(s.param()[i])) << i;
        EXPECT_EQ(bits(s.param()[i]), bits(before[i]) | 0x00400000u) << i;  // quieted
      } else {
        EXPECT_EQ(bits(s.param()[i]), bits(before[i])) << i;
      }
      EXPECT_EQ(s.bf16out()[i].bits, toBf16(s.param()[i]).bits)
          << i << ": 0x" << std::hex << bits(s.param()[i]);
    }
  }
  // The two rounding functions agree on their own as well, on every high half and a spread of
  // low halves (ties, neighbours of ties, extremes).
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      float f;
      const uint32_t u = hi << 16 | lo;
      std::memcpy(&f, &u, 4);
      ASSERT_EQ(cpu_adam_detail::bf16Bits(f), toBf16(f).bits) << std::hex << u;
    }
}

// ---- closed forms ----------------------------------------------------------------------------

// Constant gradient g, scale s, Adam without decay: m_t = (1 - b1^t) gs, v_t = (1 - b2^t) (gs)^2,
// and every bias-corrected update is lr * gs / (|gs| + eps), so p_t = p_0 - t lr gs / (|gs| + eps).
TEST(CpuAdam, ConstantGradientClosedFormEveryIsa) {
  AdamConfig cfg;
  cfg.kind = OptimizerKind::kAdam;
  cfg.lr = 0.01f;
  cfg.eps = 1e-8f;
  const float scale = 0.5f;
  const size_t n = 4099;
  const int steps = 50;
  for (CpuIsa isa : supportedCpuIsas()) {
    SCOPED_TRACE(cpuIsaName(isa));
    Shard s(n, {2, 1, 0, 3, 0});
    std::vector<double> p0(n);
    for (size_t i = 0; i < n; ++i) {
      s.grad()[i] = (i % 2 ? 1.0f : -1.0f) * std::ldexp(1.0f + i % 7, static_cast<int>(i % 9) - 6);
      s.param()[i] = static_cast<float>(i % 13) - 6.0f;
      s.m()[i] = s.v()[i] = 0.0f;
      p0[i] = s.param()[i];
    }
    auto adam = makeAdam(isa, 2);
    for (int t = 1; t <= steps; ++t) ASSERT_TRUE(adam->step(cfg, t, s.view(false), scale).ok());
    for (size_t i = 0; i < n; ++i) {
      const double gs = static_cast<double>(s.grad()[i]) * scale;
      const double p = p0[i] - steps * cfg.lr * gs / (std::fabs(gs) + cfg.eps);
      // The betas as the float values the step uses (0.999f is 0.99900001...; 1 - beta2 is
      // then exact in float, so the geometric sum telescopes with these values).
      const double m = (1.0 - std::pow(static_cast<double>(cfg.beta1), steps)) * gs;
      const double v = (1.0 - std::pow(static_cast<double>(cfg.beta2), steps)) * gs * gs;
      // fp32 rounding accumulated over 50 steps: ~ulp(p) per step plus the moments' relative
      // rounding (~1e-7 per step) carried into the update; 2e-5 as in tests/engine.
      ASSERT_NEAR(s.param()[i], p, 2e-5) << i;
      ASSERT_NEAR(s.m()[i], m, 1e-5 * std::fabs(m)) << i;
      ASSERT_NEAR(s.v()[i], v, 1e-5 * v) << i;
    }
  }
}

// AdamW with zero gradient only decays: p_t = p_0 (1 - lr wd)^t.
TEST(CpuAdam, DecoupledDecayClosedFormEveryIsa) {
  AdamConfig cfg;
  cfg.kind = OptimizerKind::kAdamW;
  cfg.lr = 0.1f;
  cfg.weight_decay = 0.5f;
  const size_t n = 19;
  for (CpuIsa isa : supportedCpuIsas()) {
    SCOPED_TRACE(cpuIsaName(isa));
    Shard s(n, {1, 2, 3, 4, 0});
    for (size_t i = 0; i < n; ++i) {
      s.param()[i] = static_cast<float>(i) - 9.0f;
      s.grad()[i] = s.m()[i] = s.v()[i] = 0.0f;
    }
    auto adam = makeAdam(isa, 1);
    for (int t = 1; t <= 10; ++t) ASSERT_TRUE(adam->step(cfg, t, s.view(false)).ok());
    for (size_t i = 0; i < n; ++i)
      EXPECT_NEAR(s.param()[i], (static_cast<double>(i) - 9.0) * std::pow(0.95, 10),
                  1e-5 * (1.0 + std::fabs(static_cast<double>(i) - 9.0)))
          << i;
  }
}

// ---- configuration and errors ----------------------------------------------------------------

TEST(CpuAdam, IsaFromEnvironment) {
  {
    ScopedEnv e("HSDP_CPU_ADAM_ISA", nullptr);
    auto a = CpuAdam::create({.threads = 1});
    ASSERT_TRUE(a.ok()) << a.status().toString();
    EXPECT_EQ((*a)->isa(), supportedCpuIsas().front());
  }
  {
    ScopedEnv e("HSDP_CPU_ADAM_ISA", "auto");
    EXPECT_EQ(*cpuAdamIsaFromEnv(), supportedCpuIsas().front());
  }
  for (CpuIsa isa : supportedCpuIsas()) {
    ScopedEnv e("HSDP_CPU_ADAM_ISA", cpuIsaName(isa));
    auto a = CpuAdam::create({.threads = 1});
    ASSERT_TRUE(a.ok()) << a.status().toString();
    EXPECT_EQ((*a)->isa(), isa);
  }
  {
    ScopedEnv e("HSDP_CPU_ADAM_ISA", "sse9");
    auto a = CpuAdam::create({.threads = 1});
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("HSDP_CPU_ADAM_ISA='sse9'"), std::string::npos)
        << a.status().message();
  }
  // A named ISA the CPU lacks: an error naming it and what is supported, never a silent
  // fallback. Driven through the resolver, since this CPU may support everything.
  auto r = cpu_adam_detail::resolveCpuIsa("avx512", {CpuIsa::kAvx2, CpuIsa::kScalar});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("HSDP_CPU_ADAM_ISA=avx512"), std::string::npos);
  EXPECT_NE(r.status().message().find("supported: avx2, scalar"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(*cpu_adam_detail::resolveCpuIsa("", {CpuIsa::kAvx2, CpuIsa::kScalar}),
            CpuIsa::kAvx2);
  EXPECT_FALSE(parseCpuIsa("auto").ok());  // "auto" is the env rule's, not an ISA
}

TEST(CpuAdam, ThreadsFromOptionsAndEnvironment) {
  {
    ScopedEnv e("HSDP_CPU_ADAM_THREADS", "3");
    auto a = CpuAdam::create({.isa = CpuIsa::kScalar});
    ASSERT_TRUE(a.ok());
    EXPECT_EQ((*a)->threads(), 3);
    auto b = CpuAdam::create({.isa = CpuIsa::kScalar, .threads = 2});  // options win
    EXPECT_EQ((*b)->threads(), 2);
  }
  for (const char* bad : {"0", "two", "-1"}) {
    ScopedEnv e("HSDP_CPU_ADAM_THREADS", bad);
    auto a = CpuAdam::create({.isa = CpuIsa::kScalar});
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_NE(a.status().message().find("HSDP_CPU_ADAM_THREADS"), std::string::npos)
        << a.status().message();
  }
  {
    ScopedEnv e("HSDP_CPU_ADAM_THREADS", nullptr);
    auto a = CpuAdam::create({.isa = CpuIsa::kScalar});
    ASSERT_TRUE(a.ok());
    EXPECT_GE((*a)->threads(), 1);
  }
  auto neg = CpuAdam::create({.isa = CpuIsa::kScalar, .threads = -2});
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("threads=-2"), std::string::npos);
}

TEST(CpuAdam, BadArgumentsNameTheValueAndWriteNothing) {
  auto adam = makeAdam(supportedCpuIsas().front(), 2);
  Shard s(40, {});
  s.fillRandom(1);
  const std::vector<float> before(s.param(), s.param() + 40);
  const AdamConfig ok = config(OptimizerKind::kAdamW);
  AdamConfig bad_lr = ok;
  bad_lr.lr = -1.0f;
  struct Bad {
    Status status;
    const char* needle;
  };
  AdamShard no_grad = s.view(false);
  no_grad.grad = nullptr;
  const Bad bad[] = {
      {adam->step(ok, 0, s.view(false)), "t=0"},
      {adam->step(ok, 1, s.view(false), -0.5f), "scale -0.5"},
      {adam->step(ok, 1, s.view(false), NAN), "scale nan"},
      {adam->step(ok, 1, s.view(false), INFINITY), "scale inf"},
      {adam->step(ok, 1, no_grad), "null grad"},
      {adam->step(bad_lr, 1, s.view(false)), "learning rate -1"},
  };
  for (const Bad& b : bad) {
    EXPECT_EQ(b.status.code(), StatusCode::kInvalidArgument) << b.needle;
    EXPECT_NE(b.status.message().find(b.needle), std::string::npos) << b.status.message();
  }
  EXPECT_TRUE(sameBits("param", s.param(), before.data(), 40));
  // An empty shard is fine, with or without arrays.
  EXPECT_TRUE(adam->step(ok, 1, AdamShard{}).ok());
}

// ---- the pieces: thread pool and chunking ----------------------------------------------------

// Threads are created once: across many calls, part k (k >= 1) always runs on the same thread,
// never the caller's, and part 0 always on the caller's.
TEST(WorkerPool, ThreadsArePersistentAndPart0IsTheCaller) {
  auto pool = offload_detail::WorkerPool::create(4);
  ASSERT_TRUE(pool.ok());
  std::vector<std::set<std::thread::id>> seen(4);
  std::vector<int> count(4, 0);
  for (int call = 0; call < 200; ++call) {
    const int parts = 1 + call % 4;
    std::vector<std::thread::id> ids(4);
    (*pool)->run(parts, [&](int k) {
      ids[k] = std::this_thread::get_id();
      ++count[k];
    });
    for (int k = 0; k < parts; ++k) seen[k].insert(ids[k]);
  }
  EXPECT_EQ(seen[0], std::set<std::thread::id>{std::this_thread::get_id()});
  std::set<std::thread::id> all;
  for (int k = 1; k < 4; ++k) {
    EXPECT_EQ(seen[k].size(), 1u) << "part " << k << " ran on several threads";
    all.insert(seen[k].begin(), seen[k].end());
  }
  EXPECT_EQ(all.size(), 3u);
  EXPECT_EQ(all.count(std::this_thread::get_id()), 0u);
  EXPECT_EQ(count[0], 200);
  EXPECT_EQ(count[3], 50);
  // Asking for more parts than threads runs threads() parts.
  int ran = 0;
  (*pool)->run(9, [&](int) { __atomic_add_fetch(&ran, 1, __ATOMIC_RELAXED); });
  EXPECT_EQ(ran, 4);
  EXPECT_FALSE(offload_detail::WorkerPool::create(0).ok());
}

TEST(CpuAdam, ChunkBoundariesCoverAlignAndBalance) {
  alignas(64) static float base[64];
  for (size_t skew = 0; skew < 16; ++skew) {
    const float* p = base + skew;
    for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000}, size_t{1000003}}) {
      for (int parts = 1; parts <= 8; ++parts) {
        SCOPED_TRACE(strCat("skew=", skew, " n=", n, " parts=", parts));
        std::vector<size_t> b(parts + 1);
        cpu_adam_detail::chunkBoundaries(p, n, parts, b.data());
        ASSERT_EQ(b.front(), 0u);
        ASSERT_EQ(b.back(), n);
        for (int k = 0; k < parts; ++k) ASSERT_LE(b[k], b[k + 1]);
        for (int k = 1; k < parts; ++k)
          if (b[k] < n) ASSERT_EQ(reinterpret_cast<uintptr_t>(p + b[k]) % 64, 0u) << b[k];
        // Balanced to within a granule plus the unaligned head.
        const double ideal = static_cast<double>(n) / parts;
        for (int k = 0; k < parts; ++k)
          ASSERT_LE(std::fabs(static_cast<double>(b[k + 1] - b[k]) - ideal),
                    2.0 * cpu_adam_detail::kChunkGranule + 16);
      }
    }
  }
}

}  // namespace
}  // namespace hsdp
