// The engine's CUDA memory space (engine/memory_space.h): device buffers, the kernels of
// cuda/kernels.h and NCCL collectives, ordered with events on two lanes:
//   kCompute  the user's compute stream (ShardedModel::setComputeStream; default the legacy
//             default stream): gathered parameters are consumed there, gradients zeroed and
//             written there, the optimizer and the norm run there.
//   kReduce   reduce_, a stream of the engine's own (below).
// Collectives run on the NCCL communicators' role streams; each bound communicator waits for its
// lane's queued work before a collective (NcclComm::setCallerStream), and a lane that needs a
// collective's result waits for an event recorded on the role stream right after the collective
// was enqueued. The host waits for the device only in copyToHost and normResult, i.e. where the
// public contract hands a value to the host (gatherFullParameters, the norm for clipping).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include "hsdp/nccl.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_resources.h"
#include "cuda/kernels.h"
#include "hsdp/log.h"
#include "engine/memory_space.h"

namespace hsdp {
namespace {

// Host staging for setParameter / gatherFullParameters: pinned, so the copies are true DMA on
// the compute stream; reused chunk by chunk (set-up and checkpoint paths, not the step).
constexpr size_t kStagingBytes = size_t{4} << 20;
// Collectives reached but not yet seen complete; beyond this many the oldest is waited for
// (the host falls that far behind only if nothing ever polls).
constexpr size_t kMaxInflight = 4096;

// Device memory plus the event that marks the end of its last use before a pool hands it out
// again (BufferPool::release -> markReleased; acquire -> awaitReuse).
struct DeviceOwner final : SpaceBuffer::Owner {
  gpu::DeviceBuffer buffer;
  gpu::Event released;
  bool marked = false;
};

// A collective of a bound NCCL communicator plus an event recorded on its role stream right
// after the enqueue: what a lane waits on to consume the result.
class DeviceWork final : public Work {
 public:
  DeviceWork(WorkHandle inner, gpu::Event done)
      : inner_(std::move(inner)), done_(std::move(done)) {}
  Status wait() override { return inner_->wait(); }
  StatusOr<bool> test() override { return inner_->test(); }
  cudaEvent_t event() const { return done_.get(); }
  gpu::Event takeEvent() { return std::move(done_); }

 private:
  WorkHandle inner_;
  gpu::Event done_;
};

// CPU offload of one unit: its host buffers, registered (pinned) for asynchronous copies, and
// the events of its trip.
struct CudaOffloadSlot final : MemorySpace::OffloadSlot {
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
  gpu::Event downloaded;
  // Why: the compute stream waits for the updated parameters' H2D before anything reads them.
  gpu::Event uploaded;
  // Why: the checkpoint writer waits for the snapshot's D2H before it writes the host copy, and
  // the compute stream waits for it before the next step overwrites the state.
  gpu::Event snapshotted;
};

class CudaMemorySpace final : public MemorySpace {
 public:
  ~CudaMemorySpace() override {
    // The communicators outlive the engine (the mesh does); their caller streams must not point
    // at reduce_, which dies with us.
    for (const Bound& b : bound_) b.comm->setCallerStream(nullptr);
    // The pinned staging and norm buffers are freed next: their last copies must be done.
    if (staging_done_.get() != nullptr) (void)cudaEventSynchronize(staging_done_.get());
    if (norm_ready_.get() != nullptr) (void)cudaEventSynchronize(norm_ready_.get());
  }

