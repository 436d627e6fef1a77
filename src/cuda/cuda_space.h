// Internal to hsdp: the CUDA memory space (core/memory_space.h) and the parts of its bundle that
// need only CUDA: the step's kernels (Adam, the gradient norm) and the host copies (CPU offload's
// trip, checkpoint snapshots). The collectives on its buffers need NCCL and live beside the NCCL
// transport (cuda/nccl_space.cc), which builds the bundle and registers it as "cuda".
//
// Lanes (core/memory_space.h) on one device:
//   kCompute  the user's compute stream (ShardedModel::setComputeStream; default the legacy
//             default stream): gathered parameters are consumed there, gradients zeroed and
//             written there, the optimizer and the norm run there.
//   kReduce   reduce_, a stream of the space's own (cuda_space.cc says why).
// The host waits for the device only in copyToHost and StepKernels::normResult, i.e. where the
// public contract hands a value to the host (gatherFullParameters, the norm for clipping).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

#include "collectives/nccl/cuda_resources.h"
#include "core/memory_space.h"
#include "cuda/kernels.h"

namespace hsdp::gpu {

class CudaSpace final : public MemorySpace {
 public:
  // On the device current now; `compute` is the user's compute stream (nullptr: the legacy
  // default stream). FailedPrecondition when no CUDA device is visible.
  static StatusOr<std::unique_ptr<CudaSpace>> create(cudaStream_t compute);
  ~CudaSpace() override;

  StatusOr<SpaceBuffer> allocate(size_t bytes) override;
  Status checkPointer(const void* p) const override { return checkDevicePointer(p, device_); }
  Status zero(void* p, size_t bytes, Lane lane) override;
  Status copy(void* dst, const void* src, size_t bytes, Lane lane) override;
  Status batchedCopy(std::span<const hsdp::CopyPiece> pieces, bool accumulate, Lane lane) override;
  Status castToBf16(const float* in, bf16* out, size_t n, Lane lane) override;
  Status castToFloat(const bf16* in, float* out, size_t n, Lane lane) override;
  Status copyFromHost(void* dst, const void* src, size_t bytes) override;
  Status copyToHost(void* dst, const void* src, size_t bytes) override;
  Status order(Lane lane, Lane after) override;
  Status markReleased(const SpaceBuffer& block, Lane lane) override;
  Status awaitReuse(const SpaceBuffer& block) override;
  void setComputeStream(void* stream) override;

  // ---- for the rest of the bundle (the kernels, the host copies, the NCCL collectives) ----
  int device() const { return device_; }
  cudaStream_t stream(Lane lane) const { return lane == Lane::kCompute ? compute_ : reduce_.get(); }
  // Called with the new compute stream whenever setComputeStream changes it (the collectives
  // re-point the communicators bound to kCompute); one listener, null to remove it.
  void onComputeStream(std::function<void(cudaStream_t)> listener) {
    compute_listener_ = std::move(listener);
  }

 private:
  CudaSpace() = default;
  Status stagingFree();

  int device_ = 0;
  cudaStream_t compute_ = nullptr;  // the user's; not owned
  Stream reduce_;
  Event lane_mark_;
  PinnedBuffer staging_;
  Event staging_done_;
  bool staging_pending_ = false;
  std::vector<gpu::CopyPiece> copy_pieces_;  // batchedCopy's table, reused
  std::function<void(cudaStream_t)> compute_listener_;
};

// The step's kernels on `space`'s compute stream; the norm is summed over a group through
// `collectives` (the space's, bound to the group's communicator). Both outlive the kernels.
StatusOr<std::unique_ptr<StepKernels>> createCudaStepKernels(CudaSpace& space,
                                                             SpaceCollectives& collectives);
// The offload and snapshot copies of `space` (which outlives them), on copy streams of their own.
StatusOr<std::unique_ptr<HostCopies>> createCudaHostCopies(CudaSpace& space);

}  // namespace hsdp::gpu
