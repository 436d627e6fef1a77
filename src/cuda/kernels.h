// CUDA kernels on device shards, launched from the host onto a caller's stream. Every launcher
// validates its arguments like its CPU counterpart, enqueues the work and returns; errors in the
// launch come back as a Status (HSDP_CUDA_CHECK), errors while the kernel runs surface at the
// next synchronisation on that stream.
//
// Adam: exactly hsdp::adamStep (core/adam.h) applied to grad * grad_scale, like
// hsdp::CpuAdam: the same single-precision operations in the same order, each correctly rounded
// (no FMA contraction, IEEE division and sqrt, denormals kept), with the bias corrections
// computed on the host in double exactly as adamStep does. So the GPU step, the CPU Adam and
// adamStep agree bit for bit, and an optimizer shard may move between host and device mid-run.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/adam.h"
#include "hsdp/dtype.h"
#include "hsdp/quantize.h"
#include "hsdp/status.h"

namespace hsdp::gpu {

// The shard is hsdp::AdamShard (core/adam.h) with device pointers. 16-byte aligned
// param/grad/moments (and an 8-byte aligned bf16 copy) take the vectorised path; any alignment
// works.
// One step (t counts from 1) over the shard with the gradient multiplied by grad_scale first
// (1 / loss scale, a clipping coefficient). Errors (InvalidArgument, naming the value, nothing
// enqueued): invalid cfg (hsdp::validate), t < 1, grad_scale negative or not finite, a null array
// with n > 0.
Status adamStep(const AdamConfig& cfg, int64_t t, const AdamShard& shard, cudaStream_t stream,
                float grad_scale = 1.0f);

// out[i] = bf16(in[i]) (round to nearest even, as hsdp::toBf16); out[i] = float(in[i]) (exact).
Status castToBf16(const float* in, bf16* out, size_t n, cudaStream_t stream);
Status castToFloat(const bf16* in, float* out, size_t n, cudaStream_t stream);

// x[i] *= factor, in place (float32 or bf16; bf16 is scaled in float and rounded back).
Status scale(void* x, size_t n, DType dtype, float factor, cudaStream_t stream);

// Squared L2 norm, deterministic: *acc += sum of double(x[i])^2, summed in double in a fixed
// order for a given n and device (block partials into `scratch`, then one block adds them up),
// so the same data gives the same bits every step. `scratch` holds kSumSquaresScratch doubles of
// device memory and must not be used by other work on `stream` meanwhile; `acc` is one device
// double. Errors: null arrays with n > 0.
constexpr size_t kSumSquaresScratch = 1024;
Status sumSquares(const float* x, size_t n, double* acc, double* scratch, cudaStream_t stream);

// FSDP2's copy-in / copy-out between per-parameter tensors and a unit's flat buffer: for every
// piece dst[i] = src[i], or with `accumulate` dst[i] += src[i] (one correctly rounded add, as the
// host's +=). One launch per kMaxCopyPieces pieces, whatever their sizes; nothing allocated.
// Pieces must not overlap one another's dst (they run concurrently). Errors: a null array with
// n > 0 (InvalidArgument naming the piece, nothing enqueued).
struct CopyPiece {
  const float* src = nullptr;
  float* dst = nullptr;
  size_t n = 0;
};
constexpr size_t kMaxCopyPieces = 64;
Status batchedCopy(const CopyPiece* pieces, size_t count, bool accumulate, cudaStream_t stream);

// out[i] = float(in[i]) (round to nearest).
Status castDoubleToFloat(const double* in, float* out, size_t n, cudaStream_t stream);

// Block quantization (f.wire int8 or int4, hsdp/quantize.h): the bytes hsdp::wireEncode writes
// and the values hsdp::wireDecode returns for the same input, bit for bit (NaN payloads aside).
// quantize: src (+ residual, updated as error feedback when not null) -> dst, encodedBytes(f, n)
// bytes; dequantize: dst = decode(src), or dst += decode(src) with `accumulate`. Errors
// (InvalidArgument, nothing enqueued): another wire, a bad block size, a null array with n > 0.
Status quantize(const WireFormat& f, const float* src, size_t n, void* dst, float* residual,
                cudaStream_t stream);
Status dequantize(const WireFormat& f, const void* src, size_t n, float* dst, bool accumulate,
                  cudaStream_t stream);

}  // namespace hsdp::gpu
