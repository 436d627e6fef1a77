// The AVX-512 CPU Adam kernel: adamVectorKernel (cpu_adam_kernels.h, which states the rules of
// this file: internal linkage only, the bitwise contract) on the AVX-512 traits
// (core/simd_avx512.h), 16 elements per register. Built with -mavx512f plus -fno-math-errno
// -ffp-contract=off; the dispatcher calls it only when __builtin_cpu_supports("avx512f").
//
// A masked head up to the first 64-byte-aligned param element, an unmasked main loop and a
// masked tail; masked stores only there, because they are slower than plain stores on some
// cores (AMD Zen 4). The bf16 copy is bf16Round's integer arithmetic rather than AVX512_BF16's
// vcvtneps2bf16, which flushes denormals to zero and so would differ from hsdp::toBf16 (and is
// missing on most AVX-512 CPUs).
#include "core/simd_avx512.h"
#include "offload/cpu_adam_kernels.h"

namespace hsdp::cpu_adam_detail {

void adamKernelAvx512(const AdamCoeffs& c, const AdamSpan& s) {
  adamVectorKernel<simd::Avx512>(c, s);
}

}  // namespace hsdp::cpu_adam_detail
