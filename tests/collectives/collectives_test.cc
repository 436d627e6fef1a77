// Every collective of the MPI transport, and the hierarchical schedules, against the MPI
// library's own collective as oracle, on the world and on every sub-communicator of every valid
// mesh of the job's (virtual) node layout. Integer-valued inputs make sums exact in any order, so
// those comparisons are exact; random inputs are compared within rounding.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <memory>
#include <random>
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
  std::vector<std::unique_ptr<Mesh>> meshes;
  std::vector<std::pair<std::string, Comm*>> comms;  // name, comm
};

Fixture& fixture() {
  static Fixture* f = [] {
    auto* fx = new Fixture();
    auto l = groupRanksIntoNodes(world());
    EXPECT_TRUE(l.ok()) << l.status().toString();
    fx->layout = *l;
    fx->comms.push_back({"world", &world()});
    for (int I = 1; I <= fx->layout.ranks_per_node; ++I) {
      if (fx->layout.ranks_per_node % I) continue;
      for (int J = 1; J <= fx->layout.num_nodes; ++J) {
        if (fx->layout.num_nodes % J) continue;
        auto m = Mesh::create(world(), fx->layout, {I, J});
        EXPECT_TRUE(m.ok()) << m.status().toString();
        std::string tag = strCat("[", I, "x", J, "]");
        fx->comms.push_back({"intra" + tag, &(*m)->intraShard()});
        fx->comms.push_back({"inter" + tag, &(*m)->interShard()});
        fx->comms.push_back({"shard" + tag, &(*m)->shardGroup()});
        fx->comms.push_back({"replica" + tag, &(*m)->replica()});
        fx->meshes.push_back(std::move(*m));
      }
    }
    return fx;
  }();
  return *f;
}

const std::vector<size_t> kCounts = {1, 7, 1000, 100003};

// Small integers: any summation order gives the exact sum, in float and in bf16 (<= 8 ranks).
float exactValue(int rank, size_t i) { return float(((rank + 1) * (i % 13 + 3)) % 17 % 9); }

std::vector<float> randomValues(int rank, size_t n) {
  std::mt19937 gen(1234 + rank);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

std::vector<bf16> toBf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = hsdp::toBf16(v[i]);
  return out;
}

TEST(Collectives, ReduceScatterSumExactVsMpi) {
  for (auto& [name, comm] : fixture().comms) {
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      const int n = comm->size();
      std::vector<float> in(n * count), out(count, -1), want(count, -2);
      for (size_t i = 0; i < in.size(); ++i) in[i] = exactValue(world().rank(), i);
      ASSERT_TRUE(comm->reserveScratch(count * 4).ok());
      ASSERT_TRUE(comm->reduceScatter(in.data(), out.data(), count, DType::kFloat32, RedOp::kSum).ok());
      MPI_Reduce_scatter_block(in.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw(*comm));
      EXPECT_EQ(out, want);
    }
  }
}

TEST(Collectives, ReduceScatterRandomSumAndAvgVsMpi) {
  for (auto& [name, comm] : fixture().comms) {
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      const int n = comm->size();
      std::vector<float> in = randomValues(world().rank(), n * count);
      std::vector<float> sum(count), avg(count), want(count);
      ASSERT_TRUE(comm->reduceScatter(in.data(), sum.data(), count, DType::kFloat32, RedOp::kSum).ok());
      ASSERT_TRUE(comm->reduceScatter(in.data(), avg.data(), count, DType::kFloat32, RedOp::kAvg).ok());
      MPI_Reduce_scatter_block(in.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw(*comm));
      for (size_t i = 0; i < count; ++i) {
        ASSERT_NEAR(sum[i], want[i], 1e-5f * n) << i;
        ASSERT_NEAR(avg[i], want[i] / n, 1e-5f) << i;
      }
    }
  }
}

