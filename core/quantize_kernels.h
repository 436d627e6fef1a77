// Private to core/: the per-ISA block quantization kernels (hsdp/quantize.h) and what they share.
//
// One translation unit per ISA (quantize_scalar.cc, quantize_avx2.cc, quantize_avx512.cc), each
// compiled with its own -m flags (core/CMakeLists.txt), under the rules of the CPU Adam kernels
// (offload/cpu_adam_kernels.h): a kernel file defines exactly one external symbol, its table
// function; everything in this header has internal linkage, and it includes only freestanding
// headers, so no inline function is ever shared between ISAs (the linker could otherwise keep
// the AVX-512 copy for the scalar path). The test quantize_isa_symbols checks the objects.
//
// Bitwise contract: every path computes, per block, the same integer maximum of |x|'s bit
// pattern, the same two correctly rounded divisions (scale = absmax / L, inv = L / absmax, done
// once per block by blockParams below), per element one rounded multiply x * inv, a
// round-to-nearest-even to an integer, and on decode one rounded multiply code * scale (and one
// rounded add when accumulating); error feedback adds x = src + residual and subtracts
// x - code * scale, each rounded once. No FMA (-ffp-contract=off, no FMA intrinsics), so the
// scalar, AVX2, AVX-512 and CUDA paths agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hsdp::quant_detail {

// Encodes n floats (src + residual when residual is not null; residual updated) in blocks of
// `block` elements into dst, the layout of hsdp/quantize.h. decode* writes or adds n floats.
struct Kernels {
  void (*encode8)(const float* src, float* residual, size_t n, uint32_t block, unsigned char* dst);
  void (*decode8)(const unsigned char* src, size_t n, uint32_t block, float* dst, bool accumulate);
  void (*encode4)(const float* src, float* residual, size_t n, uint32_t block, unsigned char* dst);
  void (*decode4)(const unsigned char* src, size_t n, uint32_t block, float* dst, bool accumulate);
};

// Entry points, one per translation unit; the AVX ones exist only in x86-64 builds
// (HSDP_CPU_X86) and may only be called when the CPU supports their ISA.
const Kernels& kernelsScalar();
#if defined(HSDP_CPU_X86)
const Kernels& kernelsAvx2();
const Kernels& kernelsAvx512();
#endif

