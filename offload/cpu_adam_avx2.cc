// The AVX2 CPU Adam kernel: 8 elements per vector. Built with -mavx2 plus -fno-math-errno
// -ffp-contract=off; the dispatcher calls it only when __builtin_cpu_supports("avx2"). FMA is
// deliberately not used (nor required): fusing would change rounding and break the bitwise
// contract with the scalar path, and the step is memory-bound, so it would buy no speed. See
// cpu_adam_kernels.h for the rules of this file.
//
// AVX2 has no cheap masked stores, so the head (up to the first 32-byte-aligned param element)
// and the tail run the scalar element function compiled in this file; it computes the same bits.
#include <immintrin.h>

#include "offload/cpu_adam_kernels.h"

namespace hsdp::cpu_adam_detail {
namespace {

struct Vec {
  __m256 beta1, beta2, omb1, omb2, step_size, inv_sqrt_bc2, eps, wd, decay, scale;
  explicit Vec(const AdamCoeffs& c)
      : beta1(_mm256_set1_ps(c.beta1)),
        beta2(_mm256_set1_ps(c.beta2)),
        omb1(_mm256_set1_ps(c.one_minus_beta1)),
        omb2(_mm256_set1_ps(c.one_minus_beta2)),
        step_size(_mm256_set1_ps(c.step_size)),
        inv_sqrt_bc2(_mm256_set1_ps(c.inv_sqrt_bc2)),
        eps(_mm256_set1_ps(c.eps)),
        wd(_mm256_set1_ps(c.weight_decay)),
        decay(_mm256_set1_ps(c.decay)),
        scale(_mm256_set1_ps(c.grad_scale)) {}
};

// bf16Bits lane-wise (round to nearest even, NaN -> quiet NaN), packed to 8 x 16 bits.
inline __m128i toBf16Lanes(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Every lane is <= 0xffff, so the unsigned-saturating pack is exact.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// The operations of adamElement, in its order, on 8 lanes.
template <bool kAdamW>
inline void adamLanes(const Vec& k, __m256& p, __m256 g, __m256& m, __m256& v) {
  g = _mm256_mul_ps(g, k.scale);
  if constexpr (kAdamW) p = _mm256_mul_ps(p, k.decay);
  else g = _mm256_add_ps(g, _mm256_mul_ps(k.wd, p));
  m = _mm256_add_ps(_mm256_mul_ps(k.beta1, m), _mm256_mul_ps(k.omb1, g));
  v = _mm256_add_ps(_mm256_mul_ps(k.beta2, v), _mm256_mul_ps(_mm256_mul_ps(k.omb2, g), g));
  const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), k.inv_sqrt_bc2), k.eps);
  p = _mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(k.step_size, m), denom));
}

template <bool kAdamW, bool kBf16, bool kStream>
size_t mainLoop(const Vec& k, const AdamSpan& s, size_t i) {
  for (; i + 8 <= s.n; i += 8) {
    __m256 p = _mm256_loadu_ps(s.param + i);
    __m256 m = _mm256_loadu_ps(s.exp_avg + i);
    __m256 v = _mm256_loadu_ps(s.exp_avg_sq + i);
    adamLanes<kAdamW>(k, p, _mm256_loadu_ps(s.grad + i), m, v);
    _mm256_storeu_ps(s.param + i, p);
    _mm256_storeu_ps(s.exp_avg + i, m);
    _mm256_storeu_ps(s.exp_avg_sq + i, v);
    if constexpr (kBf16) {
      __m128i* dst = reinterpret_cast<__m128i*>(s.param_bf16 + i);
      if constexpr (kStream) _mm_stream_si128(dst, toBf16Lanes(p));  // 16-byte aligned: run()
      else _mm_storeu_si128(dst, toBf16Lanes(p));
    }
  }
  return i;
}

template <bool kAdamW, bool kBf16>
void run(const AdamCoeffs& c, const AdamSpan& s) {
  const Vec k(c);
  const size_t head = headElements(s.param, s.n, 32);
  adamScalarRange<kAdamW, kBf16>(c, s, 0, head);
  size_t i = head;
  const bool stream = kBf16 && c.stream_bf16 &&
                      reinterpret_cast<uintptr_t>(s.param_bf16 + head) % 16 == 0;
  if (stream) {
    i = mainLoop<kAdamW, kBf16, true>(k, s, i);
    _mm_sfence();  // streaming stores are weakly ordered: publish them before returning
  } else {
    i = mainLoop<kAdamW, kBf16, false>(k, s, i);
  }
  adamScalarRange<kAdamW, kBf16>(c, s, i, s.n);
}

}  // namespace

void adamKernelAvx2(const AdamCoeffs& c, const AdamSpan& s) {
  dispatchFlags(c, s, [&]<bool kAdamW, bool kBf16>() { run<kAdamW, kBf16>(c, s); });
}

}  // namespace hsdp::cpu_adam_detail
