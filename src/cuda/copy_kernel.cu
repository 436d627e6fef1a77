// Batched copies between separate float arrays: FSDP2's copy-in / copy-out between a unit's flat
// buffer and per-parameter tensors, one launch for up to kMaxCopyPieces tensors. The table travels
// by value as a kernel argument (as PyTorch's multi_tensor_apply passes its tensor lists), so
// nothing is allocated or copied to the device for it.
#include "collectives/nccl/cuda_check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"

namespace hsdp::gpu {
namespace {

// Piece k owns blocks [first_block[k], first_block[k + 1]): blocks in proportion to its size, so
// a unit's one large weight gets most of the GPU and its biases a block each.
struct CopyTable {
  CopyPiece piece[kMaxCopyPieces];
  unsigned first_block[kMaxCopyPieces + 1];
  unsigned count;
};
static_assert(sizeof(CopyTable) <= 4000, "kernel arguments are limited to 4 KiB");

// dst[i] += src[i] is one correctly rounded addition (the host path's `+=`, bit for bit).
template <bool kAccumulate>
__global__ void batchedCopyKernel(const CopyTable table) {
  // The piece of this block: the last k with first_block[k] <= blockIdx.x.
  unsigned lo = 0, hi = table.count;
  while (hi - lo > 1) {
    const unsigned mid = (lo + hi) / 2;
    if (table.first_block[mid] <= blockIdx.x)
      lo = mid;
    else
      hi = mid;
  }
  const CopyPiece p = table.piece[lo];
  const unsigned blocks = table.first_block[lo + 1] - table.first_block[lo];
  const size_t stride = static_cast<size_t>(blocks) * blockDim.x;
  for (size_t i =
           static_cast<size_t>(blockIdx.x - table.first_block[lo]) * blockDim.x + threadIdx.x;
       i < p.n; i += stride) {
    if constexpr (kAccumulate)
      p.dst[i] = __fadd_rn(p.dst[i], p.src[i]);
    else
      p.dst[i] = p.src[i];
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
    size_t total = 0;
    for (size_t k = b; k < count && k < b + kMaxCopyPieces; ++k) {
      if (pieces[k].n == 0) continue;
      table.piece[table.count++] = pieces[k];
      total += pieces[k].n;
    }
    if (table.count == 0) continue;
    // The blocks a grid-stride loop over everything would get, shared out by size (at least
    // one per piece, never more than its elements need).
    const size_t grid = detail::gridFor(total);
    unsigned next = 0;
    for (unsigned k = 0; k < table.count; ++k) {
      const size_t n = table.piece[k].n;
      const size_t share = (n * grid + total - 1) / total;
      const size_t need = (n + detail::kThreads - 1) / detail::kThreads;
      table.first_block[k] = next;
      next += static_cast<unsigned>(std::max<size_t>(1, std::min(share, need)));
    }
    table.first_block[table.count] = next;
    if (accumulate)
      batchedCopyKernel<true><<<next, detail::kThreads, 0, stream>>>(table);
    else
      batchedCopyKernel<false><<<next, detail::kThreads, 0, stream>>>(table);
    HSDP_CUDA_CHECK(cudaGetLastError());
  }
  return okStatus();
}

}  // namespace hsdp::gpu
