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

#include "core/float_bits.h"

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

using simd::bitsToFloat;
using simd::floatToBits;

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
// The largest |x|'s bits (x = s + r with kRes); branch-free, so the compiler vectorises it.
template <bool kRes>
inline uint32_t absMaxBits(const float* s, const float* r, size_t len) {
  uint32_t m = 0;
  for (size_t i = 0; i < len; ++i) {
    const float x = kRes ? s[i] + r[i] : s[i];
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

// int4: element i's nibble is byte i/2, low half for even i; stored as code + 8 (1..15). Written
// as branch-free loops over pieces of kPiece4 elements (codes first, then the nibbles packed),
// which the compiler vectorises with each translation unit's ISA.
constexpr size_t kPiece4 = 256;

template <bool kRes>
inline void encodeBlock4(const float* s, float* r, size_t len, unsigned char* out) {
  const BlockParams p = blockParams(absMaxBits<kRes>(s, r, len), 7.0f);
  storeScale(out, p.scale);
  unsigned char* codes = out + 4;
  const bool normal = p.kind == BlockKind::kNormal, zero = p.kind == BlockKind::kZero;
  for (size_t b = 0; b < len; b += kPiece4) {
    const size_t m = len - b < kPiece4 ? len - b : kPiece4;
    unsigned char q[kPiece4];  // code + 8
    for (size_t i = 0; i < m; ++i) {
      const float x = kRes ? s[b + i] + r[b + i] : s[b + i];
      const int c = normal ? codeOf(x, p.inv, 7) : 0;
      q[i] = static_cast<unsigned char>(c + 8);
      if constexpr (kRes) r[b + i] = normal ? x - static_cast<float>(c) * p.scale : zero ? x : 0.0f;
    }
    unsigned char* o = codes + b / 2;  // b is even: whole bytes
    for (size_t j = 0; j < m / 2; ++j)
      o[j] = static_cast<unsigned char>(q[2 * j] | (q[2 * j + 1] << 4));
    if (m % 2) o[m / 2] = q[m - 1];
  }
}

template <bool kAcc>
inline void decodeBlock4(const unsigned char* in, size_t len, float* d) {
  const float scale = loadScale(in);
  const unsigned char* codes = in + 4;
  for (size_t j = 0; j < len / 2; ++j) {
    const float lo = static_cast<float>(static_cast<int>(codes[j] & 15) - 8) * scale;
    const float hi = static_cast<float>(static_cast<int>(codes[j] >> 4) - 8) * scale;
    d[2 * j] = kAcc ? d[2 * j] + lo : lo;
    d[2 * j + 1] = kAcc ? d[2 * j + 1] + hi : hi;
  }
  if (len % 2) {
    const float v = static_cast<float>(static_cast<int>(codes[len / 2] & 15) - 8) * scale;
    d[len - 1] = kAcc ? d[len - 1] + v : v;
  }
}

// Calls f(offset, len, block_bytes_offset) for every block of n elements.
template <typename F>
inline void forEachBlock(size_t n, uint32_t block, size_t stride, F&& f) {
  size_t b = 0;
  for (size_t off = 0; off < n; off += block, ++b)
    f(off, n - off < block ? n - off : block, b * stride);
}

// The int8 kernels over every block of n elements, from an ISA's block functions:
// B::encode<kRes>(src, residual, len, out) and B::decode<kAcc>(scale, codes, len, dst).
template <typename B>
inline void encodeAll8(const float* src, float* res, size_t n, uint32_t block, unsigned char* dst) {
  forEachBlock(n, block, blockBytes8(block), [&](size_t off, size_t len, size_t at) {
    if (res)
      B::template encode<true>(src + off, res + off, len, dst + at);
    else
      B::template encode<false>(src + off, nullptr, len, dst + at);
  });
}
template <typename B>
inline void decodeAll8(const unsigned char* src, size_t n, uint32_t block, float* dst,
                       bool accumulate) {
  forEachBlock(n, block, blockBytes8(block), [&](size_t off, size_t len, size_t at) {
    const auto* codes = reinterpret_cast<const signed char*>(src + at + 4);
    if (accumulate)
      B::template decode<true>(loadScale(src + at), codes, len, dst + off);
    else
      B::template decode<false>(loadScale(src + at), codes, len, dst + off);
  });
}

// The int4 kernels: the same portable code in every translation unit, vectorised by the compiler
// with that unit's ISA flags.
inline void encode4All(const float* src, float* res, size_t n, uint32_t block, unsigned char* dst) {
  forEachBlock(n, block, blockBytes4(block), [&](size_t off, size_t len, size_t at) {
    if (res)
      encodeBlock4<true>(src + off, res + off, len, dst + at);
    else
      encodeBlock4<false>(src + off, nullptr, len, dst + at);
  });
}
inline void decode4All(const unsigned char* src, size_t n, uint32_t block, float* dst,
                       bool accumulate) {
  forEachBlock(n, block, blockBytes4(block), [&](size_t off, size_t len, size_t at) {
    if (accumulate)
      decodeBlock4<true>(src + at, len, dst + off);
    else
      decodeBlock4<false>(src + at, len, dst + off);
  });
}

// The int8 vector kernels (quantize_avx2.cc, quantize_avx512.cc), written once over an ISA's
// traits V (core/simd_avx2.h, core/simd_avx512.h):
//   F, I            a register of floats and of int32 (F a GCC/Clang vector type: + - * compile to
//                   the same instructions as the ISA's intrinsics, which are defined that way);
//   set1, load, store   as their intrinsics; load and store take AllLanes{} or, when kMasked, a
//                   Mask of the first count lanes (mask(count), count < lanes), whose loads read
//                   zeros and suppress faults on the others;
//   absBits, zero, maxu, reduceMaxu   |x|'s bit patterns and their unsigned maximum;
//   codes           round to nearest even (cvtps2dq, the default MXCSR mode: roundEven) and clamp
//                   to [-127, 127]: codeOf lane-wise; toFloat its exact conversion back;
//   storeCodes      the codes as int8: of one register (AllLanes or a Mask) or of two adjacent
//                   ones (a, b); loadCodes a register of them, widened;
//   kMasked         whether a block's tail runs as one masked register or, for an ISA without
//                   cheap masked byte stores, the scalar element functions (the same bits).
using simd::AllLanes;

template <typename V, bool kRes, typename Lanes>
inline typename V::F loadSum(const float* s, const float* r, size_t i, Lanes lanes) {
  typename V::F x = V::load(s + i, lanes);
  if constexpr (kRes) x = x + V::load(r + i, lanes);
  return x;
}

template <typename V>
constexpr size_t kLanes = sizeof(typename V::F) / sizeof(float);

template <typename V, bool kRes>
uint32_t absMaxVector(const float* s, const float* r, size_t len) {
  constexpr size_t L = kLanes<V>;
  auto bits = [&](size_t at) { return V::absBits(loadSum<V, kRes>(s, r, at, AllLanes{})); };
  // Four independent maxima per step, so the loads, not one max chain, set the pace.
  typename V::I m = V::zero(), m1 = m, m2 = m, m3 = m;
  size_t i = 0;
  for (; i + 4 * L <= len; i += 4 * L) {
    m = V::maxu(m, bits(i));
    m1 = V::maxu(m1, bits(i + L));
    m2 = V::maxu(m2, bits(i + 2 * L));
    m3 = V::maxu(m3, bits(i + 3 * L));
  }
  m = V::maxu(V::maxu(m, m1), V::maxu(m2, m3));
  for (; i + L <= len; i += L) m = V::maxu(m, bits(i));
  if constexpr (V::kMasked) {
    if (i < len) m = V::maxu(m, V::absBits(loadSum<V, kRes>(s, r, i, V::mask(len - i))));
    return V::reduceMaxu(m);
  } else {
    const uint32_t vec = V::reduceMaxu(m);
    const uint32_t tail = absMaxBits<kRes>(s + i, kRes ? r + i : nullptr, len - i);
    return vec > tail ? vec : tail;
  }
}

// One register of codes from element i, returned; with error feedback the residual is stored.
template <typename V, bool kRes, typename Lanes>
inline typename V::I codesOf(const float* s, float* r, size_t i, typename V::F inv,
                             typename V::F scale, Lanes lanes) {
  const typename V::F x = loadSum<V, kRes>(s, r, i, lanes);
  const typename V::I q = V::codes(x * inv);
  if constexpr (kRes) V::store(r + i, x - V::toFloat(q) * scale, lanes);
  return q;
}

// The block functions, for encodeAll8 / decodeAll8.
template <typename V>
struct VectorBlocks8 {
  template <bool kRes>
  static void encode(const float* s, float* r, size_t len, unsigned char* out) {
    const BlockParams p = blockParams(absMaxVector<V, kRes>(s, r, len), 127.0f);
    storeScale(out, p.scale);
    auto* codes = reinterpret_cast<signed char*>(out + 4);
    if (p.kind != BlockKind::kNormal) return encodeTail8(p, s, kRes ? r : nullptr, 0, len, codes);
    const typename V::F inv = V::set1(p.inv), scale = V::set1(p.scale);
    constexpr size_t L = kLanes<V>;
    size_t i = 0;
    // Two registers a step, so that an ISA may pack both registers' codes into one store.
    for (; i + 2 * L <= len; i += 2 * L) {
      const typename V::I a = codesOf<V, kRes>(s, r, i, inv, scale, AllLanes{});
      const typename V::I b = codesOf<V, kRes>(s, r, i + L, inv, scale, AllLanes{});
      V::storeCodes(codes + i, a, b);
    }
    for (; i + L <= len; i += L)
      V::storeCodes(codes + i, codesOf<V, kRes>(s, r, i, inv, scale, AllLanes{}), AllLanes{});
    if constexpr (V::kMasked) {
      if (i < len) {
        const auto k = V::mask(len - i);
        V::storeCodes(codes + i, codesOf<V, kRes>(s, r, i, inv, scale, k), k);
      }
    } else {
      encodeTail8(p, s, kRes ? r : nullptr, i, len, codes);
    }
  }

  template <bool kAcc>
  static void decode(float scale_value, const signed char* codes, size_t len, float* d) {
    const typename V::F scale = V::set1(scale_value);
    size_t i = 0;
    for (; i + kLanes<V> <= len; i += kLanes<V>) {
      typename V::F v = V::toFloat(V::loadCodes(codes + i)) * scale;
      if constexpr (kAcc) v = V::load(d + i, AllLanes{}) + v;
      V::store(d + i, v, AllLanes{});
    }
    decodeTail8(scale_value, codes, i, len, d, kAcc);
  }
};

// An ISA's table: its int8 block functions, and the portable int4 code vectorised by the compiler
// with its flags.
template <typename V>
constexpr Kernels kVectorKernels = {encodeAll8<VectorBlocks8<V>>, decodeAll8<VectorBlocks8<V>>,
                                    encode4All, decode4All};

}  // namespace
}  // namespace hsdp::quant_detail
