// The CUDA memory space (cuda/cuda_space.h): device buffers, the copy and cast kernels of
// cuda/kernels.h, the two lanes and the events that order them, and pool-block reuse.
#include "cuda/cuda_space.h"

#include <algorithm>
#include <cstring>

#include "collectives/nccl/cuda_check.h"
#include "hsdp/log.h"

namespace hsdp::gpu {
namespace {

// Host staging for setParameter / gatherFullParameters: pinned, so the copies are true DMA on
// the compute stream; reused chunk by chunk (set-up and checkpoint paths, not the step).
constexpr size_t kStagingBytes = size_t{4} << 20;

// Device memory plus the event that marks the end of its last use before a pool hands it out
// again (BufferPool::release -> markReleased; acquire -> awaitReuse).
struct DeviceOwner final : SpaceBuffer::Owner {
  DeviceBuffer buffer;
  Event released;
  bool marked = false;
};

}  // namespace

CudaSpace::~CudaSpace() {
  // The pinned staging buffer is freed next: its last copy must be done.
  if (staging_done_.get() != nullptr) (void)cudaEventSynchronize(staging_done_.get());
}

StatusOr<std::unique_ptr<CudaSpace>> CudaSpace::create(cudaStream_t compute) {
  std::unique_ptr<CudaSpace> s(new CudaSpace());
  std::string why;
  if (deviceCount(&why) == 0)
    return failedPrecondition("Device::kCuda: no CUDA device visible (", why, ")");
  HSDP_CUDA_CHECK(cudaGetDevice(&s->device_));
  s->compute_ = compute;
  // Why a stream of our own: a gradient's post-processing after its reduce-scatter (bf16
  // upcast, the replica all-reduce waiting on it) must not queue behind the rest of backward
  // on the compute stream, nor hold backward up.
  HSDP_ASSIGN_OR_RETURN(s->reduce_, Stream::create("hsdp-engine-reduce"));
  // Why: order() records it on one lane for the other to wait on (one at a time, so one
  // event, re-recorded, serves every call).
  HSDP_ASSIGN_OR_RETURN(s->lane_mark_, Event::create());
  // Why: the host may refill the pinned staging buffer only after the copy reading it ran.
  HSDP_ASSIGN_OR_RETURN(s->staging_done_, Event::create());
  HSDP_ASSIGN_OR_RETURN(s->staging_, PinnedBuffer::allocate(kStagingBytes));
  return s;
}

StatusOr<SpaceBuffer> CudaSpace::allocate(size_t bytes) {
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  auto owner = std::make_unique<DeviceOwner>();
  HSDP_ASSIGN_OR_RETURN(owner->buffer, DeviceBuffer::allocate(bytes));
  HSDP_ASSIGN_OR_RETURN(owner->released, Event::create());
  void* data = owner->buffer.data();
  // Zero-filled like the host space (padding must hold zeros); on the compute stream, which
  // every later use is ordered after (setComputeStream carries the order to a new stream).
  if (bytes > 0) HSDP_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, compute_));
  return SpaceBuffer(data, bytes, std::move(owner));
}

void CudaSpace::setComputeStream(void* s) {
  cudaStream_t next = static_cast<cudaStream_t>(s);
  if (next == compute_) return;
  // Work already on the old stream (allocations' zero-fill, a step) comes before anything on
  // the new one. An error here is sticky and surfaces at the next checked call.
  if (cudaEventRecord(lane_mark_.get(), compute_) != cudaSuccess ||
      cudaStreamWaitEvent(next, lane_mark_.get(), 0) != cudaSuccess)
    HSDP_WARN(kShard, "setComputeStream: ordering the new stream after the old one failed: ",
              cudaGetErrorString(cudaGetLastError()));
  compute_ = next;
  if (compute_listener_) compute_listener_(compute_);
}

