// The AVX2 CPU Adam kernel: adamVectorKernel (cpu_adam_kernels.h, which states the rules of this
// file) on the AVX2 traits (core/simd_avx2.h), 8 elements per register. Built with -mavx2 plus
// -fno-math-errno -ffp-contract=off; the dispatcher calls it only when
// __builtin_cpu_supports("avx2"). FMA is deliberately not used (nor required): fusing would
// change rounding and break the bitwise contract with the scalar path, and the step is
// memory-bound, so it would buy no speed.
//
// AVX2 has no cheap masked stores, so the head (up to the first 32-byte-aligned param element)
// and the tail run the scalar element function compiled in this file; it computes the same bits.
#include "core/simd_avx2.h"
#include "offload/cpu_adam_kernels.h"

namespace hsdp::cpu_adam_detail {

void adamKernelAvx2(const AdamCoeffs& c, const AdamSpan& s) { adamVectorKernel<simd::Avx2>(c, s); }

}  // namespace hsdp::cpu_adam_detail
