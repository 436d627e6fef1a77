// What is particular to the MPI transport and the hierarchical schedules, beyond the Comm contract
// every transport passes (conformance/conformance_suite.h): the schedules' pipelining with chunk
// counts that do not divide the size, several operations in flight on one object, the bf16
// inter-node wire, the session's Open MPI settings and the progress thread. Oracle: MPI's own
// collectives over the shard group.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "collectives/mpi/mpi_comm.h"
#include "core/launcher.h"
#include "core/progress.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"
#include "tests/common/mpi_test_main.h"
#include "tests/common/scoped_env.h"
#include "tests/common/status_assert.h"

namespace hsdp {
namespace {

using testing::world;

MPI_Comm raw(Comm& c) { return dynamic_cast<mpi::MpiComm&>(c).raw(); }

struct Fixture {
  NodeLayout layout;
  std::vector<std::unique_ptr<Mesh>> meshes;  // every valid mesh of the node layout
};

Fixture& fixture() {
  static Fixture* f = [] {
    auto* fx = new Fixture();
    auto l = groupRanksIntoNodes(world());
    EXPECT_TRUE(l.ok()) << l.status().toString();
    fx->layout = *l;
    for (int I = 1; I <= fx->layout.ranks_per_node; ++I) {
      if (fx->layout.ranks_per_node % I) continue;
      for (int J = 1; J <= fx->layout.num_nodes; ++J) {
        if (fx->layout.num_nodes % J) continue;
        auto m = Mesh::create(world(), fx->layout, {I, J});
        EXPECT_TRUE(m.ok()) << m.status().toString();
        fx->meshes.push_back(std::move(*m));
      }
    }
    return fx;
  }();
  return *f;
}

// Small integers: any summation order gives the exact sum, in float and in bf16 (<= 8 ranks).
float exactValue(int rank, size_t i) { return float(((rank + 1) * (i % 13 + 3)) % 17 % 9); }

}  // namespace
}  // namespace hsdp

