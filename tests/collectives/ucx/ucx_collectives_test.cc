// The UCX transport against the MPI library's own collectives as oracle, on the world and on
// every sub-communicator of every valid mesh of the job's (virtual) node layout, each wrapped in a
// UCX communicator over the same members. The world is also run with the small-message limit at
// 0 (ring everywhere) and at 1 GiB (recursive doubling / Bruck everywhere), so both families of
// algorithms meet MPI at every size. Integer-valued inputs make sums exact in any order; random
// inputs are compared within rounding.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include "collectives/mpi/mpi_comm.h"
#include "collectives/ucx/ucx_comm.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"
#include "hsdp/transport_select.h"
#include "tests/common/mpi_test_main.h"

#define ASSERT_OK(expr)                                \
  do {                                                 \
    ::hsdp::Status hsdp_s_ = (expr);                   \
    ASSERT_TRUE(hsdp_s_.ok()) << hsdp_s_.toString();   \
  } while (0)
#define EXPECT_OK(expr)                                \
  do {                                                 \
    ::hsdp::Status hsdp_s_ = (expr);                   \
    EXPECT_TRUE(hsdp_s_.ok()) << hsdp_s_.toString();   \
  } while (0)

namespace hsdp {
namespace {

using testing::world;

MPI_Comm raw(Comm& c) { return dynamic_cast<mpi::MpiComm&>(c).raw(); }

struct Pair {
  std::string name;
  Comm* mpi;                 // the oracle's communicator
  std::unique_ptr<Comm> ucx;  // same members, same order
};

std::unique_ptr<Comm> makeUcx(Comm& bootstrap, const ucx::UcxOptions* options = nullptr) {
  StatusOr<std::unique_ptr<Comm>> c =
      options ? ucx::createUcxComm(bootstrap.split(0, bootstrap.rank()).value(), *options)
              : ucx::createUcxComm(bootstrap);
  EXPECT_TRUE(c.ok()) << c.status().toString();
  if (!c.ok()) return nullptr;
  EXPECT_STREQ((*c)->transportName(), "ucx");
  EXPECT_EQ((*c)->rank(), bootstrap.rank());
  EXPECT_EQ((*c)->size(), bootstrap.size());
  return std::move(*c);
}

struct Fixture {
  std::vector<std::unique_ptr<Mesh>> meshes;
  std::vector<Pair> pairs;
};

Fixture& fixture() {
  static Fixture* f = [] {
    auto* fx = new Fixture();
    ucx::UcxOptions ring, small;
    ring.small_bytes = 0;
    small.small_bytes = size_t(1) << 30;
    fx->pairs.push_back({"world", &world(), makeUcx(world())});
    fx->pairs.push_back({"world/ring", &world(), makeUcx(world(), &ring)});
    fx->pairs.push_back({"world/small", &world(), makeUcx(world(), &small)});
    auto layout = groupRanksIntoNodes(world());
    EXPECT_TRUE(layout.ok()) << layout.status().toString();
    for (int I = 1; I <= layout->ranks_per_node; ++I) {
      if (layout->ranks_per_node % I) continue;
      for (int J = 1; J <= layout->num_nodes; ++J) {
        if (layout->num_nodes % J) continue;
        auto m = Mesh::create(world(), *layout, {I, J});
        EXPECT_TRUE(m.ok()) << m.status().toString();
        std::string tag = strCat("[", I, "x", J, "]");
        for (auto [name, comm] : {std::pair<const char*, Comm*>{"intra", &(*m)->intraShard()},
                                  {"inter", &(*m)->interShard()},
                                  {"shard", &(*m)->shardGroup()},
                                  {"replica", &(*m)->replica()}})
          fx->pairs.push_back({name + tag, comm, makeUcx(*comm)});
        fx->meshes.push_back(std::move(*m));
      }
    }
    return fx;
  }();
  return *f;
}

const std::vector<size_t> kCounts = {1, 7, 1000, 100003};

float exactValue(int rank, size_t i) { return float(((rank + 1) * (i % 13 + 3)) % 17 % 9); }

std::vector<float> randomValues(int seed, size_t n) {
  std::mt19937 gen(1234 + seed);
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

std::vector<float> exactValues(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = exactValue(rank, i);
  return v;
}

TEST(UcxCollectives, AllGatherVsMpiFloatAndBf16IncludingInPlace) {
  for (auto& [name, mpi_comm, comm] : fixture().pairs) {
    ASSERT_NE(comm, nullptr) << name;
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      const int n = comm->size(), r = comm->rank();
      std::vector<float> mine = randomValues(world().rank(), count);
      std::vector<float> out(n * count), want(n * count);
      ASSERT_OK(comm->allGather(mine.data(), out.data(), count, DType::kFloat32));
      MPI_Allgather(mine.data(), int(count), MPI_FLOAT, want.data(), int(count), MPI_FLOAT,
                    raw(*mpi_comm));
      EXPECT_EQ(out, want);
      std::vector<float> inplace(n * count, 0.0f);
      std::copy(mine.begin(), mine.end(), inplace.begin() + r * count);
      ASSERT_OK(comm->allGather(inplace.data() + r * count, inplace.data(), count, DType::kFloat32));
      EXPECT_EQ(inplace, want);
      std::vector<bf16> m16 = toBf16(mine), o16(n * count);
      ASSERT_OK(comm->allGather(m16.data(), o16.data(), count, DType::kBFloat16));
      for (size_t i = 0; i < o16.size(); ++i) ASSERT_EQ(o16[i].bits, hsdp::toBf16(want[i]).bits);
    }
  }
}

TEST(UcxCollectives, ReduceScatterSumExactFloatAndBf16VsMpi) {
  for (auto& [name, mpi_comm, comm] : fixture().pairs) {
    ASSERT_NE(comm, nullptr) << name;
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      const int n = comm->size();
      std::vector<float> in = exactValues(world().rank(), n * count), out(count, -1), want(count);
      ASSERT_OK(comm->reserveScratch(count * 4));
      ASSERT_OK(comm->reduceScatter(in.data(), out.data(), count, DType::kFloat32, RedOp::kSum));
      MPI_Reduce_scatter_block(in.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM,
                               raw(*mpi_comm));
      EXPECT_EQ(out, want);
      std::vector<bf16> in16 = toBf16(in), out16(count);
      ASSERT_OK(comm->reduceScatter(in16.data(), out16.data(), count, DType::kBFloat16, RedOp::kSum)
              );
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(toFloat(out16[i]), want[i]) << i;
    }
  }
}

TEST(UcxCollectives, ReduceScatterRandomSumAndAvgVsMpi) {
  for (auto& [name, mpi_comm, comm] : fixture().pairs) {
    ASSERT_NE(comm, nullptr) << name;
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      const int n = comm->size();
      std::vector<float> in = randomValues(world().rank(), n * count);
      std::vector<float> sum(count), avg(count), want(count);
      ASSERT_OK(comm->reduceScatter(in.data(), sum.data(), count, DType::kFloat32, RedOp::kSum));
      ASSERT_OK(comm->reduceScatter(in.data(), avg.data(), count, DType::kFloat32, RedOp::kAvg));
      MPI_Reduce_scatter_block(in.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM,
                               raw(*mpi_comm));
      for (size_t i = 0; i < count; ++i) {
        ASSERT_NEAR(sum[i], want[i], 1e-5f * n) << i;
        ASSERT_NEAR(avg[i], want[i] / n, 1e-5f) << i;
      }
      // bf16 average of exact values: within bf16 rounding of the float oracle.
      std::vector<float> ex = exactValues(world().rank(), n * count);
      std::vector<bf16> ex16 = toBf16(ex), avg16(count);
      ASSERT_OK(comm->reduceScatter(ex16.data(), avg16.data(), count, DType::kBFloat16, RedOp::kAvg)
              );
      MPI_Reduce_scatter_block(ex.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM,
                               raw(*mpi_comm));
      for (size_t i = 0; i < count; ++i)
        ASSERT_NEAR(toFloat(avg16[i]), want[i] / n, 8e-3f * std::max(1.0f, want[i] / n)) << i;
    }
  }
}

