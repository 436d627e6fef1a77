// The wire formats (hsdp/quantize.h) against closed forms: every decoded element within
// (1/2 + 2^-12) * scale of its input, the scale exactly absmax / L, the layout's byte counts, zero
// and tiny blocks, NaN and infinity poisoning only their own block, error feedback's residual
// and its telescoping sum; and every ISA path bitwise equal to the scalar one.
#include "hsdp/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "hsdp/dtype.h"

namespace hsdp {
namespace {

std::vector<float> randomValues(size_t n, uint32_t seed, float spread = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  // Per-block magnitudes vary over many octaves, as gradients do.
  for (size_t i = 0; i < n; ++i)
    v[i] = d(gen) * std::ldexp(spread, static_cast<int>(i / 700 % 9) - 4);
  return v;
}

float levelsOf(Wire w) { return w == Wire::kInt8 ? 127.0f : 7.0f; }

const std::vector<size_t>& sizes() {
  static const std::vector<size_t> s = {1, 7, 15, 16, 17, 31, 33, 2047, 2048, 2049, 6151, 20011};
  return s;
}

TEST(WireFormat, NamesBytesAndBadBlocks) {
  for (Wire w : {Wire::kFp32, Wire::kBf16, Wire::kInt8, Wire::kInt4}) {
    auto parsed = parseWire(wireName(w));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, w);
  }
  EXPECT_EQ(*parseWire("float"), Wire::kFp32);
  EXPECT_NE(parseWire("fp8").status().message().find("'fp8'"), std::string::npos);
  EXPECT_FALSE(validate({Wire::kInt8, 24}).ok());
  EXPECT_FALSE(validate({Wire::kInt8, 0}).ok());
  EXPECT_NE(validate({Wire::kInt8, 8}).message().find("block 8"), std::string::npos);
  EXPECT_TRUE(validate({Wire::kInt8, 2048}).ok());
  // int8: 4 + len bytes per block; int4: 4 + ceil(len / 2).
  EXPECT_EQ(encodedBytes({Wire::kInt8, 2048}, 2049), 2052u + 5u);
  EXPECT_EQ(encodedBytes({Wire::kInt8, 2048}, 2048), 2052u);
  EXPECT_EQ(encodedBytes({Wire::kInt4, 16}, 33), 2 * 12u + 4u + 1u);
  EXPECT_EQ(encodedBytes({Wire::kInt4, 16}, 34), 2 * 12u + 4u + 1u);
  EXPECT_EQ(encodedBytes({Wire::kBf16, 16}, 33), 66u);
  EXPECT_EQ(encodedOffset({Wire::kInt8, 2048}, 3), 3 * 2052u);
  EXPECT_EQ(encodedBytes({Wire::kInt8, 2048}, 0), 0u);
  // The budget: int8 at 2048 moves at most 0.27x the bytes of fp32.
  EXPECT_LT(wireBitsPerElement({Wire::kInt8, 2048}) / 32.0, 0.27);
}

// Every element of every block within the closed-form bound of its block's scale, the scale
// exactly absmax / L, and the element of largest magnitude on the end of the grid.
TEST(WireFormat, RoundTripWithinHalfAStepPerBlock) {
  for (Wire w : {Wire::kInt8, Wire::kInt4}) {
    for (uint32_t block : {16u, 48u, 2048u}) {
      for (size_t n : sizes()) {
        SCOPED_TRACE(testing::Message() << wireName(w) << " block " << block << " n " << n);
        const WireFormat f{w, block};
        const std::vector<float> x = randomValues(n, static_cast<uint32_t>(n + block));
        std::vector<unsigned char> enc(encodedBytes(f, n));
        std::vector<float> y(n);
        wireEncode(f, x.data(), n, enc.data());
        wireDecode(f, enc.data(), n, y.data());
        for (size_t b = 0; b * block < n; ++b) {
          const size_t lo = b * block, hi = std::min(n, lo + block);
          float amax = 0;
          for (size_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
          const float scale = blockScale(f, enc.data(), b);
          ASSERT_EQ(scale, amax / levelsOf(w)) << "block " << b;
          const double bound = (0.5 + std::ldexp(1.0, -12)) * scale;
          for (size_t i = lo; i < hi; ++i) {
            ASSERT_LE(std::fabs(double(x[i]) - double(y[i])), bound) << "element " << i;
            if (std::fabs(x[i]) == amax)  // the largest element maps onto +-L exactly
              ASSERT_EQ(std::fabs(y[i]), levelsOf(w) * scale);
          }
        }
      }
    }
  }
}

TEST(WireFormat, ZeroAndTinyBlocksDecodeToZeros) {
  for (Wire w : {Wire::kInt8, Wire::kInt4}) {
    const WireFormat f{w, 16};
    std::vector<float> x(48, 0.0f);
    for (int i = 16; i < 32; ++i) x[i] = (i % 2 ? 1 : -1) * 0x1p-101f;  // below 2^-100
    for (int i = 32; i < 48; ++i) x[i] = (i % 2 ? 1 : -1) * 0x1p-99f;   // above: quantized
    std::vector<unsigned char> enc(encodedBytes(f, x.size()));
    std::vector<float> y(x.size(), 5.0f), res(x.size(), 0.0f);
    wireEncode(f, x.data(), x.size(), enc.data(), res.data());
    wireDecode(f, enc.data(), x.size(), y.data());
    EXPECT_EQ(blockScale(f, enc.data(), 0), 0.0f);
    EXPECT_EQ(blockScale(f, enc.data(), 1), 0.0f);
    for (int i = 0; i < 32; ++i) {
      EXPECT_EQ(y[i], 0.0f) << i;
      EXPECT_EQ(res[i], x[i]) << i;  // error feedback keeps what was not sent
    }
    for (int i = 32; i < 48; ++i) EXPECT_EQ(y[i], x[i]) << i;  // +-absmax: exact
  }
}

TEST(WireFormat, NanOrInfinityPoisonsOnlyItsBlock) {
  for (Wire w : {Wire::kInt8, Wire::kInt4}) {
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      const WireFormat f{w, 32};
      std::vector<float> x = randomValues(100, 7);
      x[40] = bad;
      std::vector<unsigned char> enc(encodedBytes(f, x.size()));
      std::vector<float> y(x.size()), res(x.size(), 0.25f);
      wireEncode(f, x.data(), x.size(), enc.data(), res.data());
      wireDecode(f, enc.data(), x.size(), y.data());
      EXPECT_TRUE(std::isnan(blockScale(f, enc.data(), 1)));
      for (size_t i = 0; i < x.size(); ++i) {
        if (i >= 32 && i < 64) {
          EXPECT_TRUE(std::isnan(y[i])) << i;
          EXPECT_EQ(res[i], 0.0f) << i;  // reset: the next step starts clean
        } else {
          EXPECT_TRUE(std::isfinite(y[i])) << i;
          EXPECT_TRUE(std::isfinite(res[i])) << i;
        }
      }
    }
  }
}

// residual' = (x + residual) - decode exactly, and the decoded values of T encodes of the same
// gradient sum to T*g + e_0 - e_T: their mean is within scale / (2T) of g (error feedback
// delivers what one quantization drops).
TEST(WireFormat, ErrorFeedbackResidualAndTelescopingSum) {
  for (Wire w : {Wire::kInt8, Wire::kInt4, Wire::kBf16}) {
    SCOPED_TRACE(wireName(w));
    const WireFormat f{w, 64};
    const size_t n = 1000;
    const std::vector<float> g = randomValues(n, 3);
    std::vector<float> res(n, 0.0f), y(n);
    std::vector<double> sum(n, 0.0);
    std::vector<unsigned char> enc(encodedBytes(f, n));
    const int T = 64;
    for (int t = 0; t < T; ++t) {
      std::vector<float> before = res;
      wireEncode(f, g.data(), n, enc.data(), res.data());
      wireDecode(f, enc.data(), n, y.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(res[i], (g[i] + before[i]) - y[i]) << "t " << t << " element " << i;
        sum[i] += y[i];
      }
    }
    for (size_t i = 0; i < n; ++i) {
      // |e_T| is at most half a step of the block's grid (with the float slack of the sums).
      const double tol = (std::fabs(res[i]) + 1e-6 * std::fabs(g[i]) * T) / T;
      ASSERT_NEAR(sum[i] / T, g[i], tol + 1e-12) << i;
    }
  }
}

TEST(WireFormat, Bf16AndFp32AreTheDtypeConversions) {
  const std::vector<float> x = randomValues(333, 5);
  std::vector<bf16> enc(x.size());
  std::vector<float> y(x.size(), 1.0f);
  wireEncode({Wire::kBf16}, x.data(), x.size(), enc.data());
  wireDecode({Wire::kBf16}, enc.data(), x.size(), y.data(), /*accumulate=*/true);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(enc[i].bits, toBf16(x[i]).bits);
    EXPECT_EQ(y[i], 1.0f + toFloat(toBf16(x[i])));
  }
  std::vector<float> copy(x.size());
  wireEncode({Wire::kFp32}, x.data(), x.size(), copy.data());
  EXPECT_EQ(copy, x);
}