TEST(Collectives, ReduceScatterBf16VsMpiOnFloats) {
  for (auto& [name, comm] : fixture().comms) {
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      const int n = comm->size();
      std::vector<float> in(n * count), want(count);
      for (size_t i = 0; i < in.size(); ++i) in[i] = exactValue(world().rank(), i);
      std::vector<bf16> in16 = toBf16(in), out16(count);
      ASSERT_TRUE(comm->reduceScatter(in16.data(), out16.data(), count, DType::kBFloat16, RedOp::kSum).ok());
      MPI_Reduce_scatter_block(in.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw(*comm));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(toFloat(out16[i]), want[i]) << i;
    }
  }
}

TEST(Collectives, AllGatherVsMpiIncludingInPlace) {
  for (auto& [name, comm] : fixture().comms) {
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      const int n = comm->size(), r = comm->rank();
      std::vector<float> mine = randomValues(world().rank(), count);
      std::vector<float> out(n * count), want(n * count);
      ASSERT_TRUE(comm->allGather(mine.data(), out.data(), count, DType::kFloat32).ok());
      MPI_Allgather(mine.data(), int(count), MPI_FLOAT, want.data(), int(count), MPI_FLOAT, raw(*comm));
      EXPECT_EQ(out, want);
      std::vector<float> inplace(n * count, 0.0f);
      std::copy(mine.begin(), mine.end(), inplace.begin() + r * count);
      ASSERT_TRUE(comm->allGather(inplace.data() + r * count, inplace.data(), count, DType::kFloat32).ok());
      EXPECT_EQ(inplace, want);
      std::vector<bf16> m16 = toBf16(mine), o16(n * count);
      ASSERT_TRUE(comm->allGather(m16.data(), o16.data(), count, DType::kBFloat16).ok());
      for (size_t i = 0; i < o16.size(); ++i) ASSERT_EQ(o16[i].bits, hsdp::toBf16(want[i]).bits);
    }
  }
}

TEST(Collectives, AllReduceVsMpi) {
  for (auto& [name, comm] : fixture().comms) {
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      const int n = comm->size();
      std::vector<float> v(count), want(count);
      for (size_t i = 0; i < count; ++i) v[i] = exactValue(world().rank(), i);
      std::vector<bf16> v16 = toBf16(v);
      MPI_Allreduce(v.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw(*comm));
      std::vector<float> avg = v;
      ASSERT_TRUE(comm->allReduce(v.data(), count, DType::kFloat32, RedOp::kSum).ok());
      EXPECT_EQ(v, want);
      ASSERT_TRUE(comm->allReduce(avg.data(), count, DType::kFloat32, RedOp::kAvg).ok());
      for (size_t i = 0; i < count; ++i) ASSERT_NEAR(avg[i], want[i] / n, 1e-6f * want[i]);
      ASSERT_TRUE(comm->allReduce(v16.data(), count, DType::kBFloat16, RedOp::kSum).ok());
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(toFloat(v16[i]), want[i]) << i;
    }
  }
}

TEST(Collectives, BroadcastAndBarrier) {
  for (auto& [name, comm] : fixture().comms) {
    SCOPED_TRACE(name);
    const int root = comm->size() - 1;
    std::vector<int64_t> v(1001, comm->rank());
    ASSERT_TRUE(comm->broadcast(v.data(), v.size(), DType::kInt64, root).ok());
    for (int64_t x : v) ASSERT_EQ(x, root);
    EXPECT_TRUE(comm->barrier().ok());
    EXPECT_EQ(comm->broadcast(v.data(), 1, DType::kInt64, comm->size()).code(),
              StatusCode::kInvalidArgument);
  }
}

