// The AVX2 quantization kernels (int8): kVectorKernels (quantize_kernels.h, which states the
// rules of this file) on the AVX2 traits (simd_avx2.h), 8 elements per register. AVX2 has no
// cheap masked byte stores, so a block's last len % 8 elements run the scalar element functions
// compiled in this file (the same bits). Built with -mavx2 plus -ffp-contract=off; the
// dispatcher calls them only when __builtin_cpu_supports("avx2").
#include "core/quantize_kernels.h"
#include "core/simd_avx2.h"

namespace hsdp::quant_detail {

const Kernels& kernelsAvx2() { return kVectorKernels<simd::Avx2>; }

}  // namespace hsdp::quant_detail