  static StatusOr<std::unique_ptr<MemorySpace>> create(void* compute) {
    std::unique_ptr<CudaMemorySpace> s(new CudaMemorySpace());
    std::string why;
    if (gpu::deviceCount(&why) == 0)
      return failedPrecondition("Device::kCuda: no CUDA device visible (", why, ")");
    HSDP_CUDA_CHECK(cudaGetDevice(&s->device_));
    s->compute_ = static_cast<cudaStream_t>(compute);
    // Why a stream of our own: a gradient's post-processing after its reduce-scatter (bf16
    // upcast, the replica all-reduce waiting on it) must not queue behind the rest of backward
    // on the compute stream, nor hold backward up.
    HSDP_ASSIGN_OR_RETURN(s->reduce_, gpu::Stream::create("hsdp-engine-reduce"));
    // Why: order() records it on one lane for the other to wait on (one at a time, so one
    // event, re-recorded, serves every call).
    HSDP_ASSIGN_OR_RETURN(s->lane_mark_, gpu::Event::create());
    // Why: the host may refill the pinned staging buffer only after the copy reading it ran.
    HSDP_ASSIGN_OR_RETURN(s->staging_done_, gpu::Event::create());
    // Why: normResult() waits for the norm's read-back into pinned memory, nothing later.
    HSDP_ASSIGN_OR_RETURN(s->norm_ready_, gpu::Event::create());
    // Why two copy streams (CPU offload): a gradient shard goes down as soon as its reduction
    // lands and updated parameters come up as soon as the CPU Adam is done, neither queued
    // behind compute nor behind each other.
    HSDP_ASSIGN_OR_RETURN(s->d2h_, gpu::Stream::create("hsdp-offload-d2h"));
    HSDP_ASSIGN_OR_RETURN(s->h2d_, gpu::Stream::create("hsdp-offload-h2d"));
    HSDP_ASSIGN_OR_RETURN(s->staging_, gpu::PinnedBuffer::allocate(kStagingBytes));
    HSDP_ASSIGN_OR_RETURN(s->norm_acc_, gpu::DeviceBuffer::allocate(sizeof(double)));
    HSDP_ASSIGN_OR_RETURN(s->norm_scratch_,
                          gpu::DeviceBuffer::allocate(gpu::kSumSquaresScratch * sizeof(double)));
    HSDP_ASSIGN_OR_RETURN(s->norm_partial_, gpu::DeviceBuffer::allocate(sizeof(float)));
    HSDP_ASSIGN_OR_RETURN(s->norm_host_, gpu::PinnedBuffer::allocate(2 * sizeof(double)));
    HSDP_INFO(kShard, "engine on CUDA device ", s->device_, " (compute stream ", compute, ")");
    return std::unique_ptr<MemorySpace>(std::move(s));
  }

  Device device() const override { return Device::kCuda; }