// Hierarchical schedules equal the flat collective over the shard group (MPI's own, as oracle).
TEST(Hierarchical, MatchesFlatShardGroupCollective) {
  for (auto& mesh : fixture().meshes) {
    HierarchicalCollectives hier(mesh->intraShard(), mesh->interShard());
    Comm& group = mesh->shardGroup();
    const int S = group.size();
    ASSERT_EQ(hier.groupSize(), S);
    ASSERT_EQ(hier.shardIndex(), group.rank());
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(mesh->describe(), " count=", count));
      ASSERT_TRUE(hier.reserve(count, DType::kFloat32).ok());
      // all-gather
      std::vector<float> shard = randomValues(world().rank(), count);
      std::vector<float> full(S * count), want(S * count);
      ASSERT_TRUE(hier.allGather(shard.data(), full.data(), count, DType::kFloat32).ok());
      MPI_Allgather(shard.data(), int(count), MPI_FLOAT, want.data(), int(count), MPI_FLOAT, raw(group));
      EXPECT_EQ(full, want);
      // reduce-scatter, exact
      std::vector<float> in(S * count), out(count), ref(count);
      for (size_t i = 0; i < in.size(); ++i) in[i] = exactValue(world().rank(), i);
      ASSERT_TRUE(hier.reduceScatter(in.data(), out.data(), count, DType::kFloat32, RedOp::kSum).ok());
      MPI_Reduce_scatter_block(in.data(), ref.data(), int(count), MPI_FLOAT, MPI_SUM, raw(group));
      EXPECT_EQ(out, ref);
      // reduce-scatter, average of random values
      std::vector<float> rin = randomValues(world().rank() + 100, S * count);
      ASSERT_TRUE(hier.reduceScatter(rin.data(), out.data(), count, DType::kFloat32, RedOp::kAvg).ok());
      MPI_Reduce_scatter_block(rin.data(), ref.data(), int(count), MPI_FLOAT, MPI_SUM, raw(group));
      for (size_t i = 0; i < count; ++i) ASSERT_NEAR(out[i], ref[i] / S, 1e-6f) << i;
      // bf16 reduce-scatter, exact
      std::vector<bf16> in16 = toBf16(in), out16(count);
      ASSERT_TRUE(hier.reserve(count, DType::kBFloat16).ok());
      ASSERT_TRUE(hier.reduceScatter(in16.data(), out16.data(), count, DType::kBFloat16, RedOp::kSum).ok());
      MPI_Reduce_scatter_block(in.data(), ref.data(), int(count), MPI_FLOAT, MPI_SUM, raw(group));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(toFloat(out16[i]), ref[i]) << i;
    }
  }
}

}  // namespace
}  // namespace hsdp

