// The AVX-512 CPU Adam kernel: 16 elements per vector. Built with -mavx512f (only AVX512F
// instructions are used, so every AVX-512 CPU runs it) plus -fno-math-errno -ffp-contract=off;
// the dispatcher calls it only when __builtin_cpu_supports("avx512f"). See cpu_adam_kernels.h
// for the rules of this file (internal linkage only, the bitwise contract).
//
// Shape of the loop: a masked head up to the first 64-byte-aligned param element, an unmasked
// main loop (full-width loads of the other arrays are unaligned when their alignment differs,
// which costs little), and a masked tail. Masked loads suppress faults on the masked-out lanes,
// so the head and tail never touch memory outside the span. Masked stores are used only there
// because they are slower than plain stores on some cores (AMD Zen 4).
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* (GCC
// bug 105593, fixed in GCC 13); the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "offload/cpu_adam_kernels.h"

namespace hsdp::cpu_adam_detail {
namespace {

struct Vec {
  __m512 beta1, beta2, omb1, omb2, step_size, inv_sqrt_bc2, eps, wd, decay, scale;
  explicit Vec(const AdamCoeffs& c)
      : beta1(_mm512_set1_ps(c.beta1)),
        beta2(_mm512_set1_ps(c.beta2)),
        omb1(_mm512_set1_ps(c.one_minus_beta1)),
        omb2(_mm512_set1_ps(c.one_minus_beta2)),
        step_size(_mm512_set1_ps(c.step_size)),
        inv_sqrt_bc2(_mm512_set1_ps(c.inv_sqrt_bc2)),
        eps(_mm512_set1_ps(c.eps)),
        wd(_mm512_set1_ps(c.weight_decay)),
        decay(_mm512_set1_ps(c.decay)),
        scale(_mm512_set1_ps(c.grad_scale)) {}
};

// bf16Bits lane-wise: round to nearest even, NaN -> quiet NaN. Integer arithmetic rather than
// AVX512_BF16's vcvtneps2bf16, which flushes denormals to zero and so would differ from
// hsdp::toBf16 (and is missing on most AVX-512 CPUs).
inline __m512i toBf16Lanes(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}

// The operations of adamElement, in its order, on 16 lanes.
template <bool kAdamW>
inline void adamLanes(const Vec& k, __m512& p, __m512 g, __m512& m, __m512& v) {
  g = _mm512_mul_ps(g, k.scale);
  if constexpr (kAdamW) p = _mm512_mul_ps(p, k.decay);
  else g = _mm512_add_ps(g, _mm512_mul_ps(k.wd, p));
  m = _mm512_add_ps(_mm512_mul_ps(k.beta1, m), _mm512_mul_ps(k.omb1, g));
  v = _mm512_add_ps(_mm512_mul_ps(k.beta2, v), _mm512_mul_ps(_mm512_mul_ps(k.omb2, g), g));
  const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(v), k.inv_sqrt_bc2), k.eps);
  p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(k.step_size, m), denom));
}

template <bool kAdamW, bool kBf16, bool kStream>
inline void fullVector(const Vec& k, const AdamSpan& s, size_t i) {
  __m512 p = _mm512_loadu_ps(s.param + i);
  __m512 m = _mm512_loadu_ps(s.exp_avg + i);
  __m512 v = _mm512_loadu_ps(s.exp_avg_sq + i);
  adamLanes<kAdamW>(k, p, _mm512_loadu_ps(s.grad + i), m, v);
  _mm512_storeu_ps(s.param + i, p);
  _mm512_storeu_ps(s.exp_avg + i, m);
  _mm512_storeu_ps(s.exp_avg_sq + i, v);
  if constexpr (kBf16) {
    const __m256i h = _mm512_cvtepi32_epi16(toBf16Lanes(p));
    __m256i* dst = reinterpret_cast<__m256i*>(s.param_bf16 + i);
    if constexpr (kStream) _mm256_stream_si256(dst, h);  // 32-byte aligned: checked by run()
    else _mm256_storeu_si256(dst, h);
  }
}

template <bool kAdamW, bool kBf16>
inline void maskedVector(const Vec& k, const AdamSpan& s, size_t i, size_t count) {
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1u);  // count in [1, 16)
  __m512 p = _mm512_maskz_loadu_ps(mask, s.param + i);
  __m512 m = _mm512_maskz_loadu_ps(mask, s.exp_avg + i);
  __m512 v = _mm512_maskz_loadu_ps(mask, s.exp_avg_sq + i);
  adamLanes<kAdamW>(k, p, _mm512_maskz_loadu_ps(mask, s.grad + i), m, v);
  _mm512_mask_storeu_ps(s.param + i, mask, p);
  _mm512_mask_storeu_ps(s.exp_avg + i, mask, m);
  _mm512_mask_storeu_ps(s.exp_avg_sq + i, mask, v);
  if constexpr (kBf16) _mm512_mask_cvtepi32_storeu_epi16(s.param_bf16 + i, mask, toBf16Lanes(p));
}

template <bool kAdamW, bool kBf16>
void run(const AdamCoeffs& c, const AdamSpan& s) {
  const Vec k(c);
  const size_t head = headElements(s.param, s.n, 64);
  if (head > 0) maskedVector<kAdamW, kBf16>(k, s, 0, head);
  size_t i = head;
  const bool stream = kBf16 && c.stream_bf16 &&
                      reinterpret_cast<uintptr_t>(s.param_bf16 + head) % 32 == 0;
  if (stream) {
    for (; i + 16 <= s.n; i += 16) fullVector<kAdamW, kBf16, true>(k, s, i);
    _mm_sfence();  // streaming stores are weakly ordered: publish them before returning
  } else {
    for (; i + 16 <= s.n; i += 16) fullVector<kAdamW, kBf16, false>(k, s, i);
  }
  if (i < s.n) maskedVector<kAdamW, kBf16>(k, s, i, s.n - i);
}

}  // namespace

void adamKernelAvx512(const AdamCoeffs& c, const AdamSpan& s) {
  dispatchFlags(c, s, [&]<bool kAdamW, bool kBf16>() { run<kAdamW, kBf16>(c, s); });
}

}  // namespace hsdp::cpu_adam_detail