TEST(UcxCollectives, AllReduceSumAndAvgFloatAndBf16VsMpi) {
  for (auto& [name, mpi_comm, comm] : fixture().pairs) {
    ASSERT_NE(comm, nullptr) << name;
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      const int n = comm->size();
      std::vector<float> v = exactValues(world().rank(), count), want(count);
      MPI_Allreduce(v.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw(*mpi_comm));
      std::vector<bf16> v16 = toBf16(v), a16 = toBf16(v);
      std::vector<float> avg = v;
      ASSERT_OK(comm->allReduce(v.data(), count, DType::kFloat32, RedOp::kSum));
      EXPECT_EQ(v, want);
      ASSERT_OK(comm->allReduce(avg.data(), count, DType::kFloat32, RedOp::kAvg));
      for (size_t i = 0; i < count; ++i) ASSERT_NEAR(avg[i], want[i] / n, 1e-6f * want[i]) << i;
      ASSERT_OK(comm->allReduce(v16.data(), count, DType::kBFloat16, RedOp::kSum));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(toFloat(v16[i]), want[i]) << i;
      ASSERT_OK(comm->allReduce(a16.data(), count, DType::kBFloat16, RedOp::kAvg));
      for (size_t i = 0; i < count; ++i)
        ASSERT_NEAR(toFloat(a16[i]), want[i] / n, 8e-3f * std::max(1.0f, want[i] / n)) << i;
    }
  }
}

