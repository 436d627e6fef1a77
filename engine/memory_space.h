// Internal to the engine: the memory space ShardedModel keeps its buffers in, and the handful of
// buffer operations it needs on them. One engine (engine/sharded_model.cc) runs on either space:
//
//  - host (hostMemorySpace below, engine/memory_space.host.cc): HostBuffer, memcpy, loops and the
//    CPU Adam; collectives are waited for on the host. This is the engine as it was before the
//    seam, operation for operation, so host results are bit for bit unchanged.
//  - CUDA (engine/memory_space_cuda.cc, CUDA builds only, registered as Device::kCuda): device buffers, kernels
//    from cuda/kernels.h, NCCL collectives; "waiting" for a collective is a stream waiting on an
//    event, so the host runs ahead and only waits where the public contract needs a host value.
//
// Ordering model. Local operations run on one of two lanes. kCompute is the user's compute
// stream (ShardedModel::setComputeStream): gathers are consumed there, gradients written there,
// the optimizer steps there. kReduce is where a reduced gradient is post-processed (bf16 upcast,
// replica all-reduce) so that backward does not wait for reductions. On the host both lanes are
// the calling thread and every ordering call is a no-op or a blocking wait.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/host_buffer.h"
#include "hsdp/config.h"
#include "hsdp/mesh.h"
#include "hsdp/transport.h"
#include "offload/cpu_adam.h"

namespace hsdp {

enum class Lane { kCompute, kReduce };

// A buffer of one memory space, allocated once and zero-filled. `owner` keeps the memory (and any
// per-buffer state of the space, e.g. the CUDA event that says when a pool block may be reused).
class SpaceBuffer {
 public:
  struct Owner {
    virtual ~Owner() = default;
  };
  SpaceBuffer() = default;
  SpaceBuffer(void* data, size_t size, std::unique_ptr<Owner> owner)
      : data_(data), size_(size), owner_(std::move(owner)) {}
  // Wraps host memory (e.g. NUMA-bound optimizer state for CPU offload).
  static SpaceBuffer wrap(HostBuffer buffer);

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }
  Owner* owner() const { return owner_.get(); }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::unique_ptr<Owner> owner_;
};

// One piece of a batched copy between a unit's flat buffer and a tensor of the user's: n floats.
struct CopyPiece {
  const float* src = nullptr;
  float* dst = nullptr;
  size_t n = 0;
};

class MemorySpace {
 public:
  virtual ~MemorySpace() = default;
  virtual Device device() const = 0;

  // Zero-filled memory of this space (ResourceExhausted when it does not fit).
  virtual StatusOr<SpaceBuffer> allocate(size_t bytes) = 0;

  // Makes a communicator the engine uses ready for this space's buffers (CUDA: it must be an
  // NCCL communicator on this space's device, and its collectives are ordered after `lane`).
  // Errors name the communicator's role and its transport.
  virtual Status bindComm(Comm& comm, Lane lane, const char* role) = 0;

  // OK when `p` may be used as memory of this space (CUDA: device memory of its device, or
  // managed; host: anything, nothing to check); otherwise an InvalidArgument saying what it is.
  virtual Status checkPointer(const void* p) const = 0;

  // ---- local operations, enqueued on `lane` ----
  virtual Status zero(void* p, size_t bytes, Lane lane) = 0;
  virtual Status copy(void* dst, const void* src, size_t bytes, Lane lane) = 0;
  // For every piece dst = src, or dst += src with `accumulate` (copy-in / copy-out; CUDA: one
  // kernel launch for up to 64 pieces). Pieces do not overlap one another's dst.
  virtual Status batchedCopy(std::span<const CopyPiece> pieces, bool accumulate, Lane lane) = 0;
  virtual Status castToBf16(const float* in, bf16* out, size_t n, Lane lane) = 0;
  virtual Status castToFloat(const bf16* in, float* out, size_t n, Lane lane) = 0;
  // Host memory in and out (kCompute). copyFromHost: `src` may be reused on return.
  // copyToHost: the host waits until `dst` holds the data.
  virtual Status copyFromHost(void* dst, const void* src, size_t bytes) = 0;
  virtual Status copyToHost(void* dst, const void* src, size_t bytes) = 0;
  // The optimizer step over one shard (pointers in this space), on kCompute.
  virtual Status adamStep(const AdamConfig& cfg, int64_t t, const AdamShard& shard,
                          float grad_scale) = 0;

  // ---- the squared gradient norm, accumulated over shards in double ----
  virtual Status normBegin() = 0;
  virtual Status normAccumulate(const float* x, size_t n) = 0;  // += sum of x[i]^2 (kCompute)
  // Rounds the sum to float and sums it over `group` (blocking on the host; on a device ordered
  // on kCompute), or, with group == nullptr, keeps the double. Then starts the read-back.
  virtual Status normReduce(Comm* group) = 0;
  // The value normReduce left (the host waits for the device here, once per step at most).
  virtual StatusOr<double> normResult() = 0;

