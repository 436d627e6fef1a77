// CPU Adam: ISA selection, argument checks, the per-call constants and the split over threads.
// The kernels are in cpu_adam_{scalar,avx2,avx512}.cc.
#include "offload/cpu_adam.h"

#include <sched.h>

#include <algorithm>
#include <cfenv>
#include <fstream>
#include <utility>

#include "hsdp/env.h"
#include "hsdp/log.h"
#include "offload/cpu_adam_internal.h"
#include "offload/cpu_adam_kernels.h"
#include "offload/worker_pool.h"

namespace hsdp {
namespace cpu_adam_detail {

void chunkBoundaries(const float* param, size_t n, int parts, size_t* out) {
  out[0] = 0;
  out[parts] = n;
  // Split whole granules after the first 64-byte-aligned element; part 0 also takes the
  // unaligned head and the last part the leftover granule fraction.
  const size_t first = headElements(param, n, 64);
  const size_t granules = (n - first) / kChunkGranule;
  for (int k = 1; k < parts; ++k)
    out[k] = first + granules * static_cast<size_t>(k) / static_cast<size_t>(parts) * kChunkGranule;
}

size_t bf16StreamThresholdBytes() {
  // The last-level cache that CPU 0 sees, from sysfs ("32768K"), read once; 32 MiB when
  // unknown. Not sysconf(_SC_LEVEL3_CACHE_SIZE): under virtualisation glibc derives it from
  // CPUID and can report the whole host's L3 (320 MiB on a VM whose L3 is 32 MiB).
  static const size_t bytes = [] {
    size_t best = 0;
    for (int index = 0; index < 8; ++index) {
      std::ifstream f(strCat("/sys/devices/system/cpu/cpu0/cache/index", index, "/size"));
      size_t value = 0;
      char unit = 0;
      if (!(f >> value)) continue;
      f >> unit;
      if (unit == 'K')
        value <<= 10;
      else if (unit == 'M')
        value <<= 20;
      best = std::max(best, value);
    }
    return best > 0 ? best : size_t{32} << 20;
  }();
  return bytes;
}

StatusOr<CpuIsa> resolveCpuIsa(std::string_view value, const std::vector<CpuIsa>& supported) {
  if (value.empty() || value == "auto") return supported.front();
  StatusOr<CpuIsa> isa = parseCpuIsa(value);
  if (!isa.ok())
    return invalidArgument("HSDP_CPU_ADAM_ISA='", value,
                           "' is not one of auto, avx512, avx2, scalar");
  for (CpuIsa s : supported)
    if (s == *isa) return *isa;
  std::string names;
  for (CpuIsa s : supported) names += strCat(names.empty() ? "" : ", ", cpuIsaName(s));
  return failedPrecondition("HSDP_CPU_ADAM_ISA=", value, " but this ",
#if defined(HSDP_CPU_ADAM_X86)
                            "CPU does not support it",
#else
                            "build has no x86 kernels",
#endif
                            " (supported: ", names, ")");
}

}  // namespace cpu_adam_detail

using cpu_adam_detail::AdamSpan;
using cpu_adam_detail::KernelFn;

// The kernels write bf16 through uint16_t*: the same two bytes.
static_assert(sizeof(bf16) == sizeof(uint16_t));

namespace {
const env::StringParam kCpuAdamIsa{
    "HSDP_CPU_ADAM_ISA", env::StringParam::Kind::kEnum, "auto",
    "Kernel of the CPU (offload) Adam step: auto (best this CPU supports), avx512, avx2 or "
    "scalar. A path this CPU or build cannot run is an error, not a fallback."};
// One default for every reader (CpuAdam::create with threads 0, and the engine's
// EngineConfig::offload.adam_threads): one thread, because under MPI the ranks of a node share its
// cores and the pool does not know about the other ranks.
const env::IntParam kCpuAdamThreads{
    "HSDP_CPU_ADAM_THREADS", 1, 1, 4096,
    "Threads of the CPU Adam step (the caller included) when the program does not set them "
    "(CpuAdamOptions::threads, EngineConfig::offload.adam_threads). Several ranks share a node's "
    "cores, so set it to the cores each rank owns."};
}  // namespace

StatusOr<CpuIsa> cpuAdamIsaFromEnv() {
  return cpu_adam_detail::resolveCpuIsa(kCpuAdamIsa.get(), supportedCpuIsas());
}

StatusOr<int> cpuAdamThreadsFromEnv() {
  HSDP_ASSIGN_OR_RETURN(int64_t t, kCpuAdamThreads.value());
  return static_cast<int>(t);
}

namespace {

KernelFn kernelFor(CpuIsa isa) {
  switch (isa) {
#if defined(HSDP_CPU_ADAM_X86)
    case CpuIsa::kAvx512:
      return &cpu_adam_detail::adamKernelAvx512;
    case CpuIsa::kAvx2:
      return &cpu_adam_detail::adamKernelAvx2;
#endif
    default:
      return &cpu_adam_detail::adamKernelScalar;
  }
}

}  // namespace

struct CpuAdam::Impl {
  CpuIsa isa = CpuIsa::kScalar;
  KernelFn kernel = nullptr;
  bool stream_bf16 = true;
  std::unique_ptr<offload_detail::WorkerPool> pool;
};

CpuAdam::CpuAdam(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuAdam::~CpuAdam() = default;

StatusOr<std::unique_ptr<CpuAdam>> CpuAdam::create(const CpuAdamOptions& options) {
  auto impl = std::make_unique<Impl>();
  if (options.isa) {
    if (!cpuIsaSupported(*options.isa))
      return failedPrecondition("CPU Adam ISA ", cpuIsaName(*options.isa),
                                " is not supported by this CPU or build");
    impl->isa = *options.isa;
  } else {
    HSDP_ASSIGN_OR_RETURN(impl->isa, cpuAdamIsaFromEnv());
  }
  impl->kernel = kernelFor(impl->isa);
  impl->stream_bf16 = options.stream_bf16;
  if (options.threads < 0)
    return invalidArgument("CPU Adam threads=", options.threads, " must be >= 0 (0: default)");
  int threads = options.threads;
  if (threads == 0) {
    HSDP_ASSIGN_OR_RETURN(threads, cpuAdamThreadsFromEnv());
  }
  HSDP_ASSIGN_OR_RETURN(impl->pool, offload_detail::WorkerPool::create(threads));
  HSDP_INFO(kOffload, "CPU Adam: ", cpuIsaName(impl->isa), " kernel, ", threads, " thread",
            threads == 1 ? "" : "s");
  return std::unique_ptr<CpuAdam>(new CpuAdam(std::move(impl)));
}

CpuIsa CpuAdam::isa() const { return impl_->isa; }
int CpuAdam::threads() const { return impl_->pool->threads(); }

Status CpuAdam::step(const AdamConfig& cfg, int64_t t, const AdamShard& shard, float grad_scale) {
  HSDP_RETURN_IF_ERROR(checkAdamStep(cfg, t, shard, grad_scale, "Adam"));
  if (shard.n == 0) return okStatus();

  // The constants exactly as hsdp::adamStep takes them, so that the kernels reproduce it bit
  // for bit.
  AdamCoeffs c = adamCoefficients(cfg, t, grad_scale);
  c.stream_bf16 = impl_->stream_bf16 && shard.param_bf16 != nullptr &&
                  shard.n * 30 > cpu_adam_detail::bf16StreamThresholdBytes();

  const AdamSpan all{shard.param,
                     shard.grad,
                     shard.exp_avg,
                     shard.exp_avg_sq,
                     reinterpret_cast<uint16_t*>(shard.param_bf16),
                     shard.n};
  const size_t by_size = shard.n / kMinElementsPerThread;
  const int parts = static_cast<int>(
      std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(threads()), by_size)));
  if (parts == 1) {
    impl_->kernel(c, all);
    return okStatus();
  }
  std::vector<size_t> bounds(parts + 1);
  cpu_adam_detail::chunkBoundaries(shard.param, shard.n, parts, bounds.data());
  std::fenv_t fenv;
  std::fegetenv(&fenv);
  const KernelFn kernel = impl_->kernel;
  impl_->pool->run(parts, [&](int part) {
    if (part != 0) std::fesetenv(&fenv);
    const size_t b = bounds[part], e = bounds[part + 1];
    if (b == e) return;
    AdamSpan s = all;
    s.param += b;
    s.grad += b;
    s.exp_avg += b;
    s.exp_avg_sq += b;
    if (s.param_bf16 != nullptr) s.param_bf16 += b;
    s.n = e - b;
    kernel(c, s);
  });
  return okStatus();
}

}  // namespace hsdp
