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
#include <string>
#include <memory>
#include <thread>

#include "collectives/mpi/mpi_comm.h"
#include "core/progress.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"
#include "tests/common/mpi_test_main.h"

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
          auto r0 = hier.ireduceScatter(in.data(), out0.data(), count, DType::kFloat32, RedOp::kSum);
          auto a1 = hier.iallGather(shard1.data(), full1.data(), count, DType::kFloat32);
          auto r1 = hier.ireduceScatter(in.data(), out1.data(), count, DType::kFloat32, RedOp::kAvg);
          ASSERT_TRUE(a0.ok() && r0.ok() && a1.ok() && r1.ok());
          ASSERT_TRUE((*r1)->wait().ok());
          ASSERT_TRUE((*a1)->wait().ok());
          ASSERT_TRUE((*r0)->wait().ok());
          ASSERT_TRUE((*a0)->wait().ok());
          std::vector<float> want0(S * count), want1(S * count), ref(count);
          MPI_Allgather(shard0.data(), int(count), MPI_FLOAT, want0.data(), int(count), MPI_FLOAT, raw(group));
          MPI_Allgather(shard1.data(), int(count), MPI_FLOAT, want1.data(), int(count), MPI_FLOAT, raw(group));
          MPI_Reduce_scatter_block(in.data(), ref.data(), int(count), MPI_FLOAT, MPI_SUM, raw(group));
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

// mpi::Session sets Open MPI's TCP eager limits (HSDP_MPI_TCP_EAGER, default 4 MiB) before
// MPI_Init: the values Open MPI itself reports through MPI_T are the ones asked for.
TEST(Session, TcpEagerLimitsReachOpenMpi) {
  const char* asked = std::getenv("HSDP_MPI_TCP_EAGER");
  const unsigned long want = asked ? std::strtoul(asked, nullptr, 10) : 4ul << 20;
  if (want == 0) GTEST_SKIP() << "HSDP_MPI_TCP_EAGER=0 leaves Open MPI's defaults";
  int provided = 0;
  ASSERT_EQ(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided), MPI_SUCCESS);
  int n = 0;
  ASSERT_EQ(MPI_T_cvar_get_num(&n), MPI_SUCCESS);
  int found = 0;
  for (int i = 0; i < n; ++i) {
    char name[256];
    int len = sizeof name, verbosity = 0, bind = 0, scope = 0;
    MPI_Datatype type;
    MPI_T_enum enumtype;
    if (MPI_T_cvar_get_info(i, name, &len, &verbosity, &type, &enumtype, nullptr, nullptr, &bind,
                            &scope) != MPI_SUCCESS)
      continue;
    const std::string s = name;
    if (s != "btl_tcp_eager_limit" && s != "btl_tcp_rndv_eager_limit" &&
        s != "btl_tcp_max_send_size")
      continue;
    ASSERT_EQ(type, MPI_UNSIGNED_LONG) << s;
    MPI_T_cvar_handle h;
    int count = 0;
    ASSERT_EQ(MPI_T_cvar_handle_alloc(i, nullptr, &h, &count), MPI_SUCCESS);
    unsigned long v = 0;
    ASSERT_EQ(MPI_T_cvar_read(h, &v), MPI_SUCCESS);
    MPI_T_cvar_handle_free(&h);
    EXPECT_EQ(v, want) << s;
    ++found;
  }
  MPI_T_finalize();
  EXPECT_EQ(found, 3) << "Open MPI's TCP transport parameters not found";
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
        MPI_Allgather(shard.data(), int(count), MPI_FLOAT, want_full.data(), int(count),
                      MPI_FLOAT, raw(group));
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

TEST(Hierarchical, BadOptionsNameTheValue) {
  auto& mesh = fixture().meshes.front();
  HierarchicalCollectives hier(mesh->intraShard(), mesh->interShard());
  Status s = hier.setOptions({0, DType::kFloat32});
  EXPECT_NE(s.message().find("chunks 0"), std::string::npos);
  EXPECT_FALSE(hier.setOptions({2, DType::kInt32}).ok());
}

}  // namespace
}  // namespace hsdp