  // ---- collectives on buffers of this space ----
  virtual StatusOr<WorkHandle> iallGather(Comm& comm, const void* send, void* recv, size_t count,
                                          DType dtype) = 0;
  virtual StatusOr<WorkHandle> ireduceScatter(Comm& comm, const void* send, void* recv,
                                              size_t count, DType dtype, RedOp op) = 0;
  virtual StatusOr<WorkHandle> iallReduce(Comm& comm, void* buf, size_t count, DType dtype,
                                          RedOp op) = 0;
  // Comm::igroup on buffers of this space: several collectives that move together, one Work.
  virtual StatusOr<WorkHandle> igroup(Comm& comm, std::span<const CollectiveOp> ops) = 0;
  // Whether work on `lane` may now use the result of `w`. Host: with `block`, waits for it (the
  // time counts as exposed communication when `exposed`) and returns true; without, w->test().
  // CUDA: `lane` waits for w's completion event and this returns true at once; the handle is
  // kept (and polled for errors) until the collective completes. `w` is null afterwards when
  // the result is true.
  virtual StatusOr<bool> reached(WorkHandle& w, Lane lane, bool block, bool exposed = true) = 0;
  // Later work on `lane` waits for the work enqueued on `after` so far (host: nothing to do).
  virtual Status order(Lane lane, Lane after) = 0;
  // Surfaces errors of collectives reached earlier (CUDA: polls them without blocking).
  virtual Status poll() = 0;

  // ---- reuse of pool blocks ----
  // The block's current contents are last used by the work enqueued on `lane` so far.
  virtual Status markReleased(const SpaceBuffer& block, Lane lane) = 0;
  // Work enqueued on kCompute from now on comes after that last use.
  virtual Status awaitReuse(const SpaceBuffer& block) = 0;

  // ---- CPU offload: a shard's trip to the CPU Adam in host memory and back ----
  // Per unit: the host buffers the shard visits (CUDA: registered with cudaHostRegister, so the
  // copies are asynchronous DMA, unregistered when the slot dies, which must be before the
  // buffers are freed) and the events of its copies. The host space needs none of it.
  struct OffloadSlot {
    virtual ~OffloadSlot() = default;
  };
  virtual StatusOr<std::unique_ptr<OffloadSlot>> offloadSlot(
      const std::vector<std::pair<void*, size_t>>& host_buffers) = 0;
  // Training thread: starts copying `src` (this space) to `host` after the reductions enqueued
  // on kReduce so far. Worker thread: finishDownload returns once `host` holds it.
  virtual Status startDownload(OffloadSlot& slot, void* host, const void* src, size_t bytes) = 0;
  virtual Status finishDownload(OffloadSlot& slot, void* host, const void* src, size_t bytes) = 0;
  // Worker thread: starts copying `host` back into `dst` (this space); the host buffer may be
  // written again only after awaitUpload. Training thread, after the worker's job: kCompute
  // waits for the uploads of the slot.
  virtual Status upload(OffloadSlot& slot, void* dst, const void* host, size_t bytes) = 0;
  virtual Status awaitUpload(OffloadSlot& slot) = 0;

  // ---- checkpoint snapshots (saveAsync): state into host memory registered by offloadSlot ----
  // Starts copying `bytes` at `src` (this space) into `host` after the work enqueued on kCompute
  // so far (the step that wrote the state), on a copy stream of its own; work enqueued on
  // kCompute later (the next step) waits for the copy, so training goes on without the host
  // waiting. Host: a memcpy, done on return.
  virtual Status startSnapshot(OffloadSlot& slot, void* host, const void* src, size_t bytes) = 0;
  // Any thread (the checkpoint writer): returns once every snapshot copy started on the slot
  // has landed in host memory.
  virtual Status finishSnapshot(OffloadSlot& slot) = 0;


  // CUDA: the user's compute stream (a cudaStream_t; nullptr: the legacy default stream); the
  // communicators bound to kCompute follow it. Host: ignored.
  virtual void setComputeStream(void* stream) {}

  // Seconds the host spent blocked in reached(..., exposed = true) since the last call.
  double takeExposedSeconds() {
    double s = exposed_seconds_;
    exposed_seconds_ = 0;
    return s;
  }

 protected:
  double exposed_seconds_ = 0;
};

// The host space; steps shards with `adam` (not owned, outlives the space).
std::unique_ptr<MemorySpace> hostMemorySpace(CpuAdam* adam);

// Device memory spaces register themselves (engine/memory_space_cuda.cc, in CUDA builds) so that
// the engine finds them by Device and never names a backend. A factory builds the space on the
// device current now; `compute_stream` is the device's stream handle (cudaStream_t; nullptr: the
// default stream).
using MemorySpaceFactory =
    std::function<StatusOr<std::unique_ptr<MemorySpace>>(void* compute_stream)>;
void registerMemorySpace(Device device, MemorySpaceFactory factory);
// The registered space for `device` (kHost: not registered, use hostMemorySpace). A device this
// build has no space for is a FailedPrecondition saying how to get it.
StatusOr<std::unique_ptr<MemorySpace>> createMemorySpace(Device device, void* compute_stream);
// OK when createMemorySpace(device, ...) has a factory to call, else its FailedPrecondition.
Status memorySpaceAvailable(Device device);

}  // namespace hsdp