// Replicas all-reduce gradients and must stay bitwise in step: every rank gets the same bits.
TEST(UcxCollectives, AllReduceOfRandomValuesIsBitwiseIdenticalOnEveryRank) {
  for (auto& [name, mpi_comm, comm] : fixture().pairs) {
    for (size_t count : kCounts) {
      SCOPED_TRACE(strCat(name, " count=", count));
      std::vector<float> v = randomValues(world().rank() + 7, count);
      std::vector<float> want(count);
      MPI_Allreduce(v.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw(*mpi_comm));
      ASSERT_OK(comm->allReduce(v.data(), count, DType::kFloat32, RedOp::kAvg));
      std::vector<float> root = v;
      MPI_Bcast(root.data(), int(count), MPI_FLOAT, 0, raw(*mpi_comm));
      ASSERT_EQ(0, std::memcmp(root.data(), v.data(), count * 4)) << "differs from rank 0";
      for (size_t i = 0; i < count; ++i)
        ASSERT_NEAR(v[i], want[i] / comm->size(), 1e-5f) << i;
    }
  }
}

TEST(UcxCollectives, BroadcastFromLastRankAndBarrier) {
  for (auto& [name, mpi_comm, comm] : fixture().pairs) {
    SCOPED_TRACE(name);
    const int root = comm->size() - 1;
    std::vector<int64_t> v(1001, comm->rank());
    ASSERT_OK(comm->broadcast(v.data(), v.size(), DType::kInt64, root));
    for (int64_t x : v) ASSERT_EQ(x, root);
    std::vector<float> big = randomValues(world().rank(), 100003), want = big;
    ASSERT_OK(comm->broadcast(big.data(), big.size(), DType::kFloat32, 0));
    MPI_Bcast(want.data(), int(want.size()), MPI_FLOAT, 0, raw(*mpi_comm));
    EXPECT_EQ(big, want);
    EXPECT_OK(comm->barrier());
  }
}

TEST(UcxCollectives, BadArgumentsAreInvalidArgumentOnEveryRank) {
  Comm& c = *fixture().pairs[0].ucx;
  std::vector<int64_t> v(4);
  Status s = c.broadcast(v.data(), 1, DType::kInt64, c.size());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(strCat("root ", c.size())), std::string::npos) << s.message();
  std::vector<int32_t> ints(c.size());
  s = c.allReduce(ints.data(), ints.size(), DType::kInt32, RedOp::kAvg);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("avg of int32"), std::string::npos) << s.message();
  auto w = c.ireduceScatter(ints.data(), ints.data(), 1, DType::kInt32, RedOp::kAvg);
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  // The communicator is still usable (nothing was started).
  EXPECT_OK(c.barrier());
}

