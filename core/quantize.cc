// Wire formats (hsdp/quantize.h): names, sizes, and the dispatch of encode/decode to the kernel
// of the best ISA this CPU runs (the int8/int4 kernels are in quantize_{scalar,avx2,avx512}.cc;
// fp32 and bf16 are plain loops here).
#include "hsdp/quantize.h"

#include <cmath>
#include <cstring>

#include "core/quantize_kernels.h"
#include "hsdp/dtype.h"

namespace hsdp {
namespace {

const quant_detail::Kernels& kernelsFor(CpuIsa isa) {
  switch (isa) {
#if defined(HSDP_CPU_X86)
    case CpuIsa::kAvx512:
      return quant_detail::kernelsAvx512();
    case CpuIsa::kAvx2:
      return quant_detail::kernelsAvx2();
#endif
    default:
      return quant_detail::kernelsScalar();
  }
}

CpuIsa bestIsa() {
  static const CpuIsa isa = supportedCpuIsas().front();
  return isa;
}

size_t blockStride(const WireFormat& f) {
  return f.wire == Wire::kInt8 ? 4 + size_t{f.block} : 4 + size_t{f.block} / 2;
}

// bf16 with error feedback: x = src + residual, residual = x - float(bf16(x)) (0 if not finite).
void encodeBf16(const float* src, size_t n, bf16* dst, float* residual) {
  if (residual == nullptr) {
    for (size_t i = 0; i < n; ++i) dst[i] = toBf16(src[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    const float x = src[i] + residual[i];
    dst[i] = toBf16(x);
    residual[i] = std::isfinite(x) ? x - toFloat(dst[i]) : 0.0f;
  }
}

}  // namespace

const char* wireName(Wire w) {
  switch (w) {
    case Wire::kFp32:
      return "fp32";
    case Wire::kBf16:
      return "bf16";
    case Wire::kInt8:
      return "int8";
    case Wire::kInt4:
      return "int4";
  }
  return "?";
}

StatusOr<Wire> parseWire(std::string_view name) {
  if (name == "fp32" || name == "float") return Wire::kFp32;
  if (name == "bf16") return Wire::kBf16;
  if (name == "int8") return Wire::kInt8;
  if (name == "int4") return Wire::kInt4;
  return invalidArgument("unknown wire format '", name, "' (expected fp32, bf16, int8 or int4)");
}

Status validate(const WireFormat& f) {
  if (f.block < kMinQuantBlock || f.block > kMaxQuantBlock || f.block % 16 != 0)
    return invalidArgument("quantization block ", f.block, " must be a multiple of 16 in [",
                           kMinQuantBlock, ", ", kMaxQuantBlock, "]");
  return okStatus();
}

size_t encodedBytes(const WireFormat& f, size_t n) {
  switch (f.wire) {
    case Wire::kFp32:
      return n * sizeof(float);
    case Wire::kBf16:
      return n * sizeof(bf16);
    case Wire::kInt8:
    case Wire::kInt4: {
      if (n == 0) return 0;
      const size_t full = (n - 1) / f.block, last = n - full * f.block;
      return full * blockStride(f) + 4 + (f.wire == Wire::kInt8 ? last : (last + 1) / 2);
    }
  }
  return 0;
}

size_t encodedOffset(const WireFormat& f, size_t block_index) {
  if (!wireQuantized(f.wire)) return encodedBytes(f, block_index * f.block);
  return block_index * blockStride(f);
}

double wireBitsPerElement(const WireFormat& f) {
  switch (f.wire) {
    case Wire::kFp32:
      return 32;
    case Wire::kBf16:
      return 16;
    case Wire::kInt8:
      return 8 + 32.0 / f.block;
    case Wire::kInt4:
      return 4 + 32.0 / f.block;
  }
  return 0;
}

void wireEncode(CpuIsa isa, const WireFormat& f, const float* src, size_t n, void* dst,
                float* residual) {
  if (n == 0) return;
  auto* out = static_cast<unsigned char*>(dst);
  switch (f.wire) {
    case Wire::kFp32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case Wire::kBf16:
      encodeBf16(src, n, static_cast<bf16*>(dst), residual);
      return;
    case Wire::kInt8:
      kernelsFor(isa).encode8(src, residual, n, f.block, out);
      return;
    case Wire::kInt4:
      kernelsFor(isa).encode4(src, residual, n, f.block, out);
      return;
  }
}

void wireDecode(CpuIsa isa, const WireFormat& f, const void* src, size_t n, float* dst,
                bool accumulate) {
  if (n == 0) return;
  const auto* in = static_cast<const unsigned char*>(src);
  switch (f.wire) {
    case Wire::kFp32: {
      const auto* s = static_cast<const float*>(src);
      if (!accumulate)
        std::memcpy(dst, src, n * sizeof(float));
      else
        for (size_t i = 0; i < n; ++i) dst[i] += s[i];
      return;
    }
    case Wire::kBf16: {
      const auto* s = static_cast<const bf16*>(src);
      if (!accumulate)
        for (size_t i = 0; i < n; ++i) dst[i] = toFloat(s[i]);
      else
        for (size_t i = 0; i < n; ++i) dst[i] += toFloat(s[i]);
      return;
    }
    case Wire::kInt8:
      kernelsFor(isa).decode8(in, n, f.block, dst, accumulate);
      return;
    case Wire::kInt4:
      kernelsFor(isa).decode4(in, n, f.block, dst, accumulate);
      return;
  }
}

void wireEncode(const WireFormat& f, const float* src, size_t n, void* dst, float* residual) {
  wireEncode(bestIsa(), f, src, n, dst, residual);
}

void wireDecode(const WireFormat& f, const void* src, size_t n, float* dst, bool accumulate) {
  wireDecode(bestIsa(), f, src, n, dst, accumulate);
}

float blockScale(const WireFormat& f, const void* encoded, size_t block_index) {
  float s;
  std::memcpy(&s, static_cast<const char*>(encoded) + encodedOffset(f, block_index), 4);
  return s;
}

}  // namespace hsdp
