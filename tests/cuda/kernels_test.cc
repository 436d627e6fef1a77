// The CUDA kernels against the CPU reference, element by element (bitwise), at odd lengths and
// misaligned offsets (the vector path's scalar tail, the scalar-only path), for Adam and AdamW,
// with and without a gradient scale and the bf16 copy, over several steps. Argument validation
// runs without a device; everything else skips without one.
#include "cuda/kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "collectives/nccl/cuda_resources.h"
#include "core/adam.h"
#include "hsdp/dtype.h"
#include "hsdp/quantize.h"
#include "tests/common/gpu_test.h"

namespace hsdp {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Index of the first element whose bits differ, or -1.
template <typename T>
long firstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<long>(i);
  return -1;
}

struct AdamCase {
  OptimizerKind kind;
  size_t n;
  size_t offset;  // elements: 0 keeps cudaMalloc's alignment (vector path), 1 misaligns
  bool bf16_out;
  float grad_scale;
};

std::string describe(const AdamCase& c) {
  return strCat(optimizerName(c.kind), " n=", c.n, " offset=", c.offset, c.bf16_out ? " bf16" : "",
                " grad_scale=", c.grad_scale);
}

void runAdamCase(const AdamCase& c) {
  SCOPED_TRACE(describe(c));
  AdamConfig cfg;
  cfg.kind = c.kind;
  cfg.lr = 1e-2f;
  cfg.eps = 1e-8f;
  cfg.weight_decay = 0.05f;
  std::mt19937 rng(static_cast<uint32_t>(c.n * 7 + c.offset));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t n = c.n, total = n + c.offset;
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
  for (float& x : p) x = dist(rng);
  // Reference state (CPU) and device state; the arrays live at `offset` elements into buffers.
  std::vector<float> rp = p, rm = m, rv = v;
  auto alloc = [&](size_t bytes) {
    auto b = gpu::DeviceBuffer::allocate(bytes);
    EXPECT_TRUE(b.ok()) << b.status().toString();
    return std::move(b).value();
  };
  gpu::DeviceBuffer dp = alloc(total * 4), dg = alloc(total * 4), dm = alloc(total * 4),
                    dv = alloc(total * 4), db = alloc(total * 2);
  float* P = dp.as<float>() + c.offset;
  float* G = dg.as<float>() + c.offset;
  float* M = dm.as<float>() + c.offset;
  float* V = dv.as<float>() + c.offset;
  bf16* B = c.bf16_out ? db.as<bf16>() + c.offset : nullptr;
  ASSERT_EQ(cudaMemcpy(P, p.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(M, m.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(V, v.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  auto stream = gpu::Stream::create("kernels-test");
  ASSERT_TRUE(stream.ok()) << stream.status().toString();

  std::vector<float> g(n), scaled(n);
  for (int64_t t = 1; t <= 3; ++t) {
    for (float& x : g) x = dist(rng) * 0.1f;
    if (t == 2 && n > 2) g[n / 2] = 0.0f;  // an exactly zero gradient: denominator eps only
    ASSERT_EQ(cudaMemcpy(G, g.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_OK(gpu::adamStep(cfg, t, {P, G, M, V, n, B}, stream->get(), c.grad_scale));
    // The reference: adamStep on the gradient scaled first, exactly as the kernel does.
    for (size_t i = 0; i < n; ++i) scaled[i] = g[i] * c.grad_scale;
    adamStep(cfg, t, rp.data(), scaled.data(), rm.data(), rv.data(), n);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
  std::vector<float> gp(n), gm(n), gv(n);
  ASSERT_EQ(cudaMemcpy(gp.data(), P, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gm.data(), M, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gv.data(), V, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  long d = firstDifference(gp, rp);
  EXPECT_EQ(d, -1) << "param[" << d << "]: gpu " << (d >= 0 ? gp[d] : 0) << " (0x" << std::hex
                   << (d >= 0 ? bits(gp[d]) : 0) << ") cpu " << std::dec << (d >= 0 ? rp[d] : 0)
                   << " (0x" << std::hex << (d >= 0 ? bits(rp[d]) : 0) << ")";
  d = firstDifference(gm, rm);
  EXPECT_EQ(d, -1) << "exp_avg[" << d << "]: gpu " << (d >= 0 ? gm[d] : 0) << " cpu "
                   << (d >= 0 ? rm[d] : 0);
  d = firstDifference(gv, rv);
  EXPECT_EQ(d, -1) << "exp_avg_sq[" << d << "]: gpu " << (d >= 0 ? gv[d] : 0) << " cpu "
                   << (d >= 0 ? rv[d] : 0);
  if (c.bf16_out) {
    std::vector<bf16> gb(n), rb(n);
    ASSERT_EQ(cudaMemcpy(gb.data(), B, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; ++i) rb[i] = toBf16(rp[i]);
    d = firstDifference(gb, rb);
    EXPECT_EQ(d, -1) << "param_bf16[" << d << "]: gpu 0x" << std::hex << (d >= 0 ? gb[d].bits : 0)
                     << " cpu 0x" << (d >= 0 ? rb[d].bits : 0);
  }
}

TEST(GpuAdam, MatchesCpuReferenceBitwise) {
  HSDP_REQUIRE_GPU();
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW})
    for (size_t n :
         {size_t{1}, size_t{3}, size_t{4}, size_t{5}, size_t{1023}, size_t{4097}, size_t{100003}})
      for (size_t offset : {size_t{0}, size_t{1}})
        for (bool bf16_out : {false, true})
          for (float scale : {1.0f, 0.37f}) runAdamCase({kind, n, offset, bf16_out, scale});
}

TEST(GpuAdam, LargeShardUsesManyBlocks) {
  HSDP_REQUIRE_GPU();
  // More elements than one wave of the grid-stride loop covers.
  runAdamCase({OptimizerKind::kAdamW, (size_t{1} << 22) + 13, 0, true, 1.0f});
}

TEST(GpuAdam, ValidationNamesTheValue) {
  // No device needed: arguments are checked before anything is enqueued.
  AdamConfig cfg;
  float x = 0;
  AdamShard shard{&x, &x, &x, &x, 1, nullptr};
  Status s = gpu::adamStep(cfg, 0, shard, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("t=0"), std::string::npos) << s.message();
  s = gpu::adamStep(cfg, 1, shard, nullptr, -1.0f);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = gpu::adamStep(cfg, 1, shard, nullptr, std::numeric_limits<float>::infinity());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  shard.exp_avg = nullptr;
  s = gpu::adamStep(cfg, 1, shard, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exp_avg"), std::string::npos) << s.message();
  cfg.lr = -1;
  EXPECT_EQ(gpu::adamStep(cfg, 1, shard, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu::scale(&x, 1, DType::kInt32, 2.0f, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu::scale(&x, 1, DType::kFloat32, std::nanf(""), nullptr).code(),
            StatusCode::kInvalidArgument);
}

// Values that exercise bf16 rounding: ties (even and odd), NaN with payloads, infinities,
// denormals, signed zeros, and random floats.
std::vector<float> castInputs(size_t n) {
  std::vector<uint32_t> special = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                   0x7f800001u, 0xffa00001u, 0x00000001u, 0x807fffffu, 0x3f808000u,
                                   0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0x7f7fffffu, 0x477fe000u};
  std::vector<float> out(n);
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = i < special.size() ? special[i] : any(rng);
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

TEST(GpuCast, MatchesToBf16AndBack) {
  HSDP_REQUIRE_GPU();
  for (size_t n : {size_t{1}, size_t{15}, size_t{1001}, size_t{65537}}) {
    SCOPED_TRACE(strCat("n=", n));
    std::vector<float> in = castInputs(n);
    auto df = gpu::DeviceBuffer::allocate(n * 4);
    auto db = gpu::DeviceBuffer::allocate(n * 2);
    auto dback = gpu::DeviceBuffer::allocate(n * 4);
    ASSERT_TRUE(df.ok() && db.ok() && dback.ok());
    ASSERT_EQ(cudaMemcpy(df->data(), in.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_OK(gpu::castToBf16(df->as<float>(), db->as<bf16>(), n, nullptr));
    ASSERT_OK(gpu::castToFloat(db->as<bf16>(), dback->as<float>(), n, nullptr));
    std::vector<bf16> got(n), want(n);
    std::vector<float> back(n), want_back(n);
    ASSERT_EQ(cudaMemcpy(got.data(), db->data(), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(back.data(), dback->data(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; ++i) {
      want[i] = toBf16(in[i]);
      want_back[i] = toFloat(want[i]);
    }
    long d = firstDifference(got, want);
    EXPECT_EQ(d, -1) << "bf16[" << d << "] of 0x" << std::hex << (d >= 0 ? bits(in[d]) : 0)
                     << ": gpu 0x" << (d >= 0 ? got[d].bits : 0) << " cpu 0x"
                     << (d >= 0 ? want[d].bits : 0);
    EXPECT_EQ(firstDifference(back, want_back), -1);
  }
}

TEST(GpuScale, MatchesHostMultiplication) {
  HSDP_REQUIRE_GPU();
  const size_t n = 12347;
  std::vector<float> x = castInputs(n);
  const float f = 0.123f;
  auto dx = gpu::DeviceBuffer::allocate(n * 4);
  auto db = gpu::DeviceBuffer::allocate(n * 2);
  ASSERT_TRUE(dx.ok() && db.ok());
  std::vector<bf16> xb(n);
  for (size_t i = 0; i < n; ++i) xb[i] = toBf16(x[i]);
  ASSERT_EQ(cudaMemcpy(dx->data(), x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(db->data(), xb.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_OK(gpu::scale(dx->data(), n, DType::kFloat32, f, nullptr));
  ASSERT_OK(gpu::scale(db->data(), n, DType::kBFloat16, f, nullptr));
  std::vector<float> got(n), want(n);
  std::vector<bf16> gotb(n), wantb(n);
  ASSERT_EQ(cudaMemcpy(got.data(), dx->data(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gotb.data(), db->data(), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < n; ++i) {
    want[i] = x[i] * f;
    wantb[i] = toBf16(toFloat(xb[i]) * f);
  }
  // NaN payloads may differ between CPU and GPU multiplication: compare NaN-ness there.
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
      got[i] = want[i];
    }
    if (std::isnan(toFloat(wantb[i]))) {
      EXPECT_TRUE(std::isnan(toFloat(gotb[i]))) << i;
      gotb[i] = wantb[i];
    }
  }
  EXPECT_EQ(firstDifference(got, want), -1);
  EXPECT_EQ(firstDifference(gotb, wantb), -1);
}

// Copy-in/copy-out: 150 pieces (three launches of 64), sizes 0 to ~20000, packed into and out of
// one flat buffer, plain and accumulating, against the host's memcpy and +=, bitwise.
TEST(GpuBatchedCopy, MatchesHostCopyAndAdd) {
  EXPECT_EQ(
      gpu::batchedCopy(std::vector<gpu::CopyPiece>{{nullptr, nullptr, 3}}.data(), 1, false, nullptr)
          .code(),
      StatusCode::kInvalidArgument);  // validated before any device work
  HSDP_REQUIRE_GPU();
  std::mt19937 gen(7);
  std::uniform_int_distribution<size_t> len(0, 20000);
  const size_t pieces = 150;
  std::vector<size_t> n(pieces), off(pieces);
  size_t total = 0;
  for (size_t k = 0; k < pieces; ++k) {
    n[k] = k % 17 == 0 ? 0 : len(gen);
    off[k] = total;
    total += n[k] + 1;  // a gap element between pieces: must stay untouched
  }
  // Finite values of all magnitudes (NaN payloads of a GPU and a CPU add may differ).
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-40, 40);
  auto values = [&](size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = std::ldexp(mant(gen), expo(gen));
    return v;
  };
  std::vector<float> user = values(total), flat0 = values(total);
  auto du = gpu::DeviceBuffer::allocate(total * 4);
  auto df = gpu::DeviceBuffer::allocate(total * 4);
  ASSERT_TRUE(du.ok() && df.ok());
  for (bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "copy");
    ASSERT_EQ(cudaMemcpy(du->data(), user.data(), total * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(df->data(), flat0.data(), total * 4, cudaMemcpyHostToDevice), cudaSuccess);
    std::vector<gpu::CopyPiece> in(pieces);
    std::vector<float> want = flat0;
    for (size_t k = 0; k < pieces; ++k) {
      in[k] = {du->as<float>() + off[k], df->as<float>() + off[k], n[k]};
      for (size_t i = 0; i < n[k]; ++i)
        want[off[k] + i] = accumulate ? want[off[k] + i] + user[off[k] + i] : user[off[k] + i];
    }
    ASSERT_OK(gpu::batchedCopy(in.data(), in.size(), accumulate, nullptr));
    std::vector<float> got(total);
    ASSERT_EQ(cudaMemcpy(got.data(), df->data(), total * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(firstDifference(got, want), -1);
  }
}

TEST(GpuResources, OwnersReleaseAndMove) {
  HSDP_REQUIRE_GPU();
  auto a = gpu::DeviceBuffer::allocate(1 << 20);
  ASSERT_TRUE(a.ok()) << a.status().toString();
  void* p = a->data();
  gpu::DeviceBuffer b = std::move(*a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a->data(), nullptr);
  auto pinned = gpu::PinnedBuffer::allocate(1 << 20);
  ASSERT_TRUE(pinned.ok()) << pinned.status().toString();
  auto s = gpu::Stream::create("test");
  auto e = gpu::Event::create();
  ASSERT_TRUE(s.ok() && e.ok());
  ASSERT_EQ(cudaMemcpyAsync(b.data(), pinned->data(), 1 << 20, cudaMemcpyHostToDevice, s->get()),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e->get(), s->get()), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(e->get()), cudaSuccess);
  // A device that does not exist is an error naming CUDA's message, not a crash.
  auto bad = gpu::DeviceGuard::set(1 << 20);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cudaSetDevice"), std::string::npos);
}

// Block quantization: the device encoding byte for byte the host's (the scalar kernel, which
// the AVX paths equal: tests/core/quantize_test.cc), with and without error feedback, a NaN
// block and a zero block in the input; decoding (stored and accumulated) bitwise, NaN-ness for
// the poisoned block.
TEST(GpuQuantize, MatchesHostKernelsBitwise) {
  HSDP_REQUIRE_GPU();
  for (Wire w : {Wire::kInt8, Wire::kInt4}) {
    for (uint32_t block : {16u, 2048u}) {
      for (size_t n : {size_t{1}, size_t{17}, size_t{2049}, size_t{70001}}) {
        SCOPED_TRACE(strCat(wireName(w), " block=", block, " n=", n));
        const WireFormat f{w, block};
        std::vector<float> x = castInputs(n), r0(n);
        std::mt19937 rng(3);
        std::normal_distribution<float> dist(0.0f, 1e-3f);
        for (size_t i = 0; i < n; ++i) {
          if (!std::isfinite(x[i]) && i > 40) x[i] = dist(rng) * 1e3f;  // a few NaN blocks only
          r0[i] = dist(rng);
        }
        if (n > 4096) std::fill(x.begin() + 4096, x.begin() + 4096 + block, 0.0f);
        const size_t bytes = encodedBytes(f, n);
        std::vector<unsigned char> want(bytes), got(bytes);
        std::vector<float> r_want = r0, r_got(n);
        wireEncode(CpuIsa::kScalar, f, x.data(), n, want.data(), r_want.data());
        auto dx = gpu::DeviceBuffer::allocate(n * 4), dr = gpu::DeviceBuffer::allocate(n * 4);
        auto dq = gpu::DeviceBuffer::allocate(bytes), dd = gpu::DeviceBuffer::allocate(n * 4);
        ASSERT_TRUE(dx.ok() && dr.ok() && dq.ok() && dd.ok());
        ASSERT_EQ(cudaMemcpy(dx->data(), x.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(dr->data(), r0.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_OK(gpu::quantize(f, dx->as<float>(), n, dq->data(), dr->as<float>(), nullptr));
        ASSERT_EQ(cudaMemcpy(got.data(), dq->data(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(r_got.data(), dr->data(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(firstDifference(got, want), -1);
        EXPECT_EQ(firstDifference(r_got, r_want), -1);
        ASSERT_OK(gpu::quantize(f, dx->as<float>(), n, dq->data(), nullptr, nullptr));
        wireEncode(CpuIsa::kScalar, f, x.data(), n, want.data());
        ASSERT_EQ(cudaMemcpy(got.data(), dq->data(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(firstDifference(got, want), -1) << "without error feedback";
        for (bool acc : {false, true}) {
          std::vector<float> d_want = r0, d_got(n);
          wireDecode(CpuIsa::kScalar, f, want.data(), n, d_want.data(), acc);
          ASSERT_EQ(cudaMemcpy(dd->data(), r0.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_OK(gpu::dequantize(f, dq->data(), n, dd->as<float>(), acc, nullptr));
          ASSERT_EQ(cudaMemcpy(d_got.data(), dd->data(), n * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          for (size_t i = 0; i < n; ++i)
            if (std::isnan(d_want[i])) {
              EXPECT_TRUE(std::isnan(d_got[i])) << i;
              d_got[i] = d_want[i];
            }
          EXPECT_EQ(firstDifference(d_got, d_want), -1) << "accumulate " << acc;
        }
      }
    }
  }
}

TEST(GpuQuantize, ValidationNamesTheValue) {
  float x = 0;
  Status s = gpu::quantize({Wire::kBf16}, &x, 1, &x, nullptr, nullptr);
  EXPECT_NE(s.message().find("bf16"), std::string::npos) << s.toString();
  s = gpu::dequantize({Wire::kInt8, 24}, &x, 1, &x, false, nullptr);
  EXPECT_NE(s.message().find("block 24"), std::string::npos) << s.toString();
  s = gpu::quantize({Wire::kInt8}, nullptr, 5, &x, nullptr, nullptr);
  EXPECT_NE(s.message().find("null"), std::string::npos) << s.toString();
}

}  // namespace
}  // namespace hsdp
