// Private to offload/ (and its tests): the pieces of CPU Adam's set-up that are pure functions,
// exposed so that tests can drive them with inputs this machine cannot produce (a CPU without
// AVX-512, say).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "offload/cpu_adam.h"

namespace hsdp::cpu_adam_detail {

// The HSDP_CPU_ADAM_ISA rule applied to `value` with `supported` (best first, non-empty).
StatusOr<CpuIsa> resolveCpuIsa(std::string_view value, const std::vector<CpuIsa>& supported);

// A step with a bf16 copy-out streams the copy (AdamCoeffs::stream_bf16) when the bytes it
// moves, 30 per element, exceed this: the last-level cache size.
size_t bf16StreamThresholdBytes();

}  // namespace hsdp::cpu_adam_detail
