// The scalar CPU Adam kernel: the reference the vector paths are tested against, and the path
// for CPUs without AVX2. Built with the project's baseline flags plus -fno-math-errno and
// -ffp-contract=off (offload/CMakeLists.txt); see cpu_adam_kernels.h for the rules of this file.
#include "offload/cpu_adam_kernels.h"

namespace hsdp::cpu_adam_detail {

void adamKernelScalar(const AdamCoeffs& c, const AdamSpan& s) {
  dispatchFlags(c, s,
                [&]<bool kAdamW, bool kBf16>() { adamScalarRange<kAdamW, kBf16>(c, s, 0, s.n); });
}

}  // namespace hsdp::cpu_adam_detail
