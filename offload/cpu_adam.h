// CPU Adam/AdamW for optimizer shards that live in host memory (optimizer offload).
//
// The step is memory-bound: per element it reads the fp32 parameter, gradient and both moments
// and writes the parameter and both moments, 28 bytes, against ~15 floating-point operations.
// So it is one fused pass per element (never one pass per term), optionally also applying a
// gradient scale (loss-scale unscaling, the gradient-clipping coefficient) and writing the bf16
// copy of the updated parameter that the next all-gather sends (30 bytes per element), and it
// runs on several threads of a persistent pool.
//
// Math: exactly hsdp::adamStep (core/adam.h, the PyTorch formula) applied to the
// gradient grad * grad_scale. Every ISA path and every thread count give bitwise identical
// results, equal to adamStep's when grad_scale is 1 (docs/offload.md says why this holds).
//
// ISA: AVX-512 (AVX512F), AVX2, or scalar (the baseline compiler flags), picked at run time from
// what the CPU supports, best first; HSDP_CPU_ADAM_ISA=auto|avx512|avx2|scalar overrides.
//
//   HSDP_ASSIGN_OR_RETURN(auto adam, CpuAdam::create({.threads = 4}));
//   HSDP_RETURN_IF_ERROR(adam->step(cfg, t, {param, grad, m, v, n, param_bf16}, clip_coef));
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "core/adam.h"
#include "hsdp/cpu_isa.h"
#include "hsdp/dtype.h"
#include "hsdp/status.h"

namespace hsdp {

// CpuIsa, cpuIsaName, parseCpuIsa, cpuIsaSupported, supportedCpuIsas: hsdp/cpu_isa.h.
// HSDP_CPU_ADAM_ISA: unset/empty/"auto" gives the best supported ISA; a named ISA gives that ISA
// if supported, else FailedPrecondition naming it and what this CPU supports; anything else is
// InvalidArgument naming the value.
StatusOr<CpuIsa> cpuAdamIsaFromEnv();
// HSDP_CPU_ADAM_THREADS, else 1 (the one default of CpuAdamOptions::threads and
// EngineConfig::offload.adam_threads); a value outside [1, 4096] is an InvalidArgument naming it.
StatusOr<int> cpuAdamThreadsFromEnv();

// The shard the step works on: hsdp::AdamShard (core/adam.h), host arrays, any alignment
// (page-aligned buffers are fastest; see HostBuffer::allocateNuma).

struct CpuAdamOptions {
  // nullopt: cpuAdamIsaFromEnv(). A value must be supported (else FailedPrecondition).
  std::optional<CpuIsa> isa;
  // Participating threads, the caller included. 0: cpuAdamThreadsFromEnv() (HSDP_CPU_ADAM_THREADS,
  // else 1). Under MPI with several ranks per node, set it to the cores each rank owns: the pool
  // does not know about other ranks.
  int threads = 0;
  // Write the bf16 copy with streaming (non-temporal) stores when the step's bytes exceed the
  // last-level cache: a plain store first reads the line it writes (read-for-ownership), so the
  // 2-byte copy would move 4 bytes, and a copy that large leaves the cache before the
  // all-gather reads it anyway. false: plain stores always (for comparison, or for callers
  // that read the copy right away).
  bool stream_bf16 = true;
};

// A CPU Adam/AdamW stepper: the chosen kernel and a pool of threads - 1 worker threads, started
// once by create() and joined by the destructor. Thread-safe: concurrent step() calls (e.g. an
// offload pipeline thread and the main thread) are serialised on the pool.
class CpuAdam {
 public:
  static StatusOr<std::unique_ptr<CpuAdam>> create(const CpuAdamOptions& options = {});
  ~CpuAdam();
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  CpuIsa isa() const;
  int threads() const;

  // One step (t counts from 1, as in adamStep) over the shard, with the gradient multiplied by
  // grad_scale (finite, >= 0) first. The config is per call so that schedules may change lr.
  // Errors (InvalidArgument, naming the value): an invalid cfg (hsdp::validate), t < 1, a
  // negative or non-finite grad_scale, a null array with n > 0. On error nothing is written.
  //
  // Threads: ranges of at least kMinElementsPerThread elements, split on 64-byte boundaries;
  // the workers compute in the caller's floating-point environment (rounding mode, FTZ/DAZ), so
  // the result never depends on which thread ran which range.
  Status step(const AdamConfig& cfg, int64_t t, const AdamShard& shard, float grad_scale = 1.0f);

  // Below this many elements per thread, fewer threads are used: waking a sleeping worker costs
  // ~10-50 us, the time the step takes for ~64 Ki elements at memory bandwidth.
  static constexpr size_t kMinElementsPerThread = size_t{1} << 16;

 private:
  struct Impl;
  explicit CpuAdam(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hsdp