namespace {

inline float bitsToFloat(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint32_t floatToBits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;     // |x| bits at or above this: Inf or NaN
constexpr uint32_t kMinAbsBits = 0x0d800000u;  // bits of 2^-100 (hsdp::kMinQuantAbsMax)
constexpr uint32_t kQuietNanBits = 0x7fc00000u;

enum class BlockKind { kNormal, kZero, kNonFinite };

// What a block's largest |x| bit pattern makes of it: the kind, the stored scale and the
// multiplier of the codes (levels L = 127 for int8, 7 for int4).
struct BlockParams {
  BlockKind kind;
  float scale;
  float inv;
};
inline BlockParams blockParams(uint32_t amax_bits, float levels) {
  if (amax_bits >= kInfBits) return {BlockKind::kNonFinite, bitsToFloat(kQuietNanBits), 0.0f};
  if (amax_bits < kMinAbsBits) return {BlockKind::kZero, 0.0f, 0.0f};
  const float amax = bitsToFloat(amax_bits);
  return {BlockKind::kNormal, amax / levels, levels / amax};
}

// Round to nearest even of |y| < 2^22, exactly as cvtps2dq in the default rounding mode: adding
// and subtracting 1.5 * 2^23 leaves no fraction bits (the compiler may not fold it without
// -ffast-math, which no kernel uses).
inline int roundEven(float y) {
  const float magic = 12582912.0f;
  return static_cast<int>((y + magic) - magic);
}

// One element's code, clamped to [-L, L] (|x * inv| <= L * (1 + 2^-22) rounds to L anyway).
inline int codeOf(float x, float inv, int levels) {
  int q = roundEven(x * inv);
  q = q > levels ? levels : q;
  return q < -levels ? -levels : q;
}

inline void storeScale(unsigned char* p, float s) { __builtin_memcpy(p, &s, 4); }
inline float loadScale(const unsigned char* p) {
  float s;
  __builtin_memcpy(&s, p, 4);
  return s;
}

// Bytes of one encoded block of `len` elements (4 + codes).
inline size_t blockBytes8(size_t len) { return 4 + len; }
inline size_t blockBytes4(size_t len) { return 4 + (len + 1) / 2; }

// The scalar block functions: the scalar kernel, and the tails of the vector kernels.
inline uint32_t absMaxBits(const float* s, const float* r, size_t len) {
  uint32_t m = 0;
  for (size_t i = 0; i < len; ++i) {
    const float x = r ? s[i] + r[i] : s[i];
    const uint32_t a = floatToBits(x) & kAbsMask;
    m = a > m ? a : m;
  }
  return m;
}

// Elements [from, len) of an int8 block whose parameters are known.
inline void encodeTail8(const BlockParams& p, const float* s, float* r, size_t from, size_t len,
                        signed char* codes) {
  for (size_t i = from; i < len; ++i) {
    const float x = r ? s[i] + r[i] : s[i];
    if (p.kind != BlockKind::kNormal) {
      codes[i] = 0;
      if (r) r[i] = p.kind == BlockKind::kZero ? x : 0.0f;
      continue;
    }
    const int q = codeOf(x, p.inv, 127);
    codes[i] = static_cast<signed char>(q);
    if (r) r[i] = x - static_cast<float>(q) * p.scale;
  }
}

inline void decodeTail8(float scale, const signed char* codes, size_t from, size_t len, float* d,
                        bool accumulate) {
  for (size_t i = from; i < len; ++i) {
    const float v = static_cast<float>(codes[i]) * scale;
    d[i] = accumulate ? d[i] + v : v;
  }
}

// int4: element i's nibble is byte i/2, low half for even i; stored as code + 8 (1..15).
inline void encodeBlock4(const float* s, float* r, size_t len, unsigned char* out) {
  const BlockParams p = blockParams(absMaxBits(s, r, len), 7.0f);
  storeScale(out, p.scale);
  unsigned char* codes = out + 4;
  for (size_t i = 0; i < len; i += 2) {
    unsigned char byte = 0;
    for (size_t k = i; k < i + 2 && k < len; ++k) {
      const float x = r ? s[k] + r[k] : s[k];
      int q = 0;
      if (p.kind == BlockKind::kNormal) {
        q = codeOf(x, p.inv, 7);
        if (r) r[k] = x - static_cast<float>(q) * p.scale;
      } else if (r) {
        r[k] = p.kind == BlockKind::kZero ? x : 0.0f;
      }
      byte = static_cast<unsigned char>(byte | ((q + 8) << (4 * (k - i))));
    }
    codes[i / 2] = byte;
  }
}

inline void decodeBlock4(const unsigned char* in, size_t len, float* d, bool accumulate) {
  const float scale = loadScale(in);
  const unsigned char* codes = in + 4;
  for (size_t i = 0; i < len; ++i) {
    const int q = static_cast<int>((codes[i / 2] >> (4 * (i & 1))) & 15) - 8;
    const float v = static_cast<float>(q) * scale;
    d[i] = accumulate ? d[i] + v : v;
  }
}

// Calls f(offset, len, block_bytes_offset) for every block of n elements.
template <typename F>
inline void forEachBlock(size_t n, uint32_t block, size_t stride, F&& f) {
  size_t b = 0;
  for (size_t off = 0; off < n; off += block, ++b)
    f(off, n - off < block ? n - off : block, b * stride);
}

// The int4 kernels: scalar code in every translation unit (compiled with its ISA's flags; the
// packing of nibbles gains little from vectors next to the memory traffic).
inline void encode4All(const float* src, float* res, size_t n, uint32_t block, unsigned char* dst) {
  forEachBlock(n, block, blockBytes4(block), [&](size_t off, size_t len, size_t at) {
    encodeBlock4(src + off, res ? res + off : nullptr, len, dst + at);
  });
}
inline void decode4All(const unsigned char* src, size_t n, uint32_t block, float* dst,
                       bool accumulate) {
  forEachBlock(n, block, blockBytes4(block), [&](size_t off, size_t len, size_t at) {
    decodeBlock4(src + at, len, dst + off, accumulate);
  });
}

}  // namespace
}  // namespace hsdp::quant_detail