  StatusOr<SpaceBuffer> allocate(size_t bytes) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    auto owner = std::make_unique<DeviceOwner>();
    HSDP_ASSIGN_OR_RETURN(owner->buffer, gpu::DeviceBuffer::allocate(bytes));
    HSDP_ASSIGN_OR_RETURN(owner->released, gpu::Event::create());
    void* data = owner->buffer.data();
    // Zero-filled like the host space (padding must hold zeros); on the compute stream, which
    // every later use is ordered after (setComputeStream carries the order to a new stream).
    if (bytes > 0) HSDP_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, compute_));
    return SpaceBuffer(data, bytes, std::move(owner));
  }

  Status bindComm(Comm& comm, Lane lane, const char* role) override {
    auto* nccl = dynamic_cast<nccl::NcclComm*>(&comm);
    if (nccl == nullptr || std::string_view(comm.transportName()) != "nccl")
      return invalidArgument("Device::kCuda: the mesh's ", role, " communicator runs on '",
                             comm.transportName(),
                             "', not nccl; build the mesh over an NCCL world "
                             "(hsdp::nccl::createNcclComm, hsdp/nccl.h)");
    if (nccl->device() != device_)
      return invalidArgument("Device::kCuda: the mesh's ", role, " communicator is on CUDA device ",
                             nccl->device(), " but the engine was created on device ", device_,
                             " (make the communicator's device current before create())");
    for (const Bound& b : bound_)
      if (b.comm == nccl && b.lane != lane)
        return internalError("the ", role, " communicator is bound to two lanes");
    nccl->setCallerStream(stream(lane));
    bound_.push_back({nccl, lane});
    return okStatus();
  }

  void setComputeStream(void* s) override {
    cudaStream_t next = static_cast<cudaStream_t>(s);
    if (next == compute_) return;
    // Work already on the old stream (allocations' zero-fill, a step) comes before anything on
    // the new one. An error here is sticky and surfaces at the next checked call.
    if (cudaEventRecord(lane_mark_.get(), compute_) != cudaSuccess ||
        cudaStreamWaitEvent(next, lane_mark_.get(), 0) != cudaSuccess)
      HSDP_WARN(kShard, "setComputeStream: ordering the new stream after the old one failed: ",
                cudaGetErrorString(cudaGetLastError()));
    compute_ = next;
    for (const Bound& b : bound_)
      if (b.lane == Lane::kCompute) b.comm->setCallerStream(compute_);
  }

  Status zero(void* p, size_t bytes, Lane lane) override {
    if (bytes == 0) return okStatus();
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream(lane)));
    return okStatus();
  }

  Status copy(void* dst, const void* src, size_t bytes, Lane lane) override {
    if (bytes == 0) return okStatus();
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream(lane)));
    return okStatus();
  }

  Status checkPointer(const void* p) const override { return gpu::checkDevicePointer(p, device_); }

  Status batchedCopy(std::span<const CopyPiece> pieces, bool accumulate, Lane lane) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    // The kernel's own piece type; the vector is reused, so nothing is allocated once grown.
    // gpu::batchedCopy checks every piece before its first launch.
    copy_pieces_.clear();
    for (const CopyPiece& p : pieces) copy_pieces_.push_back({p.src, p.dst, p.n});
    return gpu::batchedCopy(copy_pieces_.data(), copy_pieces_.size(), accumulate, stream(lane));
  }

  Status castToBf16(const float* in, bf16* out, size_t n, Lane lane) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    return gpu::castToBf16(in, out, n, stream(lane));
  }

  Status castToFloat(const bf16* in, float* out, size_t n, Lane lane) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    return gpu::castToFloat(in, out, n, stream(lane));
  }

  Status copyFromHost(void* dst, const void* src, size_t bytes) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
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

  Status copyToHost(void* dst, const void* src, size_t bytes) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
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

  Status adamStep(const AdamConfig& cfg, int64_t t, const AdamShard& s, float grad_scale) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    return gpu::adamStep(cfg, t, {s.param, s.grad, s.exp_avg, s.exp_avg_sq, s.n, s.param_bf16},
                         compute_, grad_scale);
  }

  Status normBegin() override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_CUDA_CHECK(cudaMemsetAsync(norm_acc_.data(), 0, sizeof(double), compute_));
    return okStatus();
  }

  Status normAccumulate(const float* x, size_t n) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    return gpu::sumSquares(x, n, norm_acc_.as<double>(), norm_scratch_.as<double>(), compute_);
  }

  Status normReduce(Comm* group) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    norm_reduced_ = group != nullptr;
    if (norm_reduced_) {  // as the host: the float rounding of the sum, summed over the group
      HSDP_RETURN_IF_ERROR(
          gpu::castDoubleToFloat(norm_acc_.as<double>(), norm_partial_.as<float>(), 1, compute_));
      HSDP_ASSIGN_OR_RETURN(
          WorkHandle w, iallReduce(*group, norm_partial_.data(), 1, DType::kFloat32, RedOp::kSum));
      HSDP_ASSIGN_OR_RETURN(bool done,
                            reached(w, Lane::kCompute, /*block=*/true, /*exposed=*/false));
      (void)done;
      HSDP_CUDA_CHECK(cudaMemcpyAsync(norm_host_.as<double>() + 1, norm_partial_.data(),
                                      sizeof(float), cudaMemcpyDeviceToHost, compute_));
    } else {
      HSDP_CUDA_CHECK(cudaMemcpyAsync(norm_host_.data(), norm_acc_.data(), sizeof(double),
                                      cudaMemcpyDeviceToHost, compute_));
    }
    HSDP_CUDA_CHECK(cudaEventRecord(norm_ready_.get(), compute_));
    return okStatus();
  }

  StatusOr<double> normResult() override {
    HSDP_CUDA_CHECK(cudaEventSynchronize(norm_ready_.get()));
    if (norm_reduced_) {
      float f;
      std::memcpy(&f, norm_host_.as<double>() + 1, sizeof(float));
      return static_cast<double>(f);
    }
    return *norm_host_.as<double>();
  }

  StatusOr<WorkHandle> iallGather(Comm& comm, const void* send, void* recv, size_t count,
                                  DType dtype) override {
    HSDP_ASSIGN_OR_RETURN(nccl::NcclComm * nccl, boundComm(comm, "all-gather"));
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, comm.iallGather(send, recv, count, dtype));
    return track(std::move(w), nccl->stream(nccl::StreamRole::kAllGather));
  }

  StatusOr<WorkHandle> ireduceScatter(Comm& comm, const void* send, void* recv, size_t count,
                                      DType dtype, RedOp op) override {
    HSDP_ASSIGN_OR_RETURN(nccl::NcclComm * nccl, boundComm(comm, "reduce-scatter"));
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, comm.ireduceScatter(send, recv, count, dtype, op));
    return track(std::move(w), nccl->stream(nccl::StreamRole::kReduceScatter));
  }

  StatusOr<WorkHandle> iallReduce(Comm& comm, void* buf, size_t count, DType dtype,
                                  RedOp op) override {
    HSDP_ASSIGN_OR_RETURN(nccl::NcclComm * nccl, boundComm(comm, "all-reduce"));
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, comm.iallReduce(buf, count, dtype, op));
    return track(std::move(w), nccl->stream(nccl::StreamRole::kAllReduce));
  }

  StatusOr<WorkHandle> igroup(Comm& comm, std::span<const CollectiveOp> ops) override {
    HSDP_ASSIGN_OR_RETURN(nccl::NcclComm * nccl, boundComm(comm, "group"));
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, comm.igroup(ops));
    // The group ran on its first operation's role stream (NcclComm::igroup).
    const nccl::StreamRole role =
        ops.empty() ? nccl::StreamRole::kAllGather : nccl::streamRoleOf(ops.front().kind);
    return track(std::move(w), nccl->stream(role));
  }

  StatusOr<bool> reached(WorkHandle& w, Lane lane, bool block, bool exposed) override {
    if (w == nullptr) return true;
    auto* dw = dynamic_cast<DeviceWork*>(w.get());
    if (dw == nullptr) return internalError("CUDA memory space: a collective it did not start");
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(stream(lane), dw->event(), 0));
    // Kept until it completes, so an NCCL error or timeout still surfaces (poll()).
    inflight_.push_back(std::move(w));
    HSDP_RETURN_IF_ERROR(poll());
    return true;
  }

  Status order(Lane lane, Lane after) override {
    if (lane == after) return okStatus();
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_CUDA_CHECK(cudaEventRecord(lane_mark_.get(), stream(after)));
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(stream(lane), lane_mark_.get(), 0));
    return okStatus();
  }

  Status poll() override {
    while (!inflight_.empty()) {
      WorkHandle& front = inflight_.front();
      bool done = false;
      if (inflight_.size() > kMaxInflight) {
        HSDP_RETURN_IF_ERROR(front->wait());
        done = true;
      } else {
        HSDP_ASSIGN_OR_RETURN(done, front->test());
      }
      if (!done) break;
      // The collective completed, and our event was recorded right after it on the same
      // stream, so the event is free for reuse (a re-record does not disturb earlier waits).
      free_events_.push_back(static_cast<DeviceWork*>(front.get())->takeEvent());
      inflight_.pop_front();
    }
    return okStatus();
  }

  Status markReleased(const SpaceBuffer& block, Lane lane) override {
    auto* owner = static_cast<DeviceOwner*>(block.owner());
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_CUDA_CHECK(cudaEventRecord(owner->released.get(), stream(lane)));
    owner->marked = true;
    return okStatus();
  }

  Status awaitReuse(const SpaceBuffer& block) override {
    auto* owner = static_cast<DeviceOwner*>(block.owner());
    if (!owner->marked) return okStatus();
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, owner->released.get(), 0));
    return okStatus();
  }

  StatusOr<std::unique_ptr<OffloadSlot>> offloadSlot(
      const std::vector<std::pair<void*, size_t>>& host_buffers) override {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    auto slot = std::make_unique<CudaOffloadSlot>();
    HSDP_ASSIGN_OR_RETURN(slot->downloaded, gpu::Event::create());
    HSDP_ASSIGN_OR_RETURN(slot->uploaded, gpu::Event::create());
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
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    // The shard is final once the reduce lane has it (scatter, upcast, replica all-reduce).
    HSDP_CUDA_CHECK(cudaEventRecord(lane_mark_.get(), reduce_.get()));
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
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    HSDP_CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, h2d_.get()));
    HSDP_CUDA_CHECK(cudaEventRecord(s.uploaded.get(), h2d_.get()));
    return okStatus();
  }

  Status awaitUpload(OffloadSlot& slot) override {
    auto& s = static_cast<CudaOffloadSlot&>(slot);
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    // Never recorded (no step yet): no effect.
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, s.uploaded.get(), 0));
    return okStatus();
  }

  // Checkpoint snapshot of device state into the slot's registered host memory, on ckpt_d2h_.
  Status startSnapshot(OffloadSlot& slot, void* host, const void* src, size_t bytes) override {
    auto& s = static_cast<CudaOffloadSlot&>(slot);
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(device_));
    if (ckpt_d2h_.get() == nullptr) {
      // Why a stream of its own: the snapshot is copied while the next step's forward runs,
      // queued neither behind compute nor behind the offload copies of the gradient shards.
      HSDP_ASSIGN_OR_RETURN(ckpt_d2h_, gpu::Stream::create("hsdp-ckpt-d2h"));
    }
    if (s.snapshotted.get() == nullptr) {
      HSDP_ASSIGN_OR_RETURN(s.snapshotted, gpu::Event::create());
    }
    // The state is final once the step enqueued on the compute stream has run.
    HSDP_CUDA_CHECK(cudaEventRecord(lane_mark_.get(), compute_));
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(ckpt_d2h_.get(), lane_mark_.get(), 0));
    HSDP_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, ckpt_d2h_.get()));
    HSDP_CUDA_CHECK(cudaEventRecord(s.snapshotted.get(), ckpt_d2h_.get()));
    // The next step must not overwrite the shard before the copy has read it.
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, s.snapshotted.get(), 0));
    return okStatus();
  }

  Status finishSnapshot(OffloadSlot& slot) override {
    auto& s = static_cast<CudaOffloadSlot&>(slot);
    if (s.snapshotted.get() != nullptr) HSDP_CUDA_CHECK(cudaEventSynchronize(s.snapshotted.get()));
    return okStatus();
  }


 private:
  struct Bound {
    nccl::NcclComm* comm;
    Lane lane;
  };

  CudaMemorySpace() = default;

  cudaStream_t stream(Lane lane) const { return lane == Lane::kCompute ? compute_ : reduce_.get(); }

  StatusOr<nccl::NcclComm*> boundComm(Comm& comm, const char* op) const {
    for (const Bound& b : bound_)
      if (b.comm == &comm) return b.comm;
    return internalError("CUDA memory space: ", op, " on a communicator that was not bound");
  }

  // Wraps a just-enqueued collective with an event recorded after it on its role stream.
  StatusOr<WorkHandle> track(WorkHandle w, cudaStream_t role_stream) {
    gpu::Event e;
    if (!free_events_.empty()) {
      e = std::move(free_events_.back());
      free_events_.pop_back();
    } else {
      HSDP_ASSIGN_OR_RETURN(e, gpu::Event::create());
    }
    HSDP_CUDA_CHECK(cudaEventRecord(e.get(), role_stream));
    return WorkHandle(std::make_unique<DeviceWork>(std::move(w), std::move(e)));
  }

  Status stagingFree() {
    if (!staging_pending_) return okStatus();
    HSDP_CUDA_CHECK(cudaEventSynchronize(staging_done_.get()));
    staging_pending_ = false;
    return okStatus();
  }

  int device_ = 0;
  cudaStream_t compute_ = nullptr;  // the user's; not owned
  gpu::Stream reduce_;
  gpu::Stream d2h_, h2d_;
  gpu::Stream ckpt_d2h_;  // created with the first checkpoint snapshot
  gpu::Event lane_mark_;
  gpu::PinnedBuffer staging_;
  gpu::Event staging_done_;
  bool staging_pending_ = false;
  gpu::DeviceBuffer norm_acc_;      // one double: the sum of squares
  gpu::DeviceBuffer norm_scratch_;  // gpu::sumSquares' block partials
  gpu::DeviceBuffer norm_partial_;  // one float: the rounded sum, all-reduced in place
  gpu::PinnedBuffer norm_host_;     // [0]: the double; [1]: the float (read back)
  gpu::Event norm_ready_;
  bool norm_reduced_ = false;
  std::vector<Bound> bound_;
  std::deque<WorkHandle> inflight_;
  std::vector<gpu::Event> free_events_;
  std::vector<gpu::CopyPiece> copy_pieces_;  // batchedCopy's table, reused
};

}  // namespace

namespace modules {
// Called once by the generated module list (cmake/HsdpModules.cmake).
void registerCudaMemorySpace() {
  registerMemorySpace(Device::kCuda, [](void* compute_stream) {
    return CudaMemorySpace::create(compute_stream);
  });
}
}  // namespace modules

}  // namespace hsdp
