// The CUDA space's host copies (cuda/cuda_space.h): CPU offload's trip of a shard (the gradient
// down to the CPU Adam, the updated parameters back up) and checkpoint snapshots, each on a copy
// stream of its own, between device memory and host memory registered (pinned) per slot.
#include "collectives/nccl/cuda_check.h"
#include "cuda/cuda_space.h"
#include "hsdp/log.h"

namespace hsdp::gpu {
namespace {

// CPU offload of one unit (or a checkpoint's snapshot buffer): its host buffers, registered
// (pinned) for asynchronous copies, and the events of its trip. Needs nothing of the
// HostCopies that made it (the engine's units outlive the space's objects).
struct CudaOffloadSlot final : HostCopies::OffloadSlot {
  ~CudaOffloadSlot() override {
    // A copy may still read or write the host memory: let it finish before unpinning.
    if (downloaded.get() != nullptr) (void)cudaEventSynchronize(downloaded.get());
    if (uploaded.get() != nullptr) (void)cudaEventSynchronize(uploaded.get());
    if (snapshotted.get() != nullptr) (void)cudaEventSynchronize(snapshotted.get());
    for (void* p : registered) {
      cudaError_t err = cudaHostUnregister(p);
      if (err != cudaSuccess)
        HSDP_WARN(kOffload, "cudaHostUnregister(", p, "): ", cudaGetErrorString(err));
    }
  }
  std::vector<void*> registered;
  // Why: the worker thread waits for the gradient shard's D2H before the CPU Adam reads it.
  Event downloaded;
  // Why: the compute stream waits for the updated parameters' H2D before anything reads them.
  Event uploaded;
  // Why: the checkpoint writer waits for the snapshot's D2H before it writes the host copy, and
  // the compute stream waits for it before the next step overwrites the state.
  Event snapshotted;
};

class CudaHostCopies final : public HostCopies {
 public:
  explicit CudaHostCopies(CudaSpace& space) : space_(space) {}

  Status init() {
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    // Why: a copy stream records it on a lane to wait for that lane's work so far (the training
    // thread only, one at a time, so one event, re-recorded, serves every call).
    HSDP_ASSIGN_OR_RETURN(lane_mark_, Event::create());
    // Why two copy streams (CPU offload): a gradient shard goes down as soon as its reduction
    // lands and updated parameters come up as soon as the CPU Adam is done, neither queued
    // behind compute nor behind each other.
    HSDP_ASSIGN_OR_RETURN(d2h_, Stream::create("hsdp-offload-d2h"));
    HSDP_ASSIGN_OR_RETURN(h2d_, Stream::create("hsdp-offload-h2d"));
    return okStatus();
  }

  StatusOr<std::unique_ptr<OffloadSlot>> offloadSlot(
      const std::vector<std::pair<void*, size_t>>& host_buffers) override {
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    auto slot = std::make_unique<CudaOffloadSlot>();
    HSDP_ASSIGN_OR_RETURN(slot->downloaded, Event::create());
    HSDP_ASSIGN_OR_RETURN(slot->uploaded, Event::create());
    for (auto [p, bytes] : host_buffers) {
      if (p == nullptr || bytes == 0) continue;
      // After the NUMA binding and pre-faulting (HostBuffer::allocateNuma), so the pinned pages
      // are the NUMA-local ones.
      HSDP_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
      slot->registered.push_back(p);
    }
    return std::unique_ptr<OffloadSlot>(std::move(slot));
  }

  Status startDownload(OffloadSlot& slot, void* host, const void* src, size_t bytes) override {
    auto& s = static_cast<CudaOffloadSlot&>(slot);
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    // The shard is final once the reduce lane has it (scatter, upcast, replica all-reduce).
    HSDP_CUDA_CHECK(cudaEventRecord(lane_mark_.get(), space_.stream(Lane::kReduce)));
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(d2h_.get(), lane_mark_.get(), 0));
    HSDP_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, d2h_.get()));
    HSDP_CUDA_CHECK(cudaEventRecord(s.downloaded.get(), d2h_.get()));
    return okStatus();
  }

  Status finishDownload(OffloadSlot& slot, void*, const void*, size_t) override {
    auto& s = static_cast<CudaOffloadSlot&>(slot);
    HSDP_CUDA_CHECK(cudaEventSynchronize(s.downloaded.get()));  // the CPU reads it next
    return okStatus();
  }

  // Runs on the offload worker thread: touches only h2d_ and the slot (the training thread
  // waits for this job before it reads the slot's event).
  Status upload(OffloadSlot& slot, void* dst, const void* host, size_t bytes) override {
    auto& s = static_cast<CudaOffloadSlot&>(slot);
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    HSDP_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, h2d_.get()));
    HSDP_CUDA_CHECK(cudaEventRecord(s.uploaded.get(), h2d_.get()));
    return okStatus();
  }

  Status awaitUpload(OffloadSlot& slot) override {
    auto& s = static_cast<CudaOffloadSlot&>(slot);
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    // Never recorded (no step yet): no effect.
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(space_.stream(Lane::kCompute), s.uploaded.get(), 0));
    return okStatus();
  }

  // Checkpoint snapshot of device state into the slot's registered host memory, on ckpt_d2h_.
  Status startSnapshot(OffloadSlot& slot, void* host, const void* src, size_t bytes) override {
    auto& s = static_cast<CudaOffloadSlot&>(slot);
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    if (ckpt_d2h_.get() == nullptr) {
      // Why a stream of its own: the snapshot is copied while the next step's forward runs,
      // queued neither behind compute nor behind the offload copies of the gradient shards.
      HSDP_ASSIGN_OR_RETURN(ckpt_d2h_, Stream::create("hsdp-ckpt-d2h"));
    }
    if (s.snapshotted.get() == nullptr) {
      HSDP_ASSIGN_OR_RETURN(s.snapshotted, Event::create());
    }
    const cudaStream_t compute = space_.stream(Lane::kCompute);
    // The state is final once the step enqueued on the compute stream has run.
    HSDP_CUDA_CHECK(cudaEventRecord(lane_mark_.get(), compute));
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(ckpt_d2h_.get(), lane_mark_.get(), 0));
    HSDP_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ckpt_d2h_.get()));
    HSDP_CUDA_CHECK(cudaEventRecord(s.snapshotted.get(), ckpt_d2h_.get()));
    // The next step must not overwrite the shard before the copy has read it.
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(compute, s.snapshotted.get(), 0));
    return okStatus();
  }

  Status finishSnapshot(OffloadSlot& slot) override {
    auto& s = static_cast<CudaOffloadSlot&>(slot);
    if (s.snapshotted.get() != nullptr) HSDP_CUDA_CHECK(cudaEventSynchronize(s.snapshotted.get()));
    return okStatus();
  }

 private:
  CudaSpace& space_;
  Event lane_mark_;
  Stream d2h_, h2d_;
  Stream ckpt_d2h_;  // created with the first checkpoint snapshot
};

}  // namespace

StatusOr<std::unique_ptr<HostCopies>> createCudaHostCopies(CudaSpace& space) {
  auto c = std::make_unique<CudaHostCopies>(space);
  HSDP_RETURN_IF_ERROR(c->init());
  return std::unique_ptr<HostCopies>(std::move(c));
}

}  // namespace hsdp::gpu
