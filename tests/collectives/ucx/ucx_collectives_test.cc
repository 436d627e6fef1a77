// What is particular to the UCX transport, beyond the Comm contract every transport passes
// (tests/collectives/conformance/): handles on two UCX communicators that share one worker,
// split order, scratch and registered memory, per-level transport selection, mismatch reports
// and the options read from the environment. Oracle: MPI's own collectives.
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
#include "tests/common/status_assert.h"

namespace hsdp {
namespace {

using testing::world;

MPI_Comm raw(Comm& c) { return dynamic_cast<mpi::MpiComm&>(c).raw(); }

struct Pair {
  std::string name;
  Comm* mpi;                  // the oracle's communicator
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
  std::unique_ptr<Comm> half;  // MPI: the even and odd ranks in reversed order
  std::vector<Pair> pairs;     // UCX over the world and over `half`
};

std::unique_ptr<Fixture> g_fixture;

Fixture& fixture() {
  if (!g_fixture) {
    g_fixture = std::make_unique<Fixture>();
    Fixture& fx = *g_fixture;
    fx.pairs.push_back({"world", &world(), makeUcx(world())});
    auto h = world().split(world().rank() % 2, -world().rank());
    EXPECT_TRUE(h.ok()) << h.status().toString();
    fx.half = std::move(*h);
    fx.pairs.push_back({"half/reversed", fx.half.get(), makeUcx(*fx.half)});
  }
  return *g_fixture;
}

// The communicators go on every rank at the same point, before MPI_Finalize (not in a static
// destructor, after UCX's and MPI's own teardown).
class FixtureTeardown : public ::testing::Environment {
 public:
  void TearDown() override { g_fixture.reset(); }
};
const auto* const kTeardown = ::testing::AddGlobalTestEnvironment(new FixtureTeardown);

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
      auto w =
          comm.ireduceScatter(o.in16.data(), o.out16.data(), count, DType::kBFloat16, RedOp::kSum);
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
