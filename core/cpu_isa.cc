// CPU ISA names and run-time detection, shared by every family of SIMD kernels (hsdp/cpu_isa.h).
#include "hsdp/cpu_isa.h"

namespace hsdp {

const char* cpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

StatusOr<CpuIsa> parseCpuIsa(std::string_view name) {
  if (name == "scalar") return CpuIsa::kScalar;
  if (name == "avx2") return CpuIsa::kAvx2;
  if (name == "avx512") return CpuIsa::kAvx512;
  return invalidArgument("unknown CPU ISA '", name, "' (expected avx512, avx2 or scalar)");
}

bool cpuIsaSupported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
#if defined(HSDP_CPU_X86)
    // __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
#else
    default:
      return false;
#endif
  }
  return false;
}

std::vector<CpuIsa> supportedCpuIsas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar})
    if (cpuIsaSupported(isa)) out.push_back(isa);
  return out;
}

}  // namespace hsdp
