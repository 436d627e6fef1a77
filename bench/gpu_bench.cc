// GPU memory-path bandwidth: the fused Adam step against a device-to-device copy measured in the
// same run (the step is memory-bound, so the copy is its ceiling), and pinned host<->device
// copies. Prints a table; scripts/device-check shows it last.
//
//   build/bench/gpu_bench [--elements N] [--copy-mib M] [--iters K]
//
// GB/s count bytes that cross the memory interface, 1 GB = 1e9 bytes: the copy reads and writes
// each byte (2 x size), the Adam step reads param, grad and both moments and writes param, both
// moments and the bf16 copy (30 bytes per element; 28 without the copy). Each figure is the
// median of --iters timed runs (CUDA events on one stream) after two warm-up runs.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "collectives/nccl/cuda_check.h"
#include "collectives/nccl/cuda_resources.h"
#include "cuda/kernels.h"
#include "hsdp/cli.h"

namespace hsdp {
namespace {

// Median milliseconds of `iters` runs of `body` on `stream`.
StatusOr<double> timeMs(cudaStream_t stream, int iters, const std::function<Status()>& body) {
  HSDP_ASSIGN_OR_RETURN(gpu::Event start, gpu::Event::create(/*timing=*/true));
  HSDP_ASSIGN_OR_RETURN(gpu::Event stop, gpu::Event::create(/*timing=*/true));
  for (int i = 0; i < 2; ++i) HSDP_RETURN_IF_ERROR(body());
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    HSDP_CUDA_CHECK(cudaEventRecord(start.get(), stream));
    HSDP_RETURN_IF_ERROR(body());
    HSDP_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
    HSDP_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float t = 0;
    HSDP_CUDA_CHECK(cudaEventElapsedTime(&t, start.get(), stop.get()));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double gbps(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

Status run(size_t n, size_t copy_bytes, int iters) {
  std::string why;
  if (gpu::deviceCount(&why) == 0)
    return failedPrecondition("gpu_bench: no CUDA device visible (", why, ")");
  int device = 0;
  HSDP_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  HSDP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  HSDP_ASSIGN_OR_RETURN(gpu::Stream stream, gpu::Stream::create("bench"));
  cudaStream_t s = stream.get();

  // Device-to-device copy.
  HSDP_ASSIGN_OR_RETURN(gpu::DeviceBuffer a, gpu::DeviceBuffer::allocate(copy_bytes));
  HSDP_ASSIGN_OR_RETURN(gpu::DeviceBuffer b, gpu::DeviceBuffer::allocate(copy_bytes));
  HSDP_CUDA_CHECK(cudaMemsetAsync(a.data(), 0, copy_bytes, s));
  HSDP_ASSIGN_OR_RETURN(double d2d_ms, timeMs(s, iters, [&]() -> Status {
                          HSDP_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), copy_bytes,
                                                          cudaMemcpyDeviceToDevice, s));
                          return okStatus();
                        }));
  const double d2d = gbps(2.0 * copy_bytes, d2d_ms);

  // Pinned host <-> device.
  HSDP_ASSIGN_OR_RETURN(gpu::PinnedBuffer h, gpu::PinnedBuffer::allocate(copy_bytes));
  std::fill_n(h.as<char>(), copy_bytes, 1);
  HSDP_ASSIGN_OR_RETURN(
      double h2d_ms, timeMs(s, iters, [&]() -> Status {
        HSDP_CUDA_CHECK(cudaMemcpyAsync(a.data(), h.data(), copy_bytes, cudaMemcpyHostToDevice, s));
        return okStatus();
      }));
  HSDP_ASSIGN_OR_RETURN(
      double d2h_ms, timeMs(s, iters, [&]() -> Status {
        HSDP_CUDA_CHECK(cudaMemcpyAsync(h.data(), a.data(), copy_bytes, cudaMemcpyDeviceToHost, s));
        return okStatus();
      }));
  a = gpu::DeviceBuffer();
  b = gpu::DeviceBuffer();

