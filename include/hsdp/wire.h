// The wire formats' names and settings (what EngineConfig names): fp32, bf16, int8 and int4, the
// block size of the quantized ones. The encodings themselves and their kernels: hsdp/quantize.h.
#pragma once

#include <cstdint>
#include <string_view>

#include "hsdp/status.h"

namespace hsdp {

enum class Wire : uint8_t { kFp32, kBf16, kInt8, kInt4 };

const char* wireName(Wire w);  // "fp32", "bf16", "int8", "int4"
// "fp32" (or "float"), "bf16", "int8", "int4"; anything else is InvalidArgument naming it.
StatusOr<Wire> parseWire(std::string_view name);
inline bool wireQuantized(Wire w) { return w == Wire::kInt8 || w == Wire::kInt4; }

// Elements per scale: the default, and the bounds validate() accepts (a multiple of 16).
constexpr uint32_t kDefaultQuantBlock = 2048;
constexpr uint32_t kMinQuantBlock = 16;
constexpr uint32_t kMaxQuantBlock = uint32_t{1} << 20;
// Blocks whose largest magnitude is below this (2^-100) quantize to zeros.
constexpr float kMinQuantAbsMax = 0x1p-100f;

struct WireFormat {
  Wire wire = Wire::kFp32;
  uint32_t block = kDefaultQuantBlock;  // int8/int4 only
};

// InvalidArgument naming the block size unless it is a multiple of 16 in [16, 2^20].
[[nodiscard]] Status validate(const WireFormat& f);

}  // namespace hsdp