namespace hsdp {
namespace {

// Pipelined schedules: chunk counts that do not divide the size, several operations in flight,
// and the bf16 inter-node wire type.
TEST(Hierarchical, PipelinedChunksAndInterDtype) {
  for (auto& mesh : fixture().meshes) {
    Comm& group = mesh->shardGroup();
    const int S = group.size();
    for (int chunks : {1, 3, 7}) {
      for (DType wire : {DType::kFloat32, DType::kBFloat16}) {
        HierarchicalCollectives hier(mesh->intraShard(), mesh->interShard());
        ASSERT_TRUE(hier.setOptions({chunks, wire}).ok());
        for (size_t count : {size_t(1), size_t(7), size_t(1000), size_t(100003)}) {
          SCOPED_TRACE(strCat(mesh->describe(), " chunks=", chunks, " wire=", dtypeName(wire),
                              " count=", count));
          ASSERT_TRUE(hier.reserve(count, DType::kFloat32).ok());
          // Two all-gathers and two reduce-scatters in flight at once, waited out of order.
          std::vector<float> shard0(count), shard1(count);
          for (size_t i = 0; i < count; ++i) {
            shard0[i] = exactValue(world().rank(), i);
            shard1[i] = exactValue(world().rank() + 5, i);
          }
          std::vector<float> full0(S * count), full1(S * count);
          std::vector<float> in(S * count), out0(count), out1(count);
          for (size_t i = 0; i < in.size(); ++i) in[i] = exactValue(world().rank(), i);
          auto a0 = hier.iallGather(shard0.data(), full0.data(), count, DType::kFloat32);
          auto r0 =
              hier.ireduceScatter(in.data(), out0.data(), count, DType::kFloat32, RedOp::kSum);
          auto a1 = hier.iallGather(shard1.data(), full1.data(), count, DType::kFloat32);
          auto r1 =
              hier.ireduceScatter(in.data(), out1.data(), count, DType::kFloat32, RedOp::kAvg);
          ASSERT_TRUE(a0.ok() && r0.ok() && a1.ok() && r1.ok());
          ASSERT_TRUE((*r1)->wait().ok());
          ASSERT_TRUE((*a1)->wait().ok());
          ASSERT_TRUE((*r0)->wait().ok());
          ASSERT_TRUE((*a0)->wait().ok());
          std::vector<float> want0(S * count), want1(S * count), ref(count);
          MPI_Allgather(shard0.data(), int(count), MPI_FLOAT, want0.data(), int(count), MPI_FLOAT,
                        raw(group));
          MPI_Allgather(shard1.data(), int(count), MPI_FLOAT, want1.data(), int(count), MPI_FLOAT,
                        raw(group));
          MPI_Reduce_scatter_block(in.data(), ref.data(), int(count), MPI_FLOAT, MPI_SUM,
                                   raw(group));
          // Small integers are exact in bf16 too, so every case compares exactly.
          EXPECT_EQ(full0, want0);
          EXPECT_EQ(full1, want1);
          EXPECT_EQ(out0, ref);
          // An average is not exact in bf16: 8 significant bits, rounded once per inter hop.
          const float rel = wire == DType::kBFloat16 ? 1e-2f : 1e-6f;
          for (size_t i = 0; i < count; ++i) ASSERT_NEAR(out1[i], ref[i] / S, rel * ref[i]) << i;
        }
      }
    }
  }
}

// Open MPI's value of a control variable, through MPI_T (nullopt: no such variable).
std::optional<unsigned long> openMpiValue(const std::string& wanted) {
  int provided = 0, n = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return std::nullopt;
  std::optional<unsigned long> value;
  MPI_T_cvar_get_num(&n);
  for (int i = 0; i < n && !value; ++i) {
    char name[256];
    int len = sizeof name, verbosity = 0, bind = 0, scope = 0, count = 0;
    MPI_Datatype type;
    MPI_T_enum enumtype;
    MPI_T_cvar_handle h;
    if (MPI_T_cvar_get_info(i, name, &len, &verbosity, &type, &enumtype, nullptr, nullptr, &bind,
                            &scope) != MPI_SUCCESS ||
        wanted != name || MPI_T_cvar_handle_alloc(i, nullptr, &h, &count) != MPI_SUCCESS)
      continue;
    // Integers and booleans of up to 8 bytes, read into a zeroed word (little-endian host).
    int size = 0;
    uint64_t v = 0;
    if (MPI_Type_size(type, &size) == MPI_SUCCESS && size > 0 && size <= 8 && count == 1 &&
        MPI_T_cvar_read(h, &v) == MPI_SUCCESS)
      value = static_cast<unsigned long>(v);
    MPI_T_cvar_handle_free(&h);
  }
  MPI_T_finalize();
  return value;
}

// mpi::Session sets Open MPI's TCP eager limits (HSDP_MPI_TCP_EAGER, default 4 MiB) before
// MPI_Init: the values Open MPI itself reports through MPI_T are the ones asked for.
TEST(Session, TcpEagerLimitsReachOpenMpi) {
  const char* asked = std::getenv("HSDP_MPI_TCP_EAGER");
  const unsigned long want = asked ? std::strtoul(asked, nullptr, 10) : 4ul << 20;
  if (want == 0) GTEST_SKIP() << "HSDP_MPI_TCP_EAGER=0 leaves Open MPI's defaults";
  for (const char* name :
       {"btl_tcp_eager_limit", "btl_tcp_rndv_eager_limit", "btl_tcp_max_send_size"}) {
    const std::optional<unsigned long> v = openMpiValue(name);
    ASSERT_TRUE(v.has_value()) << name << " not found";
    EXPECT_EQ(*v, want) << name;
  }
}

// The progress thread (ctest runs this binary again with HSDP_PROGRESS_THREAD=1): a pipelined
// all-gather, started and then left alone, completes while the caller sleeps. Without the thread
// it cannot: only advance() issues its later chunks, and nothing calls it.
TEST(Progress, ThreadAdvancesBetweenCalls) {
  const bool threaded = progress_thread::running();
  for (auto& mesh : fixture().meshes) {
    if (mesh->intraShard().size() < 2 || mesh->interShard().size() < 2) continue;
    SCOPED_TRACE(strCat(mesh->describe(), threaded ? " (progress thread)" : " (no thread)"));
    Comm& group = mesh->shardGroup();
    const size_t count = 10007;
    HierarchicalCollectives hier(mesh->intraShard(), mesh->interShard());
    ASSERT_TRUE(hier.setOptions({7, DType::kFloat32}).ok());
    ASSERT_TRUE(hier.reserve(count, DType::kFloat32).ok());
    std::vector<float> shard(count), full(group.size() * count);
    for (size_t i = 0; i < count; ++i) shard[i] = exactValue(world().rank(), i);
    auto w = hier.iallGather(shard.data(), full.data(), count, DType::kFloat32);
    ASSERT_TRUE(w.ok()) << w.status().toString();
    auto* pw = dynamic_cast<ProgressiveWork*>(w->get());
    ASSERT_NE(pw, nullptr);
    auto done = [&] {
      auto lock = progressLock();  // reads the state; advances nothing
      return pw->done();
    };
    if (threaded) {
      bool finished = false;
      for (int i = 0; i < 400 && !(finished = done()); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      EXPECT_TRUE(finished) << "not complete after 10 s of the progress thread alone";
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_FALSE(done()) << "completed with nobody advancing it";
    }
    ASSERT_TRUE((*w)->wait().ok());
    std::vector<float> want(full.size());
    MPI_Allgather(shard.data(), int(count), MPI_FLOAT, want.data(), int(count), MPI_FLOAT,
                  raw(group));
    EXPECT_EQ(full, want);
  }
}

// The pipelined all-reduce: chunk counts that do not divide the size, two all-reduces and an
// all-gather in flight on one object (their sub-collectives interleave on both levels), waited in
// reverse order; sum is exact on small integers, avg is compared with float rounding.
TEST(Hierarchical, AllReduceVsMpi) {
  for (auto& mesh : fixture().meshes) {
    Comm& group = mesh->shardGroup();
    const int S = group.size();
    for (int chunks : {1, 3, 7}) {
      HierarchicalCollectives hier(mesh->intraShard(), mesh->interShard());
      ASSERT_TRUE(hier.setOptions({chunks, DType::kFloat32}).ok());
      for (size_t count : {size_t(1), size_t(7), size_t(1000), size_t(100003)}) {
        SCOPED_TRACE(strCat(mesh->describe(), " chunks=", chunks, " count=", count));
        std::vector<float> v(count), a(count), want(count), shard(count), full(S * count),
            want_full(S * count);
        for (size_t i = 0; i < count; ++i) {
          v[i] = exactValue(world().rank(), i);
          a[i] = exactValue(world().rank() + 3, i);
          shard[i] = exactValue(world().rank() + 7, i);
        }
        std::vector<float> want_avg(count);
        MPI_Allreduce(v.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw(group));
        MPI_Allreduce(a.data(), want_avg.data(), int(count), MPI_FLOAT, MPI_SUM, raw(group));
        MPI_Allgather(shard.data(), int(count), MPI_FLOAT, want_full.data(), int(count), MPI_FLOAT,
                      raw(group));
        auto w0 = hier.iallReduce(v.data(), count, DType::kFloat32, RedOp::kSum);
        auto w1 = hier.iallGather(shard.data(), full.data(), count, DType::kFloat32);
        auto w2 = hier.iallReduce(a.data(), count, DType::kFloat32, RedOp::kAvg);
        ASSERT_TRUE(w0.ok() && w1.ok() && w2.ok());
        ASSERT_TRUE((*w2)->wait().ok());
        ASSERT_TRUE((*w1)->wait().ok());
        ASSERT_TRUE((*w0)->wait().ok());
        EXPECT_EQ(v, want);
        EXPECT_EQ(full, want_full);
        for (size_t i = 0; i < count; ++i)
          ASSERT_NEAR(a[i], want_avg[i] / S, 1e-6f * std::abs(want_avg[i]) + 1e-7f) << i;
      }
    }
  }
}

// The MPI transport's reduce-scatters (HSDP_MPI_RS_ALGO, read when a communicator is made): the
// cross-memory-attach one (auto's choice on this host) and the exchange add the same blocks in
// the same order, so they agree bit for bit, for contiguous and strided blocks, float32 and bf16,
// and for blocks over the exchange's 4 MiB segment (two segments, one boundary inside a run);
// the ring adds in another order, so it agrees with MPI within rounding; a forced ring leaves
// bf16 on the exchange (a bf16 ring would round at every hop). Communicators of at most three
// ranks, so the large blocks fit every layout.
TEST(MpiReduceScatter, CrossMemoryAttachAndExchangeAgreeBitForBit) {
  const int small = world().rank() < 3 ? 0 : 1 + world().rank();
  std::unique_ptr<Comm> comms[3];
  const char* algos[3] = {"auto", "exchange", "ring"};
  for (int a = 0; a < 3; ++a) {
    testing::ScopedEnv env("HSDP_MPI_RS_ALGO", algos[a]);
    auto c = world().split(small, world().rank());
    ASSERT_OK(c.status());
    comms[a] = std::move(*c);
  }
  const size_t n = static_cast<size_t>(comms[0]->size());
  const BlockRuns layouts[] = {{1, 1, 1},
                               {100003, 1, 100003},
                               {65537, 2, 100001},
                               {1100000, 1, 1100000},
                               {700001, 2, 700003}};
  std::mt19937 gen(77 + world().rank());
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (const BlockRuns& l : layouts) {
    SCOPED_TRACE(strCat("runs of ", l.run, " x ", l.runs, " stride ", l.stride));
    const size_t block = l.blockCount(), total = (n * l.runs - 1) * l.stride + l.run;
    std::vector<float> full(total);
    for (float& x : full) x = d(gen);
    std::vector<float> packed(n * block);
    for (size_t q = 0; q < n; ++q)
      for (size_t p = 0; p < l.runs; ++p)
        std::copy_n(full.begin() + l.offset(q, p), l.run,
                    packed.begin() + (q * l.runs + p) * l.run);
    std::vector<float> want(block);
    MPI_Reduce_scatter_block(packed.data(), want.data(), int(block), MPI_FLOAT, MPI_SUM,
                             raw(*comms[1]));
    std::vector<float> got[3], scratch(n * block);
    for (int a = 0; a < 3; ++a) {
      got[a].assign(block, -3.0f);
      auto w = comms[a]->ireduceScatterRuns(full.data(), got[a].data(), l, DType::kFloat32,
                                            RedOp::kSum, scratch.data());
      ASSERT_OK(w.status());
      ASSERT_OK((*w)->wait());
    }
    EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), block * sizeof(float)))
        << "cross-memory attach and exchange differ";
    for (size_t i = 0; i < block; ++i) {
      ASSERT_NEAR(got[0][i], want[i], 1e-6f * n) << i;
      ASSERT_NEAR(got[2][i], want[i], 1e-6f * n) << "ring, element " << i;
    }
    // bf16, contiguous: every algorithm takes a bf16-exact path, rounded once.
    if (l.runs != 1) continue;
    std::vector<bf16> full16(n * block), out16[3];
    for (size_t i = 0; i < full16.size(); ++i) full16[i] = toBf16(full[i]);
    for (int a = 0; a < 3; ++a) {
      out16[a].assign(block, toBf16(-3.0f));
      ASSERT_OK(comms[a]->reduceScatter(full16.data(), out16[a].data(), block, DType::kBFloat16,
                                        RedOp::kAvg));
    }
    EXPECT_EQ(0, std::memcmp(out16[0].data(), out16[1].data(), block * sizeof(bf16)));
    EXPECT_EQ(0, std::memcmp(out16[2].data(), out16[1].data(), block * sizeof(bf16)))
        << "bf16 took the ring";
  }
}