  // Adam (AdamW, bf16 copy-out, and without the copy).
  HSDP_ASSIGN_OR_RETURN(gpu::DeviceBuffer p, gpu::DeviceBuffer::allocate(n * sizeof(float)));
  HSDP_ASSIGN_OR_RETURN(gpu::DeviceBuffer g, gpu::DeviceBuffer::allocate(n * sizeof(float)));
  HSDP_ASSIGN_OR_RETURN(gpu::DeviceBuffer m, gpu::DeviceBuffer::allocate(n * sizeof(float)));
  HSDP_ASSIGN_OR_RETURN(gpu::DeviceBuffer v, gpu::DeviceBuffer::allocate(n * sizeof(float)));
  HSDP_ASSIGN_OR_RETURN(gpu::DeviceBuffer pb, gpu::DeviceBuffer::allocate(n * sizeof(bf16)));
  for (gpu::DeviceBuffer* x : {&p, &g, &m, &v})
    HSDP_CUDA_CHECK(cudaMemsetAsync(x->data(), 0, n * sizeof(float), s));
  AdamConfig cfg;
  cfg.weight_decay = 0.01f;
  int64_t t = 0;
  AdamShard shard{p.as<float>(), g.as<float>(), m.as<float>(), v.as<float>(), n, pb.as<bf16>()};
  HSDP_ASSIGN_OR_RETURN(double adam_ms, timeMs(s, iters, [&]() -> Status {
                          return gpu::adamStep(cfg, ++t, shard, s);
                        }));
  shard.param_bf16 = nullptr;
  HSDP_ASSIGN_OR_RETURN(double adam28_ms, timeMs(s, iters, [&]() -> Status {
                          return gpu::adamStep(cfg, ++t, shard, s);
                        }));
  const double adam = gbps(30.0 * n, adam_ms), adam28 = gbps(28.0 * n, adam28_ms);

  std::printf(
      "# gpu_bench on %s (device %d, %d SMs), Adam over %zu elements, copies of %zu MiB, "
      "median of %d\n",
      prop.name, device, prop.multiProcessorCount, n, copy_bytes >> 20, iters);
  std::printf("%-34s %10s %10s %10s\n", "what", "ms", "GB/s", "vs d2d");
  std::printf("%-34s %10.3f %10.1f %9.1f%%\n", "d2d cudaMemcpy (read+write)", d2d_ms, d2d, 100.0);
  std::printf("%-34s %10.3f %10.1f %9.1f%%\n", "GPU AdamW + bf16 copy (30 B/elem)", adam_ms, adam,
              100.0 * adam / d2d);
  std::printf("%-34s %10.3f %10.1f %9.1f%%\n", "GPU AdamW (28 B/elem)", adam28_ms, adam28,
              100.0 * adam28 / d2d);
  std::printf("%-34s %10.3f %10.1f %10s\n", "pinned H2D", h2d_ms, gbps(copy_bytes, h2d_ms), "-");
  std::printf("%-34s %10.3f %10.1f %10s\n", "pinned D2H", d2h_ms, gbps(copy_bytes, d2h_ms), "-");
  std::printf("gpu_bench: adam_vs_d2d=%.1f%% (target >= 85%%): %s\n", 100.0 * adam / d2d,
              adam >= 0.85 * d2d ? "PASS" : "BELOW TARGET");
  return okStatus();
}

}  // namespace
}  // namespace hsdp

int main(int argc, char** argv) {
  CLI::App app{"GPU Adam and copy bandwidth", "gpu_bench"};
  size_t elements = size_t{1} << 26;
  size_t copy_mib = 1024;
  int iters = 20;
  // At most what one H200 holds (141 GB): 2^33 elements of Adam state, copies of 2^16 MiB.
  hsdp::cli::addInt(app, "--elements", elements,
                    "Adam shard elements (default 64 Mi: 1.9 GB moved)", size_t{1},
                    size_t{1} << 33);
  hsdp::cli::addInt(app, "--copy-mib", copy_mib, "bytes per copy, MiB (default 1024)", size_t{1},
                    size_t{1} << 16);
  hsdp::cli::addInt(app, "--iters", iters, "timed runs per figure (median)", 1, 100000);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, "gpu_bench", -1, true);
  }
  hsdp::Status s = hsdp::run(elements, copy_mib << 20, iters);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.toString().c_str());
    return 1;
  }
  return 0;
}