TEST(UcxCollectives, IntegerSumsMatchMpi) {
  for (auto& [name, mpi_comm, comm] : fixture().pairs) {
    SCOPED_TRACE(name);
    const int n = comm->size();
    std::vector<int64_t> v(1000), want(1000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = (int64_t(world().rank()) << 33) + int64_t(i);
    MPI_Allreduce(v.data(), want.data(), 1000, MPI_INT64_T, MPI_SUM, raw(*mpi_comm));
    ASSERT_OK(comm->allReduce(v.data(), v.size(), DType::kInt64, RedOp::kSum));
    EXPECT_EQ(v, want);
    std::vector<int32_t> in(n * 5), out(5), ref(5);
    for (size_t i = 0; i < in.size(); ++i) in[i] = world().rank() * 100 + int(i);
    ASSERT_OK(comm->reduceScatter(in.data(), out.data(), 5, DType::kInt32, RedOp::kSum));
    MPI_Reduce_scatter_block(in.data(), ref.data(), 5, MPI_INT32_T, MPI_SUM, raw(*mpi_comm));
    EXPECT_EQ(out, ref);
  }
}

// ---- nonblocking -------------------------------------------------------------------------------

// One outstanding collective and the oracle it is checked against afterwards.
struct Outstanding {
  std::string what;
  WorkHandle work;
  std::vector<float> in, out, want;
  std::vector<bf16> in16, out16;
  bool is_bf16 = false;
};

// Starts, on `comm`, an all-gather, a reduce-scatter (bf16, sum) and an all-reduce (avg) at every
// count, 12 handles in all, each with its own buffers.
std::vector<Outstanding> startMany(Comm& comm, Comm& mpi_comm, int salt) {
  std::vector<Outstanding> ops;
  const int n = comm.size(), me = world().rank() + salt;
  for (size_t count : kCounts) {
    {
      Outstanding o;
      o.what = strCat("iallGather count=", count);
      o.in = randomValues(me, count);
      o.out.assign(n * count, -1);
      o.want.resize(n * count);
      MPI_Allgather(o.in.data(), int(count), MPI_FLOAT, o.want.data(), int(count), MPI_FLOAT,
                    raw(mpi_comm));
      auto w = comm.iallGather(o.in.data(), o.out.data(), count, DType::kFloat32);
      EXPECT_TRUE(w.ok()) << w.status().toString();
      o.work = std::move(*w);
      ops.push_back(std::move(o));
    }
    {
      Outstanding o;
      o.what = strCat("ireduceScatter bf16 count=", count);
      o.is_bf16 = true;
      o.in = exactValues(me, n * count);
      o.in16 = toBf16(o.in);
      o.out16.resize(count);
      o.want.resize(count);
      MPI_Reduce_scatter_block(o.in.data(), o.want.data(), int(count), MPI_FLOAT, MPI_SUM,
                               raw(mpi_comm));
      auto w = comm.ireduceScatter(o.in16.data(), o.out16.data(), count, DType::kBFloat16,
                                   RedOp::kSum);
      EXPECT_TRUE(w.ok()) << w.status().toString();
      o.work = std::move(*w);
      ops.push_back(std::move(o));
    }
    {
      Outstanding o;
      o.what = strCat("iallReduce avg count=", count);
      o.out = exactValues(me, count);
      o.want.resize(count);
      MPI_Allreduce(o.out.data(), o.want.data(), int(count), MPI_FLOAT, MPI_SUM, raw(mpi_comm));
      for (float& x : o.want) x /= n;
      auto w = comm.iallReduce(o.out.data(), count, DType::kFloat32, RedOp::kAvg);
      EXPECT_TRUE(w.ok()) << w.status().toString();
      o.work = std::move(*w);
      ops.push_back(std::move(o));
    }
  }
  return ops;
}

void check(const Outstanding& o) {
  SCOPED_TRACE(o.what);
  if (o.is_bf16) {
    for (size_t i = 0; i < o.want.size(); ++i) ASSERT_EQ(toFloat(o.out16[i]), o.want[i]) << i;
  } else if (o.what.rfind("iallReduce", 0) == 0) {
    for (size_t i = 0; i < o.want.size(); ++i)
      ASSERT_NEAR(o.out[i], o.want[i], 1e-6f * std::max(1.0f, o.want[i])) << i;
  } else {
    EXPECT_EQ(o.out, o.want);
  }
}

// Completes the handles in an order that differs from rank to rank (a shuffle seeded by the
// world rank), half by polling test(), half by wait(): progress must never depend on the order.
void completeShuffled(std::vector<Outstanding>& ops, int seed) {
  std::vector<size_t> order(ops.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 gen(seed);
  std::shuffle(order.begin(), order.end(), gen);
  for (size_t k = 0; k < order.size(); ++k) {
    Outstanding& o = ops[order[k]];
    SCOPED_TRACE(o.what);
    if (k % 2 == 0) {
      for (;;) {
        auto done = o.work->test();
        ASSERT_TRUE(done.ok()) << done.status().toString();
        if (*done) break;
      }
      EXPECT_OK(o.work->wait());  // after completion, returns the same result at once
    } else {
      Status s = o.work->wait();
      ASSERT_TRUE(s.ok()) << s.toString();
    }
    check(o);
  }
}

TEST(UcxCollectives, ManyOutstandingHandlesCompletedOutOfOrder) {
  for (auto& [name, mpi_comm, comm] : fixture().pairs) {
    SCOPED_TRACE(name);
    std::vector<Outstanding> ops = startMany(*comm, *mpi_comm, 0);
    completeShuffled(ops, 77 + world().rank());
  }
}

// A group (Comm::igroup's default: every operation started in order, one Work for all) on UCX,
// completed through test() only, so the group's Work must progress every UCX operation in it.
TEST(UcxCollectives, GroupOfMixedOperationsMatchesMpi) {
  for (auto& [name, mpi_comm, comm] : fixture().pairs) {
    SCOPED_TRACE(name);
    const int n = comm->size(), w = world().rank();
    const size_t c1 = 5, c2 = 70001;
    std::vector<float> ag_in = randomValues(w, c2), ag_out(n * c2);
    std::vector<float> rs_in = exactValues(w, n * c1), rs_out(c1);
    std::vector<float> ar = exactValues(w + 3, c2);
    const std::vector<float> ar_in = ar;
    std::vector<CollectiveOp> ops = {
        CollectiveOp::allGather(ag_in.data(), ag_out.data(), c2, DType::kFloat32),
        CollectiveOp::reduceScatter(rs_in.data(), rs_out.data(), c1, DType::kFloat32, RedOp::kSum),
        CollectiveOp::allReduce(ar.data(), c2, DType::kFloat32, RedOp::kSum),
    };
    auto work = comm->igroup(ops);
    ASSERT_OK(work.status());
    for (bool done = false; !done;) {
      auto t = (*work)->test();
      ASSERT_OK(t.status());
      done = *t;
    }
    std::vector<float> want_ag(n * c2), want_rs(c1), want_ar(c2);
    MPI_Allgather(ag_in.data(), int(c2), MPI_FLOAT, want_ag.data(), int(c2), MPI_FLOAT,
                  raw(*mpi_comm));
    MPI_Reduce_scatter_block(rs_in.data(), want_rs.data(), int(c1), MPI_FLOAT, MPI_SUM,
                             raw(*mpi_comm));
    MPI_Allreduce(ar_in.data(), want_ar.data(), int(c2), MPI_FLOAT, MPI_SUM, raw(*mpi_comm));
    EXPECT_EQ(ag_out, want_ag);
    EXPECT_EQ(rs_out, want_rs);
    EXPECT_EQ(ar, want_ar);
  }
}

// Two communicators with handles in flight at once, waited for in opposite orders on even and
// odd ranks: one shared worker advances both.
TEST(UcxCollectives, OutstandingHandlesOnTwoCommunicatorsCompleteInAnyOrder) {
  Pair& a = fixture().pairs[0];
  Pair& b = fixture().pairs.back();
  std::vector<Outstanding> on_a = startMany(*a.ucx, *a.mpi, 1);
  std::vector<Outstanding> on_b = startMany(*b.ucx, *b.mpi, 2);
  if (world().rank() % 2 == 0) {
    completeShuffled(on_a, world().rank());
    completeShuffled(on_b, world().rank() + 1);
  } else {
    completeShuffled(on_b, world().rank());
    completeShuffled(on_a, world().rank() + 1);
  }
}

// The hierarchical schedules with the inter level on UCX and the intra level on MPI (the
// configuration HSDP_TRANSPORT_INTER=ucx gives the engine), unpipelined and pipelined, equal the
// flat collective over the shard group (MPI's own). The pipelined schedules poll their UCX
// sub-operations with test(), which must progress them.
TEST(UcxCollectives, HierarchicalWithUcxInterLevelMatchesFlatMpi) {
  for (auto& mesh : fixture().meshes) {
    Comm* inter = nullptr;
    for (auto& p : fixture().pairs)
      if (p.mpi == &mesh->interShard()) inter = p.ucx.get();
    ASSERT_NE(inter, nullptr);
    Comm& group = mesh->shardGroup();
    const int S = group.size();
    for (int chunks : {1, 3}) {
      HierarchicalCollectives hier(mesh->intraShard(), *inter, HierOptions{chunks});
      ASSERT_EQ(hier.shardIndex(), group.rank());
      for (size_t count : kCounts) {
        SCOPED_TRACE(strCat(mesh->describe(), " chunks=", chunks, " count=", count));
        ASSERT_OK(hier.reserve(count, DType::kFloat32));
        std::vector<float> shard = randomValues(world().rank(), count);
        std::vector<float> full(S * count), want(S * count);
        ASSERT_OK(hier.allGather(shard.data(), full.data(), count, DType::kFloat32));
        MPI_Allgather(shard.data(), int(count), MPI_FLOAT, want.data(), int(count), MPI_FLOAT,
                      raw(group));
        EXPECT_EQ(full, want);
        std::vector<float> in = exactValues(world().rank(), S * count), out(count), ref(count);
        ASSERT_OK(hier.reduceScatter(in.data(), out.data(), count, DType::kFloat32, RedOp::kSum));
        MPI_Reduce_scatter_block(in.data(), ref.data(), int(count), MPI_FLOAT, MPI_SUM,
                                 raw(group));
        EXPECT_EQ(out, ref);
      }
    }
  }
}

// ---- communicators, scratch, registration, selection -------------------------------------------

TEST(UcxComm, SplitBuildsUcxCommunicatorsInTheBootstrapsOrder) {
  Comm& u = *fixture().pairs[0].ucx;
  const int color = world().rank() % 2, key = -world().rank();  // reversed order
  auto sub = u.split(color, key);
  ASSERT_TRUE(sub.ok()) << sub.status().toString();
  auto ref = world().split(color, key);
  ASSERT_TRUE(ref.ok());
  EXPECT_STREQ((*sub)->transportName(), "ucx");
  EXPECT_EQ((*sub)->size(), (*ref)->size());
  EXPECT_EQ((*sub)->rank(), (*ref)->rank());
  std::vector<int64_t> got((*sub)->size()), want((*sub)->size());
  int64_t me = world().rank();
  ASSERT_OK((*sub)->allGather(&me, got.data(), 1, DType::kInt64));
  ASSERT_OK((*ref)->allGather(&me, want.data(), 1, DType::kInt64));
  EXPECT_EQ(got, want);
  auto host = u.splitByHost();
  ASSERT_TRUE(host.ok()) << host.status().toString();
  EXPECT_STREQ((*host)->transportName(), "ucx");
  EXPECT_OK((*host)->barrier());
}

TEST(UcxComm, ScratchIsReservedOnceAndReusedAndRegisteredMemoryWorks) {
  auto c = ucx::createUcxComm(world());
  ASSERT_TRUE(c.ok()) << c.status().toString();
  Comm& u = **c;
  const int n = u.size();
  ASSERT_OK(u.reserveScratch(100003 * 4));
  const size_t reserved = u.scratchBytes();
  if (n > 1) EXPECT_GE(reserved, 2u * 100003 * 4);
  std::vector<float> in = exactValues(world().rank(), n * 100003), out(100003);
  for (int i = 0; i < 3; ++i)
    ASSERT_OK(u.reduceScatter(in.data(), out.data(), 100003, DType::kFloat32, RedOp::kSum));
  EXPECT_EQ(u.scratchBytes(), reserved) << "blocking collectives reuse one slot";

  auto& uc = dynamic_cast<ucx::UcxComm&>(u);
  std::vector<float> gathered(n * 1000);
  std::vector<float> mine = randomValues(world().rank(), 1000);
  ASSERT_OK(uc.registerMemory(gathered.data(), gathered.size() * 4));
  ASSERT_OK(uc.registerMemory(mine.data(), mine.size() * 4));
  ASSERT_OK(u.allGather(mine.data(), gathered.data(), 1000, DType::kFloat32));
  for (int q = 0; q < n; ++q) EXPECT_EQ(gathered[q * 1000], randomValues(q, 1000)[0]);
  EXPECT_OK(uc.deregisterMemory(gathered.data()));
  EXPECT_OK(uc.deregisterMemory(mine.data()));
  EXPECT_EQ(uc.deregisterMemory(mine.data()).code(), StatusCode::kNotFound);
}

TEST(UcxComm, TransportSelectionPerLevel) {
  for (auto [var, level] : {std::pair{"HSDP_TRANSPORT_INTER", MeshLevel::kInter},
                            std::pair{"HSDP_TRANSPORT_INTRA", MeshLevel::kIntra}}) {
    SCOPED_TRACE(var);
    setenv(var, "ucx", 1);
    auto c = selectLevelTransport(level, world().split(0, world().rank()).value());
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_STREQ((*c)->transportName(), "ucx");
    EXPECT_EQ((*c)->rank(), world().rank());
    EXPECT_OK((*c)->barrier());
    setenv(var, "mpi", 1);
    auto m = selectLevelTransport(level, world().split(0, world().rank()).value());
    ASSERT_TRUE(m.ok());
    EXPECT_STREQ((*m)->transportName(), "mpi");
    setenv(var, "carrier-pigeon", 1);
    auto bad = selectLevelTransport(level, world().split(0, world().rank()).value());
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find(strCat(var, "='carrier-pigeon'")), std::string::npos);
    // The registry's names, sorted: mpi and ucx in every build with UCX, nccl with CUDA too.
    const std::string names = availableTransports();
    EXPECT_EQ(names.find("mpi, "), 0u) << names;
    EXPECT_NE(names.find("ucx"), std::string::npos) << names;
    EXPECT_NE(bad.status().message().find(strCat("available: ", names, ")")), std::string::npos)
        << bad.status().message();
    unsetenv(var);
  }
}

// Ranks that disagree on a count get an error naming the sizes rather than corrupted data. With
// two ranks both fail in the same step, so neither waits for the other.
TEST(UcxComm, MismatchedCountsAreReported) {
  if (world().size() != 2) GTEST_SKIP() << "needs exactly two ranks";
  auto c = ucx::createUcxComm(world());
  ASSERT_TRUE(c.ok()) << c.status().toString();
  const size_t count = world().rank() == 0 ? 2 : 1;
  std::vector<float> mine(count, 1.0f), out(2 * count);
  Status s = (*c)->allGather(mine.data(), out.data(), count, DType::kFloat32);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ranks started different collectives or counts"), std::string::npos)
      << s.toString();
  // Rank 0 receives 4 bytes where it expects 8; rank 1's 4-byte buffer is too small for 8.
  const char* want = world().rank() == 0 ? "has 4 bytes, expected 8" : "Message truncated";
  EXPECT_NE(s.message().find(want), std::string::npos) << s.toString();
  // Every message was consumed: the communicator keeps working.
  EXPECT_OK((*c)->barrier());
}

TEST(UcxComm, OptionsFromEnvironment) {
  unsetenv("HSDP_UCX_SMALL_BYTES");
  EXPECT_EQ(ucx::UcxOptions::fromEnv()->small_bytes, ucx::UcxOptions().small_bytes);
  setenv("HSDP_UCX_SMALL_BYTES", "4096", 1);
  EXPECT_EQ(ucx::UcxOptions::fromEnv()->small_bytes, 4096u);
  setenv("HSDP_UCX_SMALL_BYTES", "-1", 1);
  auto bad = ucx::UcxOptions::fromEnv();
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("HSDP_UCX_SMALL_BYTES=-1"), std::string::npos)
      << bad.status().message();
  unsetenv("HSDP_UCX_SMALL_BYTES");
}

}  // namespace
}  // namespace hsdp