// A value of HSDP_MPI_RS_ALGO that is none of the four is an error naming it, on every rank,
// where the communicator is made.
TEST(MpiReduceScatter, BadAlgorithmNamesTheValue) {
  testing::ScopedEnv env("HSDP_MPI_RS_ALGO", "fastest");
  auto c = world().split(0, world().rank());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("HSDP_MPI_RS_ALGO='fastest' is not auto, ring, exchange or "
                                      "cma"),
            std::string::npos)
      << c.status().toString();
}

// mpi::Session asks Open MPI to yield the core when idle where this host runs more ranks than it
// has cores (HSDP_MPI_YIELD=auto): the value Open MPI reports through MPI_T. Elsewhere Open MPI
// decides by its slots, and the test checks nothing.
TEST(Session, YieldWhenIdleWhereRanksOutnumberCores) {
  // The same launcher-neutral source as the session (mpirun's, else Slurm's variables).
  const StatusOr<std::optional<launcher::Count>> local_or = launcher::localSize();
  ASSERT_TRUE(local_or.ok()) << local_or.status().toString();
  const int64_t local = local_or->has_value() ? (*local_or)->value : 0;
  const char* asked = std::getenv("HSDP_MPI_YIELD");
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  if (local == 0 || (asked != nullptr && std::string(asked) != "auto") || local <= CPU_COUNT(&set))
    GTEST_SKIP() << "not oversubscribed by hsdp's rule, or HSDP_MPI_YIELD set";
  const std::optional<unsigned long> v = openMpiValue("mpi_yield_when_idle");
  ASSERT_TRUE(v.has_value()) << "Open MPI's mpi_yield_when_idle not found";
  EXPECT_EQ(*v, 1u) << local << " ranks on " << CPU_COUNT(&set) << " cores";
}

TEST(Hierarchical, BadOptionsNameTheValue) {
  auto& mesh = fixture().meshes.front();
  HierarchicalCollectives hier(mesh->intraShard(), mesh->interShard());
  Status s = hier.setOptions({0, DType::kFloat32});
  EXPECT_NE(s.message().find("chunks 0"), std::string::npos);
  EXPECT_FALSE(hier.setOptions({2, DType::kInt32}).ok());
}

}  // namespace
}  // namespace hsdp