Status CudaSpace::zero(void* p, size_t bytes, Lane lane) {
  if (bytes == 0) return okStatus();
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  HSDP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream(lane)));
  return okStatus();
}

Status CudaSpace::copy(void* dst, const void* src, size_t bytes, Lane lane) {
  if (bytes == 0) return okStatus();
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  HSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(lane)));
  return okStatus();
}

Status CudaSpace::batchedCopy(std::span<const hsdp::CopyPiece> pieces, bool accumulate, Lane lane) {
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  // The kernel's own piece type; the vector is reused, so nothing is allocated once grown.
  // gpu::batchedCopy checks every piece before its first launch.
  copy_pieces_.clear();
  for (const hsdp::CopyPiece& p : pieces) copy_pieces_.push_back({p.src, p.dst, p.n});
  return gpu::batchedCopy(copy_pieces_.data(), copy_pieces_.size(), accumulate, stream(lane));
}

Status CudaSpace::castToBf16(const float* in, bf16* out, size_t n, Lane lane) {
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  return gpu::castToBf16(in, out, n, stream(lane));
}

Status CudaSpace::castToFloat(const bf16* in, float* out, size_t n, Lane lane) {
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  return gpu::castToFloat(in, out, n, stream(lane));
}

Status CudaSpace::copyFromHost(void* dst, const void* src, size_t bytes) {
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  for (size_t off = 0; off < bytes; off += kStagingBytes) {
    const size_t n = std::min(kStagingBytes, bytes - off);
    HSDP_RETURN_IF_ERROR(stagingFree());
    std::memcpy(staging_.data(), static_cast<const char*>(src) + off, n);
    HSDP_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, staging_.data(), n,
                                    cudaMemcpyHostToDevice, compute_));
    HSDP_CUDA_CHECK(cudaEventRecord(staging_done_.get(), compute_));
    staging_pending_ = true;
  }
  return okStatus();
}

Status CudaSpace::copyToHost(void* dst, const void* src, size_t bytes) {
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  for (size_t off = 0; off < bytes; off += kStagingBytes) {
    const size_t n = std::min(kStagingBytes, bytes - off);
    HSDP_RETURN_IF_ERROR(stagingFree());
    HSDP_CUDA_CHECK(cudaMemcpyAsync(staging_.data(), static_cast<const char*>(src) + off, n,
                                    cudaMemcpyDeviceToHost, compute_));
    HSDP_CUDA_CHECK(cudaEventRecord(staging_done_.get(), compute_));
    staging_pending_ = true;
    HSDP_RETURN_IF_ERROR(stagingFree());  // the host needs the bytes now
    std::memcpy(static_cast<char*>(dst) + off, staging_.data(), n);
  }
  return okStatus();
}

Status CudaSpace::order(Lane lane, Lane after) {
  if (lane == after) return okStatus();
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  HSDP_CUDA_CHECK(cudaEventRecord(lane_mark_.get(), stream(after)));
  HSDP_CUDA_CHECK(cudaStreamWaitEvent(stream(lane), lane_mark_.get(), 0));
  return okStatus();
}

Status CudaSpace::markReleased(const SpaceBuffer& block, Lane lane) {
  auto* owner = static_cast<DeviceOwner*>(block.owner());
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  HSDP_CUDA_CHECK(cudaEventRecord(owner->released.get(), stream(lane)));
  owner->marked = true;
  return okStatus();
}

Status CudaSpace::awaitReuse(const SpaceBuffer& block) {
  auto* owner = static_cast<DeviceOwner*>(block.owner());
  if (!owner->marked) return okStatus();
  HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(device_));
  HSDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, owner->released.get(), 0));
  return okStatus();
}

Status CudaSpace::stagingFree() {
  if (!staging_pending_) return okStatus();
  HSDP_CUDA_CHECK(cudaEventSynchronize(staging_done_.get()));
  staging_pending_ = false;
  return okStatus();
}

}  // namespace hsdp::gpu
