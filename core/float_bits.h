// Private to the SIMD kernels (core/quantize_*.cc, offload/cpu_adam_*.cc): a float's bit pattern
// and back, and the all-lanes tag. Freestanding and of internal linkage, as those translation units
// require (every one gets its own copy, compiled with its own ISA flags; offload/cpu_adam_kernels.h
// explains why).
#pragma once

#include <cstdint>

namespace hsdp::simd {
namespace {

inline float bitsToFloat(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline uint32_t floatToBits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
}

// The vector kernels' tag for "every lane of the register" where an ISA with masked loads and
// stores would take a mask of the first few (offload/cpu_adam_kernels.h, core/quantize_kernels.h).
struct AllLanes {};

}  // namespace
}  // namespace hsdp::simd