namespace hsdp {
namespace {

// Many operations in flight on one communicator, waited for in reverse order.
TEST(Nonblocking, ManyOutstandingCompletedOutOfOrder) {
  for (auto& [name, comm] : fixture().comms) {
    SCOPED_TRACE(name);
    const int n = comm->size();
    constexpr int kOps = 6;
    const size_t count = 1001;
    std::vector<std::vector<float>> in(kOps), out(kOps), gathered(kOps), reduced(kOps);
    std::vector<WorkHandle> works;
    for (int o = 0; o < kOps; ++o) {
      in[o].resize(n * count);
      for (size_t i = 0; i < in[o].size(); ++i) in[o][i] = exactValue(world().rank() + o, i);
      out[o].assign(count, -1.0f);
      gathered[o].assign(n * count, -1.0f);
      reduced[o] = std::vector<float>(in[o].begin(), in[o].begin() + count);
      auto rs = comm->ireduceScatter(in[o].data(), out[o].data(), count, DType::kFloat32, RedOp::kSum);
      auto ag = comm->iallGather(in[o].data(), gathered[o].data(), count, DType::kFloat32);
      auto ar = comm->iallReduce(reduced[o].data(), count, DType::kFloat32, RedOp::kSum);
      ASSERT_TRUE(rs.ok() && ag.ok() && ar.ok());
      works.push_back(std::move(*rs));
      works.push_back(std::move(*ag));
      works.push_back(std::move(*ar));
    }
    for (int w = static_cast<int>(works.size()) - 1; w >= 0; --w) ASSERT_TRUE(works[w]->wait().ok());
    for (int o = 0; o < kOps; ++o) {
      std::vector<float> want(count), want_ag(n * count), want_ar(count);
      MPI_Reduce_scatter_block(in[o].data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw(*comm));
      MPI_Allgather(in[o].data(), int(count), MPI_FLOAT, want_ag.data(), int(count), MPI_FLOAT, raw(*comm));
      MPI_Allreduce(in[o].data(), want_ar.data(), int(count), MPI_FLOAT, MPI_SUM, raw(*comm));
      EXPECT_EQ(out[o], want) << o;
      EXPECT_EQ(gathered[o], want_ag) << o;
      EXPECT_EQ(reduced[o], want_ar) << o;
    }
  }
}

// A group of mixed collectives (uneven counts, an empty one, an in-place gather, bf16 and int32)
// equals each collective done by the MPI library, and leaves its neighbours' bytes alone.
TEST(Group, MixedOperationsEqualMpiCollectives) {
  for (auto& [name, comm] : fixture().comms) {
    SCOPED_TRACE(name);
    const int n = comm->size(), r = comm->rank(), w = world().rank();
    const size_t c1 = 7, c2 = 1003, c3 = 0, c4 = 100003;
    std::vector<float> ag_in = randomValues(w, c1), ag_out(n * c1, -1.0f);
    std::vector<float> rs_in(n * c2), rs_out(c2 + 1, -1.0f);  // +1: a guard element
    for (size_t i = 0; i < rs_in.size(); ++i) rs_in[i] = exactValue(w, i);
    std::vector<float> empty_out(1, -1.0f);
    std::vector<float> inplace(n * c4, 0.0f);
    std::vector<float> mine = randomValues(w + 100, c4);
    std::copy(mine.begin(), mine.end(), inplace.begin() + r * c4);
    std::vector<int32_t> ar(c2);
    for (size_t i = 0; i < c2; ++i) ar[i] = static_cast<int32_t>(exactValue(w, i)) - 4;
    const std::vector<int32_t> ar_in = ar;
    std::vector<float> avg_in = randomValues(w + 7, c1), avg = avg_in;
    std::vector<bf16> ag16 = toBf16(ag_in), ag16_out(n * c1);

    std::vector<CollectiveOp> ops = {
        CollectiveOp::allGather(ag_in.data(), ag_out.data(), c1, DType::kFloat32),
        CollectiveOp::reduceScatter(rs_in.data(), rs_out.data(), c2, DType::kFloat32, RedOp::kSum),
        CollectiveOp::allGather(ag_in.data(), empty_out.data(), c3, DType::kFloat32),
        CollectiveOp::allGather(inplace.data() + r * c4, inplace.data(), c4, DType::kFloat32),
        CollectiveOp::allReduce(ar.data(), c2, DType::kInt32, RedOp::kSum),
        CollectiveOp::allReduce(avg.data(), c1, DType::kFloat32, RedOp::kAvg),
        CollectiveOp::allGather(ag16.data(), ag16_out.data(), c1, DType::kBFloat16),
    };
    auto work = comm->igroup(ops);
    ASSERT_TRUE(work.ok()) << work.status().toString();
    // test() until done, so the group's own progress path runs, not only wait().
    for (;;) {
      auto done = (*work)->test();
      ASSERT_TRUE(done.ok()) << done.status().toString();
      if (*done) break;
    }
    ASSERT_TRUE((*work)->wait().ok());

    std::vector<float> want_ag(n * c1), want_rs(c2), want_in(n * c4), want_avg(c1);
    std::vector<int32_t> want_ar(c2);
    MPI_Allgather(ag_in.data(), int(c1), MPI_FLOAT, want_ag.data(), int(c1), MPI_FLOAT, raw(*comm));
    MPI_Reduce_scatter_block(rs_in.data(), want_rs.data(), int(c2), MPI_FLOAT, MPI_SUM, raw(*comm));
    MPI_Allgather(mine.data(), int(c4), MPI_FLOAT, want_in.data(), int(c4), MPI_FLOAT, raw(*comm));
    MPI_Allreduce(ar_in.data(), want_ar.data(), int(c2), MPI_INT32_T, MPI_SUM, raw(*comm));
    MPI_Allreduce(avg_in.data(), want_avg.data(), int(c1), MPI_FLOAT, MPI_SUM, raw(*comm));
    EXPECT_EQ(ag_out, want_ag);
    EXPECT_EQ(std::vector<float>(rs_out.begin(), rs_out.begin() + c2), want_rs);
    EXPECT_EQ(rs_out[c2], -1.0f) << "wrote past its block";
    EXPECT_EQ(empty_out[0], -1.0f) << "an empty operation wrote";
    EXPECT_EQ(inplace, want_in);
    EXPECT_EQ(ar, want_ar);
    for (size_t i = 0; i < c1; ++i) EXPECT_NEAR(avg[i], want_avg[i] / n, 1e-6f) << i;
    for (size_t i = 0; i < ag16_out.size(); ++i)
      ASSERT_EQ(ag16_out[i].bits, hsdp::toBf16(want_ag[i]).bits) << i;
  }
}

// An empty group completes at once; a bad operation (the same on every rank) fails the group
// with its index and kind named, after the operations before it completed everywhere.
TEST(Group, EmptyGroupAndBadOperationNamed) {
  for (auto& [name, comm] : fixture().comms) {
    SCOPED_TRACE(name);
    auto empty = comm->igroup({});
    ASSERT_TRUE(empty.ok());
    auto done = (*empty)->test();
    ASSERT_TRUE(done.ok() && *done);
    const int n = comm->size();
    std::vector<float> a(3), out(n * 3);
    std::vector<int32_t> b(5, 1);
    std::vector<CollectiveOp> ops = {
        CollectiveOp::allGather(a.data(), out.data(), 3, DType::kFloat32),
        CollectiveOp::allReduce(b.data(), 5, DType::kInt32, RedOp::kAvg),
    };
    auto w = comm->igroup(ops);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(w.status().message().find("group operation 1 of 2"), std::string::npos)
        << w.status().message();
    EXPECT_NE(w.status().message().find("avg of int32"), std::string::npos) << w.status().message();
    EXPECT_TRUE(comm->barrier().ok());  // nothing left half-issued

    // Dependent operations (one writes what another reads or writes) are rejected, both named,
    // before anything starts; an in-place gather beside an independent one is fine.
    std::vector<float> x(n * 8), y(n * 8);
    std::vector<CollectiveOp> rs_then_ag = {
        CollectiveOp::reduceScatter(x.data(), y.data(), 8, DType::kFloat32, RedOp::kSum),
        CollectiveOp::allGather(y.data(), x.data(), 8, DType::kFloat32)};
    auto dep = comm->igroup(rs_then_ag);
    ASSERT_FALSE(dep.ok());
    EXPECT_EQ(dep.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(dep.status().message().find("group operations 0 (reduceScatter) and 1 (allGather)"),
              std::string::npos)
        << dep.status().message();
    std::vector<CollectiveOp> two_writers = {
        CollectiveOp::allReduce(y.data() + 4, 4, DType::kFloat32, RedOp::kSum),
        CollectiveOp::allReduce(x.data(), 1, DType::kFloat32, RedOp::kSum),
        CollectiveOp::allReduce(y.data(), 5, DType::kFloat32, RedOp::kSum)};
    dep = comm->igroup(two_writers);
    ASSERT_FALSE(dep.ok());
    EXPECT_NE(dep.status().message().find("operations 0 (allReduce) and 2 (allReduce) write "
                                          "overlapping"),
              std::string::npos)
        << dep.status().message();
    // Two operations reading the same bytes are independent.
    std::vector<float> src = randomValues(world().rank(), 8), out1(n * 8), out2(n * 8), want(n * 8);
    std::vector<CollectiveOp> shared_read = {
        CollectiveOp::allGather(src.data(), out1.data(), 8, DType::kFloat32),
        CollectiveOp::allGather(src.data(), out2.data(), 8, DType::kFloat32)};
    auto ok = comm->igroup(shared_read);
    ASSERT_TRUE(ok.ok()) << ok.status().toString();
    ASSERT_TRUE((*ok)->wait().ok());
    MPI_Allgather(src.data(), 8, MPI_FLOAT, want.data(), 8, MPI_FLOAT, raw(*comm));
    EXPECT_EQ(out1, want);
    EXPECT_EQ(out2, want);
  }
}

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
