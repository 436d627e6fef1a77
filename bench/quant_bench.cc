// quant_bench: how close the wire quantization kernels (hsdp/quantize.h) come to memory
// bandwidth, per ISA, on one thread (the schedules call them on the communicating thread).
//
// The methodology of cpu_adam_bench: every row runs once per round, rounds interleave all rows
// (rotating which goes first), the table shows medians over rounds, so drift in the machine's load
// hits all rows alike; "best" is the fastest round (the one least disturbed by other tenants of
// a shared machine), with its own ratio. Each kernel sits beside a ceiling: a memory-only loop with
// exactly its access pattern on the same buffers (trivial arithmetic, compiled for
// AVX-512/AVX2/baseline by target_clones), and "of ceiling" divides the two. Bytes per element
// (int8, block 2048):
//   encode          read 4,  write 1 (+4 per block)
//   encode + EF     read 8,  write 5 (the residual)
//   decode          read 1,  write 4
//   decode + add    read 5,  write 4   (the qgZ sum: dst += decode)
//   int4 encode     read 4,  write 0.5; int4 decode read 0.5, write 4
//
//   quant_bench [--elements 33554432] [--rounds 9] [--block 2048] [--isa avx512,avx2,scalar]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "core/host_buffer.h"
#include "hsdp/cli.h"
#include "hsdp/parse.h"
#include "hsdp/quantize.h"

namespace {

using Clock = std::chrono::steady_clock;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HSDP_BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HSDP_BENCH_CLONES
#endif

// Ceilings: the kernels' traffic with one cheap operation per element.
HSDP_BENCH_CLONES void readFourWriteOne(const float* __restrict s, int8_t* __restrict d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<int8_t>(s[i]);
}
HSDP_BENCH_CLONES void readEightWriteFive(const float* __restrict s, float* __restrict r,
                                          int8_t* __restrict d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = s[i] + r[i];
    d[i] = static_cast<int8_t>(x);
    r[i] = x * 0.5f;
  }
}
HSDP_BENCH_CLONES void readOneWriteFour(const int8_t* __restrict s, float* __restrict d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
}
HSDP_BENCH_CLONES void readFiveWriteFour(const int8_t* __restrict s, float* __restrict d,
                                         size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] += static_cast<float>(s[i]);
}
HSDP_BENCH_CLONES void readFourWriteHalf(const float* __restrict s, uint8_t* __restrict d,
                                         size_t n) {
  for (size_t i = 0; i < n / 2; ++i)
    d[i] = static_cast<uint8_t>(static_cast<int>(s[2 * i]) | static_cast<int>(s[2 * i + 1]) << 4);
}
HSDP_BENCH_CLONES void readHalfWriteFour(const uint8_t* __restrict s, float* __restrict d,
                                         size_t n) {
  for (size_t i = 0; i < n / 2; ++i) {
    d[2 * i] = static_cast<float>(s[i] & 15);
    d[2 * i + 1] = static_cast<float>(s[i] >> 4);
  }
}
HSDP_BENCH_CLONES void triad(float* __restrict a, const float* __restrict b,
                             const float* __restrict c, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
}

using hsdp::bench::loadAverage;
using hsdp::bench::median;

struct Row {
  std::string name;
  double bytes_per_elem;
  int ceiling;  // index of the row this one is compared with (-1: none)
  std::function<void()> run;
  std::vector<double> seconds;
};

