// CPU Adam (offload/cpu_adam.h), part of cpu_adam_test (with cpu_adam_test.cc, which says what the
// kernels are checked against): the ISA and the thread count from the options and the
// environment, bad arguments named and writing nothing, and the pieces the threads run on (the
// persistent worker pool, the chunk boundaries).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "hsdp/dtype.h"
#include "offload/cpu_adam.h"
#include "offload/cpu_adam_internal.h"
#include "offload/cpu_adam_kernels.h"
#include "offload/worker_pool.h"
#include "tests/common/scoped_env.h"
#include "tests/offload/cpu_adam_test_util.h"

namespace hsdp {
namespace {

using cpu_adam_testing::config;
using cpu_adam_testing::makeAdam;
using cpu_adam_testing::sameBits;
using cpu_adam_testing::Shard;
using testing::ScopedEnv;

// ---- configuration and errors ----------------------------------------------------------------

TEST(CpuAdam, IsaFromEnvironment) {
  {
    ScopedEnv e("HSDP_CPU_ADAM_ISA", nullptr);
    auto a = CpuAdam::create({.threads = 1});
    ASSERT_TRUE(a.ok()) << a.status().toString();
    EXPECT_EQ((*a)->isa(), supportedCpuIsas().front());
  }
  {
    ScopedEnv e("HSDP_CPU_ADAM_ISA", "auto");
    EXPECT_EQ(*cpuAdamIsaFromEnv(), supportedCpuIsas().front());
  }
  for (CpuIsa isa : supportedCpuIsas()) {
    ScopedEnv e("HSDP_CPU_ADAM_ISA", cpuIsaName(isa));
    auto a = CpuAdam::create({.threads = 1});
    ASSERT_TRUE(a.ok()) << a.status().toString();
    EXPECT_EQ((*a)->isa(), isa);
  }
  {
    ScopedEnv e("HSDP_CPU_ADAM_ISA", "sse9");
    auto a = CpuAdam::create({.threads = 1});
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("HSDP_CPU_ADAM_ISA='sse9'"), std::string::npos)
        << a.status().message();
  }
  // A named ISA the CPU lacks: an error naming it and what is supported, never a silent
  // fallback. Driven through the resolver, since this CPU may support everything.
  auto r = cpu_adam_detail::resolveCpuIsa("avx512", {CpuIsa::kAvx2, CpuIsa::kScalar});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("HSDP_CPU_ADAM_ISA=avx512"), std::string::npos);
  EXPECT_NE(r.status().message().find("supported: avx2, scalar"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(*cpu_adam_detail::resolveCpuIsa("", {CpuIsa::kAvx2, CpuIsa::kScalar}), CpuIsa::kAvx2);
  EXPECT_FALSE(parseCpuIsa("auto").ok());  // "auto" is the env rule's, not an ISA
}

TEST(CpuAdam, ThreadsFromOptionsAndEnvironment) {
  {
    ScopedEnv e("HSDP_CPU_ADAM_THREADS", "3");
    auto a = CpuAdam::create({.isa = CpuIsa::kScalar});
    ASSERT_TRUE(a.ok());
    EXPECT_EQ((*a)->threads(), 3);
    auto b = CpuAdam::create({.isa = CpuIsa::kScalar, .threads = 2});  // options win
    EXPECT_EQ((*b)->threads(), 2);
  }
  for (const char* bad : {"0", "two", "-1"}) {
    ScopedEnv e("HSDP_CPU_ADAM_THREADS", bad);
    auto a = CpuAdam::create({.isa = CpuIsa::kScalar});
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_NE(a.status().message().find("HSDP_CPU_ADAM_THREADS"), std::string::npos)
        << a.status().message();
  }
  {
    ScopedEnv e("HSDP_CPU_ADAM_THREADS", nullptr);
    auto a = CpuAdam::create({.isa = CpuIsa::kScalar});
    ASSERT_TRUE(a.ok());
    EXPECT_GE((*a)->threads(), 1);
  }
  auto neg = CpuAdam::create({.isa = CpuIsa::kScalar, .threads = -2});
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("threads=-2"), std::string::npos);
}

TEST(CpuAdam, BadArgumentsNameTheValueAndWriteNothing) {
  auto adam = makeAdam(supportedCpuIsas().front(), 2);
  Shard s(40, {});
  s.fillRandom(1);
  const std::vector<float> before(s.param(), s.param() + 40);
  const AdamConfig ok = config(OptimizerKind::kAdamW);
  AdamConfig bad_lr = ok;
  bad_lr.lr = -1.0f;
  struct Bad {
    Status status;
    const char* needle;
  };
  AdamShard no_grad = s.view(false);
  no_grad.grad = nullptr;
  const Bad bad[] = {
      {adam->step(ok, 0, s.view(false)), "t=0"},
      {adam->step(ok, 1, s.view(false), -0.5f), "scale -0.5"},
      {adam->step(ok, 1, s.view(false), NAN), "scale nan"},
      {adam->step(ok, 1, s.view(false), INFINITY), "scale inf"},
      {adam->step(ok, 1, no_grad), "null grad"},
      {adam->step(bad_lr, 1, s.view(false)), "learning rate -1"},
  };
  for (const Bad& b : bad) {
    EXPECT_EQ(b.status.code(), StatusCode::kInvalidArgument) << b.needle;
    EXPECT_NE(b.status.message().find(b.needle), std::string::npos) << b.status.message();
  }
  EXPECT_TRUE(sameBits("param", s.param(), before.data(), 40));
  // An empty shard is fine, with or without arrays.
  EXPECT_TRUE(adam->step(ok, 1, AdamShard{}).ok());
}

// ---- the pieces: thread pool and chunking ----------------------------------------------------

// Threads are created once: across many calls, part k (k >= 1) always runs on the same thread,
// never the caller's, and part 0 always on the caller's.
TEST(WorkerPool, ThreadsArePersistentAndPart0IsTheCaller) {
  auto pool = offload_detail::WorkerPool::create(4);
  ASSERT_TRUE(pool.ok());
  std::vector<std::set<std::thread::id>> seen(4);
  std::vector<int> count(4, 0);
  for (int call = 0; call < 200; ++call) {
    const int parts = 1 + call % 4;
    std::vector<std::thread::id> ids(4);
    (*pool)->run(parts, [&](int k) {
      ids[k] = std::this_thread::get_id();
      ++count[k];
    });
    for (int k = 0; k < parts; ++k) seen[k].insert(ids[k]);
  }
  EXPECT_EQ(seen[0], std::set<std::thread::id>{std::this_thread::get_id()});
  std::set<std::thread::id> all;
  for (int k = 1; k < 4; ++k) {
    EXPECT_EQ(seen[k].size(), 1u) << "part " << k << " ran on several threads";
    all.insert(seen[k].begin(), seen[k].end());
  }
  EXPECT_EQ(all.size(), 3u);
  EXPECT_EQ(all.count(std::this_thread::get_id()), 0u);
  EXPECT_EQ(count[0], 200);
  EXPECT_EQ(count[3], 50);
  // Asking for more parts than threads runs threads() parts.
  int ran = 0;
  (*pool)->run(9, [&](int) { __atomic_add_fetch(&ran, 1, __ATOMIC_RELAXED); });
  EXPECT_EQ(ran, 4);
  EXPECT_FALSE(offload_detail::WorkerPool::create(0).ok());
}

TEST(CpuAdam, ChunkBoundariesCoverAlignAndBalance) {
  alignas(64) static float base[64];
  for (size_t skew = 0; skew < 16; ++skew) {
    const float* p = base + skew;
    for (size_t n : {size_t{0}, size_t{1}, size_t{17}, size_t{1000}, size_t{1000003}}) {
      for (int parts = 1; parts <= 8; ++parts) {
        SCOPED_TRACE(strCat("skew=", skew, " n=", n, " parts=", parts));
        std::vector<size_t> b(parts + 1);
        cpu_adam_detail::chunkBoundaries(p, n, parts, b.data());
        ASSERT_EQ(b.front(), 0u);
        ASSERT_EQ(b.back(), n);
        for (int k = 0; k < parts; ++k) ASSERT_LE(b[k], b[k + 1]);
        for (int k = 1; k < parts; ++k)
          if (b[k] < n) ASSERT_EQ(reinterpret_cast<uintptr_t>(p + b[k]) % 64, 0u) << b[k];
        // Balanced to within a granule plus the unaligned head.
        const double ideal = static_cast<double>(n) / parts;
        for (int k = 0; k < parts; ++k)
          ASSERT_LE(std::fabs(static_cast<double>(b[k + 1] - b[k]) - ideal),
                    2.0 * cpu_adam_detail::kChunkGranule + 16);
      }
    }
  }
}

}  // namespace
}  // namespace hsdp
