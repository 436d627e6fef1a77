// Batched copies between separate float arrays: FSDP2's copy-in / copy-out between a unit's flat
// buffer and per-parameter tensors, one launch for up to kMaxCopyPieces tensors. The table travels
// by value as a kernel argument (as PyTorch's multi_tensor_apply passes its tensor lists), so
// nothing is allocated or copied to the device for it.
#include "cuda/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace hsdp::gpu {
namespace {

struct CopyTable {
  CopyPiece piece[kMaxCopyPieces];
};
static_assert(sizeof(CopyTable) <= 4000, "kernel arguments are limited to 4 KiB");

// blockIdx.y picks the piece; the x blocks stride over it. dst[i] += src[i] is one correctly
// rounded addition (the host path's `+=`, bit for bit).
template <bool kAccumulate>
__global__ void batchedCopyKernel(const CopyTable table) {
  const CopyPiece p = table.piece[blockIdx.y];
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += stride) {
    if constexpr (kAccumulate) p.dst[i] = __fadd_rn(p.dst[i], p.src[i]);
    else p.dst[i] = p.src[i];
  }
}

}  // namespace

Status batchedCopy(const CopyPiece* pieces, size_t count, bool accumulate, cudaStream_t stream) {
  for (size_t k = 0; k < count; ++k)
    if (pieces[k].n > 0 && (pieces[k].src == nullptr || pieces[k].dst == nullptr))
      return invalidArgument("batchedCopy: piece ", k, " of ", count, " has a null array with ",
                             pieces[k].n, " elements");
  for (size_t b = 0; b < count; b += kMaxCopyPieces) {
    CopyTable table{};
    unsigned live = 0;
    size_t largest = 0;
    for (size_t k = b; k < count && k < b + kMaxCopyPieces; ++k) {
      if (pieces[k].n == 0) continue;
      table.piece[live++] = pieces[k];
      largest = std::max(largest, pieces[k].n);
    }
    if (live == 0) continue;
    // The pieces share the blocks a grid-stride loop over the largest would get.
    const unsigned x = std::max(1u, (detail::gridFor(largest) + live - 1) / live);
    const dim3 grid(x, live);
    if (accumulate)
      batchedCopyKernel<true><<<grid, detail::kThreads, 0, stream>>>(table);
    else
      batchedCopyKernel<false><<<grid, detail::kThreads, 0, stream>>>(table);
    HSDP_CUDA_CHECK(cudaGetLastError());
  }
  return okStatus();
}

}  // namespace hsdp::gpu
