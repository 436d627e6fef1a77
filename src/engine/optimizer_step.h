// The one owner of the optimizer step: the SIMD CPU Adam, with CPU offload its worker queue and
// the NUMA topology the host state is placed by, the global gradient norm and its clipping
// coefficient, and how a shard is stepped: inline through the space's step kernels
// (StepKernels, core/memory_space.h: its Adam kernel, on the host this CPU Adam, and its norm)
// or, with offload, as a job on the worker (host memory: the shards in place; a device: through
// the space's host copies, HostCopies, which checkpoint snapshots use too). It owns both. The
// same object with and without offload.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/host_buffer.h"
#include "core/memory_space.h"
#include "hsdp/config.h"
#include "hsdp/flat_layout.h"
#include "hsdp/quantize.h"
#include "offload/cpu_adam.h"
#include "offload/step_queue.h"

namespace hsdp::engine {

// A contiguous run of a unit's shard whose parameters all take AdamW's weight decay, or all do
// not (ParamSpec::weight_decay); the shard's padding joins its neighbour. Offsets are in
// elements from the start of the shard.
struct DecaySpan {
  size_t begin = 0;
  size_t n = 0;
  bool decay = true;
};

// The runs of shard `k` of `layout` whose parameters share a weight-decay setting (padding joins
// the run before it), merged, in shard-relative offsets. One span when every parameter decays
// alike.
std::vector<DecaySpan> decaySpans(const FlatLayout& layout, int k);

// One unit's shard as the optimizer steps it: n elements per array, in the memory the stepper
// reads (host for the CPU Adam), span by span.
struct ShardStep {
  float* master = nullptr;
  float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  size_t n = 0;
  std::span<const DecaySpan> spans;
  bf16* out16 = nullptr;  // bf16 parameters: the master's rounding, written by the step
  // The int8/int4 parameter wire: the new master encoded into `encoded` after the step.
  WireFormat wire;
  void* encoded = nullptr;
  // Offload on a device: the shards' trip through the host arrays above and back.
  HostCopies::OffloadSlot* slot = nullptr;
  float* space_master = nullptr;     // the master in device memory
  const void* space_grad = nullptr;  // the gradient shard in device memory
  bf16* space16 = nullptr;           // shard16 in device memory (bf16 parameters)
};

class OptimizerStep {
 public:
  // The CPU Adam wherever host shards are stepped (Device::kHost, or CPU offload); with offload
  // the worker queue and the NUMA topology.
  static StatusOr<std::unique_ptr<OptimizerStep>> create(const EngineConfig& cfg);
  // The space's step kernels (the inline steps and the norm) and its host copies (offload's
  // trip, checkpoint snapshots); set once, after create, from the space's bundle.
  void setSpace(std::unique_ptr<StepKernels> kernels, std::unique_ptr<HostCopies> copies) {
    kernels_ = std::move(kernels);
    copies_ = std::move(copies);
  }
  HostCopies& hostCopies() const { return *copies_; }

  CpuAdam* cpuAdam() const { return cpu_adam_.get(); }
  bool offloaded() const { return queue_ != nullptr; }
  const NumaTopology& numa() const { return numa_; }

  // The global L2 norm of the gradient shards `grads` (pointer, count), summed over `group`
  // (null: this rank's alone). The value is read back by readNorm() (the host needs it at
  // once only to clip; a device reads it when asked).
  [[nodiscard]] Status beginNorm(std::span<const std::pair<const float*, size_t>> grads,
                                 Comm* group);
  [[nodiscard]] Status readNorm() const;
  float lastNorm() const { return last_norm_; }
  // As torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6) when that is < 1, else 1
  // (after readNorm()); 1 without clipping.
  float clipCoefficient(float clip_norm) const;

  // Steps `s` now, through the step kernels (the training thread; device kernels enqueue).
  [[nodiscard]] Status stepNow(const AdamConfig& adam, int64_t t, const ShardStep& s, float scale);
  // Offload: queues the step of `s` on the worker; returns its ticket. The arrays must stay put
  // until wait(ticket).
  StatusOr<int64_t> launch(const AdamConfig& adam, int64_t t, const ShardStep& s, float scale);
  [[nodiscard]] Status wait(int64_t ticket);
  [[nodiscard]] Status waitAll();
  // Seconds the worker stepped and the training thread waited for it, since the last call.
  void takeSeconds(double* total, double* exposed);

 private:
  std::unique_ptr<CpuAdam> cpu_adam_;
  NumaTopology numa_;
  std::unique_ptr<StepKernels> kernels_;
  std::unique_ptr<HostCopies> copies_;
  mutable float last_norm_ = 0;
  mutable bool norm_pending_ = false;
  std::unique_ptr<StepQueue> queue_;  // last: its worker joins before the rest goes
};

}  // namespace hsdp::engine