int fail(const hsdp::Status& s) {
  std::fprintf(stderr, "quant_bench: error: %s\n", s.toString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = size_t{1} << 25;
  int rounds = 9;
  uint32_t block = hsdp::kDefaultQuantBlock;
  std::vector<std::string> isa_names;
  CLI::App app{"Wire quantization kernels against memory-only ceilings", "quant_bench"};
  hsdp::cli::addInt(app, "--elements", n, "float32 elements encoded per call", size_t{1});
  hsdp::cli::addInt(app, "--rounds", rounds, "rounds (medians over these)", 1, 1000);
  hsdp::cli::addInt(app, "--block", block, "elements per scale (a multiple of 16)", uint32_t{16},
                    uint32_t{1} << 20);
  hsdp::cli::addList(app, "--isa", isa_names, "ISAs (default: all this CPU supports)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, "quant_bench", -1, true);
  }
  const hsdp::WireFormat f8{hsdp::Wire::kInt8, block}, f4{hsdp::Wire::kInt4, block};
  if (hsdp::Status s = validate(f8); !s.ok()) return fail(s);
  auto parsed = hsdp::bench::parseIsas(isa_names);
  if (!parsed.ok()) return fail(parsed.status());
  const std::vector<hsdp::CpuIsa> isas = *parsed;

  // Pre-faulted buffers, allocated once: source, residual, codes, decoded, spare (4 x 4 bytes an
  // element, and at most 1 for the codes).
  if (auto b = hsdp::checkedAllocation(n, 17, hsdp::strCat("--elements ", n)); !b.ok())
    return fail(b.status());
  std::vector<hsdp::HostBuffer> bufs;
  for (size_t bytes : {n * 4, n * 4, hsdp::encodedBytes(f8, n), n * 4, n * 4}) {
    auto b = hsdp::HostBuffer::allocate(bytes);
    if (!b.ok()) return fail(b.status());
    bufs.push_back(std::move(*b));
  }
  float* src = bufs[0].as<float>();
  float* res = bufs[1].as<float>();
  auto* codes = bufs[2].as<unsigned char>();
  float* dec = bufs[3].as<float>();
  float* spare = bufs[4].as<float>();
  for (size_t i = 0; i < n; ++i) {
    src[i] = static_cast<float>((i * 2654435761u) % 2001u) / 1000.0f - 1.0f;
    res[i] = 0.0f;
    spare[i] = 1.0f;
  }
  auto* c8 = reinterpret_cast<int8_t*>(codes);
  const double e8 = hsdp::wireBitsPerElement(f8) / 8, e4 = hsdp::wireBitsPerElement(f4) / 8;

  std::vector<Row> rows;
  auto ceiling = [&](std::string name, double bytes, std::function<void()> run) {
    rows.push_back({"ceiling: " + name, bytes, -1, std::move(run), {}});
    return static_cast<int>(rows.size()) - 1;
  };
  const int c_enc = ceiling("read 4 B, write 1 B", 5, [&] { readFourWriteOne(src, c8, n); });
  const int c_ef = ceiling("read 8 B, write 5 B", 13, [&] { readEightWriteFive(src, res, c8, n); });
  const int c_dec = ceiling("read 1 B, write 4 B", 5, [&] { readOneWriteFour(c8, dec, n); });
  const int c_add = ceiling("read 5 B, write 4 B", 9, [&] { readFiveWriteFour(c8, dec, n); });
  const int c_e4 = ceiling("read 4 B, write 0.5 B", 4.5, [&] { readFourWriteHalf(src, codes, n); });
  const int c_d4 = ceiling("read 0.5 B, write 4 B", 4.5, [&] { readHalfWriteFour(codes, dec, n); });
  for (hsdp::CpuIsa isa : isas) {
    const std::string tag = std::string(" ") + hsdp::cpuIsaName(isa);
    rows.push_back({"int8 encode" + tag,
                    4 + e8,
                    c_enc,
                    [&, isa] { hsdp::wireEncode(isa, f8, src, n, codes); },
                    {}});
    rows.push_back({"int8 encode + EF" + tag,
                    8 + e8 + 4,
                    c_ef,
                    [&, isa] { hsdp::wireEncode(isa, f8, src, n, codes, res); },
                    {}});
    rows.push_back({"int8 decode" + tag,
                    e8 + 4,
                    c_dec,
                    [&, isa] { hsdp::wireDecode(isa, f8, codes, n, dec); },
                    {}});
    rows.push_back({"int8 decode + add" + tag,
                    e8 + 8,
                    c_add,
                    [&, isa] { hsdp::wireDecode(isa, f8, codes, n, dec, true); },
                    {}});
    rows.push_back({"int4 encode" + tag,
                    4 + e4,
                    c_e4,
                    [&, isa] { hsdp::wireEncode(isa, f4, src, n, codes); },
                    {}});
    rows.push_back({"int4 decode" + tag,
                    e4 + 4,
                    c_d4,
                    [&, isa] { hsdp::wireDecode(isa, f4, codes, n, dec); },
                    {}});
  }
  rows.push_back({"stream triad (12 B/elem)", 12, -1, [&] { triad(dec, src, spare, n); }, {}});

  std::printf("# quant_bench: %zu elements (%.0f MiB fp32), block %u, %d rounds, 1 thread\n", n,
              n * 4 / 1048576.0, block, rounds);
  std::printf("# load average at start: %s (the machine may be shared: medians, interleaved)\n",
              loadAverage().c_str());
  for (Row& r : rows) r.run();  // warm-up: page tables, caches, clones resolved
  for (int round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < rows.size(); ++k) {
      Row& r = rows[(k + round) % rows.size()];
      const auto t0 = Clock::now();
      r.run();
      r.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  std::printf("\n%-32s %9s %9s %11s %11s %11s\n", "kernel", "ms", "GB/s", "of ceiling", "best GB/s",
              "of ceiling");
  std::vector<double> gbs(rows.size()), best(rows.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    const double t = median(rows[k].seconds);
    const double tb = *std::min_element(rows[k].seconds.begin(), rows[k].seconds.end());
    gbs[k] = rows[k].bytes_per_elem * n / t / 1e9;
    best[k] = rows[k].bytes_per_elem * n / tb / 1e9;
    std::printf("%-32s %9.2f %9.2f", rows[k].name.c_str(), t * 1e3, gbs[k]);
    const int c = rows[k].ceiling;
    if (c >= 0)
      std::printf(" %10.2fx", gbs[k] / gbs[c]);
    else
      std::printf(" %11s", "");
    std::printf(" %11.2f", best[k]);
    if (c >= 0) std::printf(" %10.2fx", best[k] / best[c]);
    std::printf("\n");
  }
  std::printf("# load average at end: %s\n", loadAverage().c_str());
  return 0;
}
