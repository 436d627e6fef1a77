// The scalar quantization kernels: the reference the vector paths are tested against, and the
// path for CPUs without AVX2. Built with the baseline flags plus -ffp-contract=off
// (core/CMakeLists.txt); see quantize_kernels.h for the rules of this file.
#include "core/quantize_kernels.h"

namespace hsdp::quant_detail {
namespace {

// The scalar block functions, for encodeAll8 / decodeAll8 (quantize_kernels.h).
struct Blocks {
  template <bool kRes>
  static void encode(const float* s, float* r, size_t len, unsigned char* out) {
    const BlockParams p = blockParams(absMaxBits<kRes>(s, r, len), 127.0f);
    storeScale(out, p.scale);
    encodeTail8(p, s, r, 0, len, reinterpret_cast<signed char*>(out + 4));
  }
  template <bool kAcc>
  static void decode(float scale, const signed char* codes, size_t len, float* d) {
    decodeTail8(scale, codes, 0, len, d, kAcc);
  }
};

constexpr Kernels kTable = {encodeAll8<Blocks>, decodeAll8<Blocks>, encode4All, decode4All};

}  // namespace

const Kernels& kernelsScalar() { return kTable; }

}  // namespace hsdp::quant_detail
