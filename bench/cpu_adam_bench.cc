// cpu_adam_bench: how close the CPU Adam step (offload/cpu_adam.h) comes to memory
// bandwidth, per ISA and thread count.
//
// Every configuration runs once per round, rounds interleave all configurations (rotating which
// goes first), and the table shows medians over rounds, so that drift in machine load hits all
// rows alike. Side by side:
//  - ceiling: a memory-only kernel with exactly Adam's access pattern (read param, grad, m, v;
//    write param, m, v; one add each), on the same buffers, threads and split. Its GB/s is what
//    this machine's memory gives that pattern; "of ceiling" divides by it. The "+bf16" ceiling
//    also writes the 2-byte copy.
//  - cpu adam <isa>: CpuAdam::step, without and with the bf16 copy-out.
//  - hsdp::adamStep: the engine's plain loop (core/optimizer.cc), one thread.
//  - stream triad a = b + s*c (12 B/element by STREAM's convention) for comparison with other
//    machines' published figures.
// Bytes per element: param r/w 8 + grad r 4 + m r/w 8 + v r/w 8 = 28; +2 with the bf16 copy.
//
//   cpu_adam_bench [--elements 100000000] [--rounds 7] [--threads 1,2] [--isa avx512,avx2,scalar]
//                  [--no-reference]
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/adam.h"
#include "core/host_buffer.h"
#include "hsdp/cli.h"
#include "offload/cpu_adam.h"
#include "offload/cpu_adam_kernels.h"
#include "offload/worker_pool.h"

namespace {

using Clock = std::chrono::steady_clock;
using hsdp::bf16;

// The yardstick kernels are plain loops the compiler vectorises; target_clones builds them for
// AVX-512, AVX2 and the baseline and picks at load time, so the ceiling is never held back by
// narrower vectors than the Adam kernel under test uses.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HSDP_BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HSDP_BENCH_CLONES
#endif

// v grows by g^2 (not g) so that it stays >= 0: the Adam rows run on the same arrays, and a
// negative second moment would fill them with NaNs (whose speed is not what we measure).
HSDP_BENCH_CLONES void adamPattern(float* __restrict p, const float* __restrict g,
                                   float* __restrict m, float* __restrict v, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    p[i] = p[i] + gi;
    m[i] = m[i] + gi;
    v[i] = v[i] + gi * gi;
  }
}

HSDP_BENCH_CLONES void adamPatternBf16(float* __restrict p, const float* __restrict g,
                                       float* __restrict m, float* __restrict v,
                                       uint16_t* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float pi = p[i] + gi;
    p[i] = pi;
    m[i] = m[i] + gi;
    v[i] = v[i] + gi * gi;
    uint32_t u;
    std::memcpy(&u, &pi, 4);
    out[i] = static_cast<uint16_t>(u >> 16);  // truncation: trivial arithmetic, same traffic
  }
}

HSDP_BENCH_CLONES void triad(float* __restrict a, const float* __restrict b,
                             const float* __restrict c, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
}

double threadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Involuntary context switches of the whole process (all threads) so far.
long involuntarySwitches() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_nivcsw;
}

using hsdp::bench::loadAverage;
using hsdp::bench::median;

// The process's anonymous memory on transparent huge pages (smaps_rollup), e.g. "1843200 kB".
std::string anonHugePages() {
  std::ifstream f("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("AnonHugePages:", 0) == 0) {
      const size_t at = line.find_first_not_of(' ', 14);
      return at == std::string::npos ? line : line.substr(at);
    }
  return "unknown";
}

std::string cpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

struct Row {
  std::string name;
  int threads = 1;
  double bytes_per_elem = 28;
  int ceiling = -1;  // index of the row this one is compared with (-1: none)
  std::function<void()> run;
  std::vector<double> seconds;      // wall clock, per round
  std::vector<double> cpu_seconds;  // the calling thread's CPU time, per round
  int undisturbed = 0;              // rounds without an involuntary context switch
};

