// The scalar quantization kernels: the reference the vector paths are tested against, and the
// path for CPUs without AVX2. Built with the baseline flags plus -ffp-contract=off
// (core/CMakeLists.txt); see quantize_kernels.h for the rules of this file.
#include "core/quantize_kernels.h"

namespace hsdp::quant_detail {
namespace {

void encode8(const float* src, float* res, size_t n, uint32_t block, unsigned char* dst) {
  forEachBlock(n, block, blockBytes8(block), [&](size_t off, size_t len, size_t at) {
    const float* s = src + off;
    float* r = res ? res + off : nullptr;
    const BlockParams p = blockParams(absMaxBits(s, r, len), 127.0f);
    storeScale(dst + at, p.scale);
    encodeTail8(p, s, r, 0, len, reinterpret_cast<signed char*>(dst + at + 4));
  });
}

void decode8(const unsigned char* src, size_t n, uint32_t block, float* dst, bool accumulate) {
  forEachBlock(n, block, blockBytes8(block), [&](size_t off, size_t len, size_t at) {
    decodeTail8(loadScale(src + at), reinterpret_cast<const signed char*>(src + at + 4), 0, len,
                dst + off, accumulate);
  });
}

constexpr Kernels kTable = {encode8, decode8, encode4All, decode4All};

}  // namespace

const Kernels& kernelsScalar() { return kTable; }

}  // namespace hsdp::quant_detail
