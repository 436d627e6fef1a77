// Wire formats of the inter-node level: how float32 data is encoded for the bytes that cross
// nodes (parameter all-gathers, gradient reduce-scatters, the replica all-reduce), and the
// encode/decode kernels. Transport-neutral math: the hierarchical schedules (collectives/hier/)
// and the engine call these; nothing here knows about communicators.
//
//   fp32  4 bytes per element, exact.
//   bf16  2 bytes, round to nearest even (hsdp::toBf16).
//   int8  block-quantized: every block of `block` consecutive elements (the last one may be
//         shorter) is one float32 scale followed by one signed byte per element,
//         scale = absmax / 127, code = round_to_nearest_even(x * (127 / absmax)), x ~ code * scale
//         (symmetric, no zero point). 1 + 4/block bytes per element: 0.2505x of fp32 at 2048.
//   int4  the same with 15 levels: scale = absmax / 7, codes in [-7, 7] stored as code + 8, two
//         per byte (element 2i in the low nibble): 0.5 + 4/block bytes per element.
//
// Layout of n encoded elements: block after block, each [scale: float32, little-endian]
// [codes], so the encoding of whole blocks k..l is one contiguous byte range
// (encodedOffset). Blocks always start at the start of what is encoded: a collective encodes each
// rank's piece separately, so no block straddles two ranks' data.
//
// Accuracy (closed form, the unit tests check it per block): for a finite block with
// absmax >= kMinQuantAbsMax every element decodes within
//     |x - decode(x)| <= (1/2 + 2^-12) * scale
// (a half step of the grid; the 2^-12 covers the float rounding of 127/absmax and of
// code * scale). A block whose absmax is below kMinQuantAbsMax (zeros included) encodes as scale 0
// and decodes to zeros: its error is at most kMinQuantAbsMax.
//
// Non-finite values: a block holding a NaN or an infinity encodes as scale NaN and decodes to NaN
// in every element (the poison propagates, as it would through an fp32 sum, and shows up in the
// gradient norm; it is never an error, so no rank can fail a collective alone). With error
// feedback such a block's residual is reset to zero, so one bad step does not poison the next.
//
// Kernels: AVX-512, AVX2 and scalar (core/quantize_*.cc, one object per ISA), picked at run time
// like the CPU Adam's; the CUDA kernels (cuda/quant_kernel.cu) compute the same bits. All of them
// use only correctly rounded single-precision operations (no FMA contraction) and round to
// nearest even, so every path gives bitwise the same encoding and decoding of the same input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hsdp/cpu_isa.h"
#include "hsdp/status.h"
#include "hsdp/wire.h"

namespace hsdp {

// Wire, WireFormat, parseWire, the block bounds and validate(): hsdp/wire.h.

// Bytes of n encoded elements, and where block k starts (k * (4 + block bytes)).
size_t encodedBytes(const WireFormat& f, size_t n);
size_t encodedOffset(const WireFormat& f, size_t block_index);
// Bits per element on the wire including the scales (32, 16, 8 + 32/block, 4 + 32/block).
double wireBitsPerElement(const WireFormat& f);

// Encodes src[0, n) into dst (encodedBytes(f, n) bytes). With `residual` (n floats, error
// feedback) the encoded values are x = src + residual, and afterwards residual = x - decode(dst)
// (0 where x's block is not finite); fp32 keeps residual at zero. Never fails.
void wireEncode(const WireFormat& f, const float* src, size_t n, void* dst,
                float* residual = nullptr);
// dst[0, n) = decode(src), or with `accumulate` dst += decode(src) (one rounded add each).
void wireDecode(const WireFormat& f, const void* src, size_t n, float* dst,
                bool accumulate = false);

// The same with a chosen kernel (tests and benchmarks); `isa` must be cpuIsaSupported. The
// functions above use the best ISA this CPU supports.
void wireEncode(CpuIsa isa, const WireFormat& f, const float* src, size_t n, void* dst,
                float* residual = nullptr);
void wireDecode(CpuIsa isa, const WireFormat& f, const void* src, size_t n, float* dst,
                bool accumulate = false);

// The scale stored for block k of an int8/int4 encoding (for tolerances: a decoded element is
// within (1/2 + 2^-12) * scale of what was encoded).
float blockScale(const WireFormat& f, const void* encoded, size_t block_index);

}  // namespace hsdp