int fail(const hsdp::Status& s) {
  std::fprintf(stderr, "cpu_adam_bench: error: %s\n", s.toString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = 100'000'000;
  int rounds = 7;
  std::vector<int> thread_counts = {1, 2};
  std::vector<std::string> isa_names;
  bool no_reference = false;
  CLI::App app{"CPU Adam step bandwidth against a memory-only ceiling"};
  hsdp::cli::addInt(app, "--elements", n, "parameters in the shard", size_t{1});
  hsdp::cli::addInt(app, "--rounds", rounds, "rounds (medians over these)", 1, 1000);
  hsdp::cli::addIntList(app, "--threads", thread_counts, "thread counts", 1, 4096);
  hsdp::cli::addList(app, "--isa", isa_names, "ISAs (default: all this CPU supports)");
  app.add_flag("--no-reference", no_reference, "skip hsdp::adamStep (the slow scalar loop)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, "cpu_adam_bench");
  }
  // Four float arrays and one bf16 array of n elements: refused with the limit named before
  // allocating (n near 2^64 wrapped n * 4 and segfaulted).
  if (auto b = hsdp::checkedAllocation(n, 4 * sizeof(float) + sizeof(uint16_t),
                                       hsdp::strCat("--elements ", n));
      !b.ok())
    return fail(b.status());

  auto parsed = hsdp::bench::parseIsas(isa_names);
  if (!parsed.ok()) return fail(parsed.status());
  const std::vector<hsdp::CpuIsa> isas = *parsed;

  // Optimizer-shard memory as offload allocates it: NUMA-bound, pre-faulted, huge pages.
  auto topo = hsdp::NumaTopology::load();
  if (!topo.ok()) return fail(topo.status());
  const auto t_alloc = Clock::now();
  std::vector<hsdp::HostBuffer> bufs;
  for (size_t bytes : {n * sizeof(float), n * sizeof(float), n * sizeof(float), n * sizeof(float),
                       n * sizeof(bf16)}) {
    auto b = hsdp::HostBuffer::allocateNuma(bytes, *topo);
    if (!b.ok()) return fail(b.status());
    bufs.push_back(std::move(*b));
  }
  const double alloc_s = std::chrono::duration<double>(Clock::now() - t_alloc).count();
  float* p = bufs[0].as<float>();
  float* g = bufs[1].as<float>();
  float* m = bufs[2].as<float>();
  float* v = bufs[3].as<float>();
  bf16* out = bufs[4].as<bf16>();
  for (size_t i = 0; i < n; ++i) {  // cheap deterministic values of training-like magnitudes
    const float x = static_cast<float>((i * 2654435761u) % 2001u) / 1000.0f - 1.0f;
    p[i] = x;
    g[i] = 1e-2f * x;
    m[i] = 1e-3f * x;
    v[i] = 1e-6f * x * x;
  }

  std::printf(
      "cpu_adam_bench: %zu elements (%.2f GB of fp32 state, %.2f GB bf16 copy), %d "
      "rounds, medians\n",
      n, 16.0 * n / 1e9, 2.0 * n / 1e9, rounds);
  std::printf("CPU: %s; ISAs supported: ", cpuModel().c_str());
  for (hsdp::CpuIsa isa : hsdp::supportedCpuIsas()) std::printf("%s ", hsdp::cpuIsaName(isa));
  std::string nodes;
  for (int node : bufs[0].numaNodes()) nodes += std::to_string(node) + " ";
  std::printf(
      "\nbuffers: HostBuffer::allocateNuma, NUMA nodes %s(of %d), huge pages advised "
      "(process AnonHugePages %s); allocate + pre-fault %.2f GB took %.2f s\n",
      nodes.empty() ? "unbound " : nodes.c_str(), topo->numNodes(), anonHugePages().c_str(),
      18.0 * n / 1e9, alloc_s);
  std::printf("load average before: %s\n\n", loadAverage().c_str());

  hsdp::AdamConfig cfg;
  cfg.kind = hsdp::OptimizerKind::kAdamW;
  cfg.weight_decay = 0.01f;
  int64_t t = 0;

  std::vector<Row> rows;
  int ceiling_1 = -1;  // the one-thread ceiling, for adamStep (when 1 is among --threads)
  std::vector<std::unique_ptr<hsdp::offload_detail::WorkerPool>> pools;
  std::vector<std::unique_ptr<hsdp::CpuAdam>> adams;
  for (int threads : thread_counts) {
    auto pool = hsdp::offload_detail::WorkerPool::create(threads);
    if (!pool.ok()) return fail(pool.status());
    hsdp::offload_detail::WorkerPool* wp = pool->get();
    pools.push_back(std::move(*pool));
    // The ceilings split the range exactly as CpuAdam does.
    auto split = [=](auto&& body) {
      const int parts = threads;
      std::vector<size_t> b(parts + 1);
      hsdp::cpu_adam_detail::chunkBoundaries(p, n, parts, b.data());
      wp->run(parts, [&](int k) { body(b[k], b[k + 1] - b[k]); });
    };
    const int ceil = static_cast<int>(rows.size()), ceil16 = ceil + 1;
    if (threads == 1) ceiling_1 = ceil;
    rows.push_back(
        {"ceiling (adam pattern)", threads, 28, -1,
         [=] { split([&](size_t b, size_t k) { adamPattern(p + b, g + b, m + b, v + b, k); }); }});
    rows.push_back({"ceiling (adam pattern) +bf16", threads, 30, -1, [=] {
                      split([&](size_t b, size_t k) {
                        adamPatternBf16(p + b, g + b, m + b, v + b,
                                        reinterpret_cast<uint16_t*>(out) + b, k);
                      });
                    }});
    for (hsdp::CpuIsa isa : isas) {
      auto adam = hsdp::CpuAdam::create({.isa = isa, .threads = threads});
      if (!adam.ok()) return fail(adam.status());
      hsdp::CpuAdam* a = adam->get();
      adams.push_back(std::move(*adam));
      const std::string name = std::string("cpu adam ") + hsdp::cpuIsaName(isa);
      rows.push_back({name, threads, 28, ceil, [=, &t] {
                        hsdp::Status s = a->step(cfg, ++t, {p, g, m, v, n, nullptr});
                        if (!s.ok()) std::abort();
                      }});
      rows.push_back({name + " +bf16", threads, 30, ceil16, [=, &t] {
                        hsdp::Status s = a->step(cfg, ++t, {p, g, m, v, n, out});
                        if (!s.ok()) std::abort();
                      }});
    }
    // The best ISA once more with plain stores for the bf16 copy: what streaming them saves.
    {
      auto adam =
          hsdp::CpuAdam::create({.isa = isas.front(), .threads = threads, .stream_bf16 = false});
      if (!adam.ok()) return fail(adam.status());
      hsdp::CpuAdam* a = adam->get();
      adams.push_back(std::move(*adam));
      rows.push_back(
          {std::string("cpu adam ") + hsdp::cpuIsaName(isas.front()) + " +bf16 plain stores",
           threads, 30, ceil16, [=, &t] {
             hsdp::Status s = a->step(cfg, ++t, {p, g, m, v, n, out});
             if (!s.ok()) std::abort();
           }});
    }
    rows.push_back({"stream triad", threads, 12, -1,
                    [=] { split([&](size_t b, size_t k) { triad(p + b, g + b, m + b, k); }); }});
  }
  if (!no_reference)
    rows.push_back({"hsdp::adamStep (core/optimizer.cc)", 1, 28, ceiling_1,
                    [=, &t] { hsdp::adamStep(cfg, ++t, p, g, m, v, n); }});

  for (Row& r : rows) r.run();  // warm-up: first-use costs (thread wake-up, code paths)
  for (int round = 0; round < rounds; ++round) {
    for (size_t j = 0; j < rows.size(); ++j) {
      Row& r = rows[(j + static_cast<size_t>(round)) % rows.size()];
      const long csw0 = involuntarySwitches();
      const double cpu0 = threadCpuSeconds();
      const auto t0 = Clock::now();
      r.run();
      r.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      r.cpu_seconds.push_back(threadCpuSeconds() - cpu0);
      if (involuntarySwitches() == csw0) ++r.undisturbed;
    }
  }

  // Columns: wall-clock median and min; GB/s and Gparam/s from the median; "of ceiling" = this
  // row's GB/s over its ceiling's, from medians and from minima. On a machine shared with other
  // work, a run preempted by another process measures that process too; "clean" counts the runs
  // without an involuntary context switch, and for one-thread rows "cpu" repeats the figures
  // from the calling thread's CPU time (the run without the time it was descheduled).
  auto gbps = [&](const Row& r, double sec) { return r.bytes_per_elem * n / sec / 1e9; };
  auto minOf = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  std::printf("%-38s %3s %6s %9s %8s %6s %8s %7s %7s %6s %8s %6s %7s\n", "kernel", "thr", "B/elem",
              "median ms", "min ms", "GB/s", "Gparam/s", "of ceil", "(min)", "clean", "cpu ms",
              "GB/s", "of ceil");
  for (const Row& r : rows) {
    const double med = median(r.seconds), mn = minOf(r.seconds), cpu = median(r.cpu_seconds);
    std::printf("%-38s %3d %6.0f %9.2f %8.2f %6.1f %8.3f", r.name.c_str(), r.threads,
                r.bytes_per_elem, med * 1e3, mn * 1e3, gbps(r, med), n / med / 1e9);
    const Row* c = r.ceiling >= 0 ? &rows[r.ceiling] : nullptr;
    if (c)
      std::printf(" %7.2f %7.2f", median(c->seconds) / med, minOf(c->seconds) / mn);
    else
      std::printf(" %7s %7s", "", "");
    std::printf(" %3d/%-2d", r.undisturbed, rounds);
    if (r.threads == 1) {
      std::printf(" %8.2f %6.1f", cpu * 1e3, gbps(r, cpu));
      if (c && c->threads == 1) std::printf(" %7.2f", median(c->cpu_seconds) / cpu);
    }
    std::printf("\n");
  }
  // What the bf16 copy-out costs: time with / time without, against the byte ratio 30/28.
  std::printf("\nbf16 copy-out cost, time with / without (30/28 = %.3f is 'its 2 bytes'):\n",
              30.0 / 28.0);
  for (const Row& with : rows) {
    const size_t at = with.name.find(" +bf16");
    if (with.name.rfind("cpu adam", 0) != 0 || at == std::string::npos) continue;
    for (const Row& without : rows)
      if (without.threads == with.threads && without.name == with.name.substr(0, at)) {
        std::printf("  %-38s %d thread(s): median %.3f, min %.3f", with.name.c_str(), with.threads,
                    median(with.seconds) / median(without.seconds),
                    minOf(with.seconds) / minOf(without.seconds));
        if (with.threads == 1)
          std::printf(", cpu %.3f", median(with.cpu_seconds) / median(without.cpu_seconds));
        std::printf("\n");
      }
  }
  // The state must still be numbers: timings of NaN arithmetic would be another benchmark.
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    bad += !std::isfinite(p[i]) || !std::isfinite(m[i]) || !std::isfinite(v[i]) || v[i] < 0;
  std::printf("\nstate after all rounds: %zu of %zu elements non-finite or v < 0\n", bad, n);
  std::printf("load average after: %s\n", loadAverage().c_str());
  return 0;
}
