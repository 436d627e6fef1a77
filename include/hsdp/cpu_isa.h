// The x86 vector extensions hsdp's SIMD kernels are built for, and which of them this CPU runs.
// The kernels (the CPU Adam in offload/, the wire quantizers in core/) are compiled once per ISA
// into their own objects and picked at run time, best first, so one binary runs on any x86-64
// CPU (and, elsewhere, the scalar kernels alone).
#pragma once

#include <string_view>
#include <vector>

#include "hsdp/status.h"

namespace hsdp {

enum class CpuIsa { kScalar, kAvx2, kAvx512 };

const char* cpuIsaName(CpuIsa isa);  // "scalar", "avx2", "avx512"
// "scalar", "avx2" or "avx512"; anything else is InvalidArgument naming the value.
StatusOr<CpuIsa> parseCpuIsa(std::string_view name);
// Compiled into this build (the AVX paths only in x86-64 builds) and runnable on this CPU.
bool cpuIsaSupported(CpuIsa isa);
// The ISAs cpuIsaSupported accepts, best first (scalar is always last).
std::vector<CpuIsa> supportedCpuIsas();

}  // namespace hsdp
