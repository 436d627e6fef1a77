// Element types and reduction operators that move through the transports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "hsdp/status.h"

namespace hsdp {

enum class DType { kFloat32, kBFloat16, kInt32, kInt64, kUInt8 };
enum class RedOp { kSum, kAvg };

size_t dtypeSize(DType t);
const char* dtypeName(DType t);
const char* redOpName(RedOp op);
StatusOr<DType> parseDType(std::string_view name);  // "float"/"fp32", "bf16"

// bfloat16 stored as its 16 bits: the top half of an IEEE float. Conversion rounds to nearest
// even, as hardware bf16 converts do; NaN stays NaN.
struct bf16 {
  uint16_t bits = 0;
};

inline bf16 toBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>((u + rounding) >> 16)};
}

inline float toFloat(bf16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace hsdp
