// Internal to hsdp: the seam between the engine and the memory its buffers live in. The engine
// (layer 3) runs on any memory space; a space's backend (layer 2: cuda/ for the memory, the step's
// kernels and the host copies, collectives/nccl/ for the collectives on its buffers) implements
// these interfaces and registers a factory by device name, so the engine never names a backend.
// Here, below both, because a layer-2 backend cannot include an engine header
// (scripts/check-layers).
//
// A space comes as a bundle of four small objects, each owned by the engine object that uses it:
//  - MemorySpace       memory: allocation, copies and casts, lane ordering, pool-block reuse
//                      (the engine's ShardedModel state)
//  - SpaceCollectives  collectives on the space's buffers and waiting for them (UnitCollectives)
//  - StepKernels       the optimizer step's math on the space: Adam, the gradient norm
//                      (OptimizerStep)
//  - HostCopies        a shard's trip to host memory and back (CPU offload) and checkpoint
//                      snapshots into host memory (OptimizerStep; the checkpoint saver uses it)
//
// Ordering model. Local operations run on one of two lanes. kCompute is the user's compute
// stream (ShardedModel::setComputeStream): gathers are consumed there, gradients written there,
// the optimizer steps there. kReduce is where a reduced gradient is post-processed (bf16 upcast,
// replica all-reduce) so that backward does not wait for reductions. On the host both lanes are
// the calling thread and every ordering call is a no-op or a blocking wait.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "core/adam.h"
#include "core/host_buffer.h"
#include "hsdp/dtype.h"
#include "hsdp/optimizer.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"

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

// Memory: where the engine's buffers live and the local operations on them, each enqueued on a
// lane (host: done on return).
class MemorySpace {
 public:
  virtual ~MemorySpace() = default;

  // Zero-filled memory of this space (ResourceExhausted when it does not fit).
  virtual StatusOr<SpaceBuffer> allocate(size_t bytes) = 0;
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
  // Later work on `lane` waits for the work enqueued on `after` so far (host: nothing to do).
  virtual Status order(Lane lane, Lane after) = 0;

  // ---- reuse of pool blocks ----
  // The block's current contents are last used by the work enqueued on `lane` so far.
  virtual Status markReleased(const SpaceBuffer& block, Lane lane) = 0;
  // Work enqueued on kCompute from now on comes after that last use.
  virtual Status awaitReuse(const SpaceBuffer& block) = 0;

  // CUDA: the user's compute stream (a cudaStream_t; nullptr: the legacy default stream); the
  // communicators bound to kCompute follow it (the space's collectives see to it). Host: ignored.
  virtual void setComputeStream(void* stream) {}
};

// Collectives on buffers of one memory space and waiting for them.
class SpaceCollectives {
 public:
  virtual ~SpaceCollectives() = default;

  // Makes a communicator the engine uses ready for this space's buffers (CUDA: it must be an
  // NCCL communicator on this space's device, and its collectives are ordered after `lane`).
  // Errors name the communicator's role and its transport.
  virtual Status bindComm(Comm& comm, Lane lane, const char* role) = 0;

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
  // the result is true. `w` may be any Work on the host; on a device one this object started.
  virtual StatusOr<bool> reached(WorkHandle& w, Lane lane, bool block, bool exposed = true) = 0;
  // Surfaces errors of collectives reached earlier (CUDA: polls them without blocking).
  virtual Status poll() = 0;

  // Seconds the host spent blocked in reached(..., exposed = true) since the last call.
  double takeExposedSeconds() {
    double s = exposed_seconds_;
    exposed_seconds_ = 0;
    return s;
  }

 protected:
  double exposed_seconds_ = 0;
};

// The optimizer step's math on buffers of one space, on kCompute.
class StepKernels {
 public:
  virtual ~StepKernels() = default;

  // The optimizer step over one shard (pointers in this space).
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
};

// Copies between the space and host memory that run beside the step: CPU offload's trip of a
// shard to the CPU Adam and back, and checkpoint snapshots (saveAsync).
class HostCopies {
 public:
  virtual ~HostCopies() = default;

  // Per unit (or per snapshot buffer): the host buffers the copies visit (CUDA: registered with
  // cudaHostRegister, so the copies are asynchronous DMA, unregistered when the slot dies, which
  // must be before the buffers are freed) and the events of its copies. The host space needs
  // none of it. A slot stands alone: it may outlive the HostCopies that made it.
  struct OffloadSlot {
    virtual ~OffloadSlot() = default;
  };
  virtual StatusOr<std::unique_ptr<OffloadSlot>> offloadSlot(
      const std::vector<std::pair<void*, size_t>>& host_buffers) = 0;

  // ---- CPU offload: a shard's trip to the CPU Adam in host memory and back ----
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
};

// One memory space and the objects that work on its buffers. The collectives, kernels and host
// copies may refer to `memory` (and the kernels to `collectives`): the engine destroys them
// first (ShardedModel::Impl declares the space before their owners).
struct SpaceBundle {
  std::unique_ptr<MemorySpace> memory;
  std::unique_ptr<SpaceCollectives> collectives;
  std::unique_ptr<StepKernels> kernels;
  std::unique_ptr<HostCopies> host_copies;
};

// The host space (core/memory_space_host.cc): HostBuffer, memcpy and loops; collectives on the
// transports as they are, waited for on the calling thread; nothing to copy to host memory. It
// is not registered: the engine builds it for Device::kHost. Its kernels step a shard with
// `adam` (the engine's CPU Adam, which outlives the bundle).
using HostAdamStep = std::function<Status(const AdamConfig& cfg, int64_t t, const AdamShard& shard,
                                          float grad_scale)>;
SpaceBundle hostMemorySpace(HostAdamStep adam);

// Device memory spaces register themselves by device name ("cuda": collectives/nccl/, in CUDA
// builds) so that the engine finds them and never names a backend. A factory builds the bundle
// on the device current now; `compute_stream` is the device's stream handle (cudaStream_t;
// nullptr: the default stream).
using MemorySpaceFactory = std::function<StatusOr<SpaceBundle>(void* compute_stream)>;
void registerMemorySpace(std::string_view device, MemorySpaceFactory factory);
// The factory registered for `device`, or an empty function when this build has none.
MemorySpaceFactory findMemorySpace(std::string_view device);

}  // namespace hsdp
