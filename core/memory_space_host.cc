// The host memory space (core/memory_space.h: hostMemorySpace), beside the seam it implements:
// the engine's operations as plain host code (memcpy, loops, the CPU Adam the engine hands in),
// exactly what the engine did before the memory-space seam, so host results are bit for bit
// unchanged. Collectives are the transports' own, waited for on the calling thread. Four
// objects, as the seam splits a space: the memory, its collectives, the step's kernels and the
// host copies (nothing to copy: the shards are host memory already).
#include <chrono>
#include <cstring>

#include "core/memory_space.h"

namespace hsdp {
namespace {

class HostMemory final : public MemorySpace {
 public:
  StatusOr<SpaceBuffer> allocate(size_t bytes) override {
    HSDP_ASSIGN_OR_RETURN(HostBuffer b, HostBuffer::allocate(bytes));  // zero-filled
    return SpaceBuffer::wrap(std::move(b));
  }

  Status checkPointer(const void*) const override { return okStatus(); }

  Status zero(void* p, size_t bytes, Lane) override {
    std::memset(p, 0, bytes);
    return okStatus();
  }
  Status copy(void* dst, const void* src, size_t bytes, Lane) override {
    std::memcpy(dst, src, bytes);
    return okStatus();
  }
  Status batchedCopy(std::span<const CopyPiece> pieces, bool accumulate, Lane) override {
    for (const CopyPiece& p : pieces) {
      if (!accumulate) {
        if (p.n > 0) std::memcpy(p.dst, p.src, p.n * sizeof(float));
        continue;
      }
      for (size_t i = 0; i < p.n; ++i) p.dst[i] += p.src[i];
    }
    return okStatus();
  }
  Status castToBf16(const float* in, bf16* out, size_t n, Lane) override {
    for (size_t i = 0; i < n; ++i) out[i] = toBf16(in[i]);
    return okStatus();
  }
  Status castToFloat(const bf16* in, float* out, size_t n, Lane) override {
    for (size_t i = 0; i < n; ++i) out[i] = toFloat(in[i]);
    return okStatus();
  }
  Status copyFromHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return okStatus();
  }
  Status copyToHost(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return okStatus();
  }
  Status order(Lane, Lane) override { return okStatus(); }
  Status markReleased(const SpaceBuffer&, Lane) override { return okStatus(); }
  Status awaitReuse(const SpaceBuffer&) override { return okStatus(); }
};

// The mesh's transports as they are; a collective is waited for on the calling thread.
class HostCollectives final : public SpaceCollectives {
 public:
  Status bindComm(Comm&, Lane, const char*) override { return okStatus(); }

  StatusOr<WorkHandle> iallGather(Comm& comm, const void* send, void* recv, size_t count,
                                  DType dtype) override {
    return comm.iallGather(send, recv, count, dtype);
  }
  StatusOr<WorkHandle> ireduceScatter(Comm& comm, const void* send, void* recv, size_t count,
                                      DType dtype, RedOp op) override {
    return comm.ireduceScatter(send, recv, count, dtype, op);
  }
  StatusOr<WorkHandle> iallReduce(Comm& comm, void* buf, size_t count, DType dtype,
                                  RedOp op) override {
    return comm.iallReduce(buf, count, dtype, op);
  }
  StatusOr<WorkHandle> igroup(Comm& comm, std::span<const CollectiveOp> ops) override {
    return comm.igroup(ops);
  }
  // The step kernels' blocking sum (the gradient norm): the kernels' one collective comes this
  // way, as a device's kernels use their space's collectives.
  Status allReduceNow(Comm& comm, void* buf, size_t count, DType dtype, RedOp op) {
    return comm.allReduce(buf, count, dtype, op);
  }

  StatusOr<bool> reached(WorkHandle& w, Lane, bool block, bool exposed) override {
    if (w == nullptr) return true;
    if (block) {
      auto t0 = std::chrono::steady_clock::now();
      Status s = w->wait();
      if (exposed)
        exposed_seconds_ +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      HSDP_RETURN_IF_ERROR(s);
      w.reset();
      return true;
    }
    HSDP_ASSIGN_OR_RETURN(bool done, w->test());
    if (done) w.reset();
    return done;
  }
  Status poll() override { return okStatus(); }
};

// The CPU Adam and a double sum of squares, summed over the group through the collectives.
class HostKernels final : public StepKernels {
 public:
  HostKernels(HostAdamStep adam, HostCollectives& collectives)
      : adam_(std::move(adam)), coll_(collectives) {}

  Status adamStep(const AdamConfig& cfg, int64_t t, const AdamShard& shard,
                  float grad_scale) override {
    return adam_(cfg, t, shard, grad_scale);
  }

  Status normBegin() override {
    sumsq_ = 0;
    return okStatus();
  }
  Status normAccumulate(const float* g, size_t n) override {
    for (size_t i = 0; i < n; ++i) sumsq_ += double(g[i]) * g[i];
    return okStatus();
  }
  Status normReduce(Comm* group) override {
    if (group == nullptr) return okStatus();
    float partial = static_cast<float>(sumsq_);
    HSDP_RETURN_IF_ERROR(coll_.allReduceNow(*group, &partial, 1, DType::kFloat32, RedOp::kSum));
    sumsq_ = partial;
    return okStatus();
  }
  StatusOr<double> normResult() override { return sumsq_; }

 private:
  HostAdamStep adam_;
  HostCollectives& coll_;
  double sumsq_ = 0;
};

// Host offload: the shard is already host memory; the worker copies it in and out itself.
class HostHostCopies final : public HostCopies {
 public:
  StatusOr<std::unique_ptr<OffloadSlot>> offloadSlot(
      const std::vector<std::pair<void*, size_t>>&) override {
    return std::make_unique<OffloadSlot>();
  }
  Status startDownload(OffloadSlot&, void*, const void*, size_t) override { return okStatus(); }
  Status finishDownload(OffloadSlot&, void* host, const void* src, size_t bytes) override {
    std::memcpy(host, src, bytes);
    return okStatus();
  }
  Status upload(OffloadSlot&, void* dst, const void* host, size_t bytes) override {
    std::memcpy(dst, host, bytes);
    return okStatus();
  }
  Status awaitUpload(OffloadSlot&) override { return okStatus(); }

  Status startSnapshot(OffloadSlot&, void* host, const void* src, size_t bytes) override {
    std::memcpy(host, src, bytes);
    return okStatus();
  }
  Status finishSnapshot(OffloadSlot&) override { return okStatus(); }
};

}  // namespace

SpaceBundle hostMemorySpace(HostAdamStep adam) {
  SpaceBundle b;
  b.memory = std::make_unique<HostMemory>();
  auto collectives = std::make_unique<HostCollectives>();
  b.kernels = std::make_unique<HostKernels>(std::move(adam), *collectives);
  b.collectives = std::move(collectives);
  b.host_copies = std::make_unique<HostHostCopies>();
  return b;
}

}  // namespace hsdp