// Every ISA this CPU runs against the scalar kernel: the same bytes, the same decoded values
// (stored and accumulated) and the same residuals, for sizes around the vector widths and tails.
TEST(WireFormat, EveryIsaIsBitwiseTheScalarPath) {
  for (CpuIsa isa : supportedCpuIsas()) {
    if (isa == CpuIsa::kScalar) continue;
    for (Wire w : {Wire::kInt8, Wire::kInt4}) {
      for (uint32_t block : {16u, 48u, 2048u}) {
        for (size_t n : sizes()) {
          SCOPED_TRACE(testing::Message() << cpuIsaName(isa) << " " << wireName(w) << " block "
                                          << block << " n " << n);
          const WireFormat f{w, block};
          std::vector<float> x = randomValues(n, 11 + static_cast<uint32_t>(n));
          if (n > 40) x[n / 2] = std::numeric_limits<float>::quiet_NaN();
          if (n > 2100) std::fill(x.begin() + 2048, x.begin() + 2064, 0.0f);
          const std::vector<float> r0 = randomValues(n, 99, 0.01f);
          std::vector<unsigned char> e_ref(encodedBytes(f, n)), e_isa(e_ref.size());
          std::vector<float> r_ref = r0, r_isa = r0;
          wireEncode(CpuIsa::kScalar, f, x.data(), n, e_ref.data(), r_ref.data());
          wireEncode(isa, f, x.data(), n, e_isa.data(), r_isa.data());
          ASSERT_EQ(e_ref, e_isa);
          ASSERT_EQ(0, std::memcmp(r_ref.data(), r_isa.data(), n * sizeof(float)));
          wireEncode(CpuIsa::kScalar, f, x.data(), n, e_ref.data());
          wireEncode(isa, f, x.data(), n, e_isa.data());
          ASSERT_EQ(e_ref, e_isa) << "without error feedback";
          for (bool acc : {false, true}) {
            std::vector<float> d_ref = r0, d_isa = r0;
            wireDecode(CpuIsa::kScalar, f, e_ref.data(), n, d_ref.data(), acc);
            wireDecode(isa, f, e_ref.data(), n, d_isa.data(), acc);
            ASSERT_EQ(0, std::memcmp(d_ref.data(), d_isa.data(), n * sizeof(float))) << acc;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace hsdp
