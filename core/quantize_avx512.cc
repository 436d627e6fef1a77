// The AVX-512 quantization kernels (int8): kVectorKernels (quantize_kernels.h, which states the
// rules of this file) on the AVX-512 traits (simd_avx512.h), 16 elements per register, masked
// loads and stores for a block's tail. Built with -mavx512f plus -ffp-contract=off; the
// dispatcher calls them only when __builtin_cpu_supports("avx512f"). cvtps2dq rounds to nearest
// even in the default MXCSR mode, as roundEven does.
#include "core/quantize_kernels.h"
#include "core/simd_avx512.h"

namespace hsdp::quant_detail {

const Kernels& kernelsAvx512() { return kVectorKernels<simd::Avx512>; }

}  // namespace hsdp::quant_detail
