// Checkpoints under mpirun (8 = 2x4 and 6 = 2x3 ranks): resume exactness against training
// straight through (the saved state of both compared byte for byte), loading into every other
// mesh and mode of the world (parameters and moments identical through diffCheckpoints and
// gatherFullParameters), keep_last, `latest` and the user blob. The same binary's failures,
// exports and reader: checkpoint_export_test.cc; their fixture: checkpoint_fixture.h.
#include "hsdp/checkpoint.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/checkpoint/checkpoint_fixture.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace ckpttest {

std::string sharedTempDir(Comm& world) {
  char buf[256] = {};
  if (world.rank() == 0) {
    const char* base = std::getenv("TMPDIR");
    std::snprintf(buf, sizeof buf, "%s/hsdp-ckpt-XXXXXX", base ? base : "/tmp");
    if (mkdtemp(buf) == nullptr) buf[0] = 0;
  }
  if (!world.broadcast(buf, sizeof buf, DType::kUInt8, 0).ok()) return {};
  return buf;
}

}  // namespace ckpttest

namespace {

using namespace ckpttest;

// N + M steps straight vs N steps, save, a new model (other initial values) that loads and
// trains M: the two final checkpoints hold the same bytes (parameters, both moments, step).
TEST_F(Checkpoint, ResumeIsBitwise) {
  const int rank = world().rank();
  const int N = 3, M = 2;
  const Case cases[] = {
      {"zero3.hpz", ShardMode::kZero3, 0, 0, true},
      {"zero3.offload.clip.accum2.async", ShardMode::kZero3, 0, 1, false, DType::kFloat32,
       DType::kFloat32, 2, 0.05f, true, true},
      {"zero2.bf16both", ShardMode::kZero2, 0, 0, false, DType::kBFloat16, DType::kBFloat16},
      {"zero2.i1.offload.bf16params.async", ShardMode::kZero2, 1, 0, false, DType::kBFloat16,
       DType::kFloat32, 1, 0, true, true},
      {"zero1.accum3.clip", ShardMode::kZero1, 0, 1, false, DType::kFloat32, DType::kFloat32, 3,
       0.05f},
      {"zero1.i1.j1.async", ShardMode::kZero1, 1, 1, false, DType::kFloat32, DType::kFloat32, 1, 0,
       false, true},
      {"none.accum2.clip", ShardMode::kNone, 1, 1, false, DType::kFloat32, DType::kFloat32, 2,
       0.05f},
      {"none.async", ShardMode::kNone, 1, 1, false, DType::kFloat32, DType::kFloat32, 1, 0, false,
       true},
      {"zero3.hpz.bf16both.accum2.clip.async", ShardMode::kZero3, 0, 0, true, DType::kBFloat16,
       DType::kBFloat16, 2, 0.05f, false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto m = mesh(c.intra, c.inter);
    ASSERT_TRUE(m);
    const std::string root = dir_ + "/" + c.name;
    {  // straight through
      auto a = buildModel(*m, config(c), 1.0f);
      ASSERT_TRUE(a.ok()) << a.status().toString();
      for (int s = 0; s < N + M; ++s) ASSERT_TRUE(trainStep(**a, rank, s, c.accum).ok());
      ASSERT_TRUE((*a)->save(root + "/a", {.name = "final"}).ok());
    }
    {  // N steps, save (async: two more steps while it is written)
      auto b = buildModel(*m, config(c), 1.0f);
      ASSERT_TRUE(b.ok());
      for (int s = 0; s < N; ++s) ASSERT_TRUE(trainStep(**b, rank, s, c.accum).ok());
      if (c.async) {
        ASSERT_TRUE((*b)->saveAsync(root + "/b").ok());
        for (int s = N; s < N + 2; ++s) ASSERT_TRUE(trainStep(**b, rank, s, c.accum).ok());
        auto r = (*b)->waitForSave();
        ASSERT_TRUE(r.ok()) << r.status().toString();
        EXPECT_EQ(r->step, N);
      } else {
        auto r = (*b)->save(root + "/b");
        ASSERT_TRUE(r.ok()) << r.status().toString();
      }
    }
    {  // a new model with other values loads and trains M
      auto cm = buildModel(*m, config(c), 7.0f);
      ASSERT_TRUE(cm.ok());
      auto r = (*cm)->load(root + "/b");
      ASSERT_TRUE(r.ok()) << r.status().toString();
      EXPECT_EQ(r->step, N);
      EXPECT_EQ((*cm)->stepCount(), N);
      for (int s = N; s < N + M; ++s) ASSERT_TRUE(trainStep(**cm, rank, s, c.accum).ok());
      ASSERT_TRUE((*cm)->save(root + "/c", {.name = "final"}).ok());
    }
    // Same mesh, same state: every rank's data file holds the same bytes.
    char name[32];
    std::snprintf(name, sizeof name, "data-%05d.bin", rank);
    const std::string a = readFile(root + "/a/final/" + name);
    const std::string b = readFile(root + "/c/final/" + name);
    EXPECT_GT(a.size(), 0u);
    EXPECT_TRUE(a == b) << name << " differs between straight and resumed training";
    if (rank == 0) {
      auto d = diffCheckpoints(root + "/a/final", root + "/c/final");
      ASSERT_TRUE(d.ok()) << d.status().toString();
      EXPECT_TRUE(d->identical());
      EXPECT_EQ(d->step_a, N + M);
    }
  }
}

// saveAsync returns before its copier thread has read the host state: setParameter at once
// after it (and with offload, a step) must wait for the copy. The checkpoint holds the values of
// the save's step, the model the new ones. A few MiB per rank, so that the copy is still going
// when setParameter comes; without the wait the first check fails.
TEST_F(Checkpoint, AsyncSaveHoldsTheStateOfItsStep) {
  const Case cases[] = {
      {"zero3", ShardMode::kZero3, 0, 0},
      {"zero3.offload", ShardMode::kZero3, 0, 0, false, DType::kFloat32, DType::kFloat32, 1, 0,
       true},
  };
  const size_t numel = size_t{1} << 20 << (world().size() > 4 ? 3 : 2);
  std::vector<float> before(numel), after(numel);
  for (size_t i = 0; i < numel; ++i) {
    before[i] = 0.001f * float(i % 1009);
    after[i] = -0.5f - 0.002f * float(i % 997);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto m = mesh(c.intra, c.inter);
    ASSERT_TRUE(m);
    const std::string root = dir_ + "/held-" + c.name;
    auto make = [&]() -> std::unique_ptr<ShardedModel> {
      auto model = ShardedModel::create(*m, config(c));
      EXPECT_TRUE(model.ok());
      if (!model.ok()) return nullptr;
      EXPECT_TRUE((*model)->addUnit("big", {{"w", {static_cast<int64_t>(numel)}}}).ok());
      EXPECT_TRUE((*model)->finalize().ok());
      return std::move(*model);
    };
    auto a = make();
    ASSERT_TRUE(a);
    ASSERT_TRUE(a->setParameter(0, "w", before.data(), numel).ok());
    ASSERT_TRUE(a->saveAsync(root, {.name = "held"}).ok());
    ASSERT_TRUE(a->setParameter(0, "w", after.data(), numel).ok());
    auto r = a->waitForSave();
    ASSERT_TRUE(r.ok()) << r.status().toString();
    std::vector<float> got;
    ASSERT_TRUE(a->gatherFullParameters(0, &got).ok());
    EXPECT_TRUE(got == after) << "setParameter after saveAsync did not take effect";
    auto b = make();
    ASSERT_TRUE(b);
    auto l = b->load(root + "/held");
    ASSERT_TRUE(l.ok()) << l.status().toString();
    ASSERT_TRUE(b->gatherFullParameters(0, &got).ok());
    EXPECT_TRUE(got == before) << "the checkpoint holds values set after saveAsync";
  }
}

// Saved on the full shard group (zero3), loaded into every other mesh and mode of this world:
// the same parameters (gatherFullParameters) and, saved again, the same checkpoint contents.
TEST_F(Checkpoint, LoadsIntoEveryMeshAndMode) {
  const int rank = world().rank();
  auto m0 = mesh(0, 0);
  ASSERT_TRUE(m0);
  Case base{"base", ShardMode::kZero3, 0, 0};
  std::vector<std::vector<float>> want(3);
  {
    auto a = buildModel(*m0, config(base), 2.0f);
    ASSERT_TRUE(a.ok());
    for (int s = 0; s < 2; ++s) ASSERT_TRUE(trainStep(**a, rank, s, 1).ok());
    SaveOptions so;
    so.user["data_position"] = "1234";
    so.user["rng"] = std::string("\0\1\2\3", 4);
    ASSERT_TRUE((*a)->save(dir_ + "/src", so).ok());
    for (int u = 0; u < 3; ++u) ASSERT_TRUE((*a)->gatherFullParameters(u, &want[u]).ok());
  }
  int n = 0;
  for (int I = 1; I <= layout_.ranks_per_node; ++I) {
    if (layout_.ranks_per_node % I) continue;
    for (int J = 1; J <= layout_.num_nodes; ++J) {
      if (layout_.num_nodes % J) continue;
      for (ShardMode mode :
           {ShardMode::kNone, ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3}) {
        if (mode == ShardMode::kNone && I * J != 1) continue;
        Case c{"target", mode, I, J};
        c.hpz = mode == ShardMode::kZero3 && I > 1 && J > 1;
        c.offload = mode == ShardMode::kZero2 && (I + J) % 2 == 1;
        SCOPED_TRACE(strCat(shardModeName(mode), " I", I, " J", J, c.hpz ? " hpz" : "",
                            c.offload ? " offload" : ""));
        auto m = mesh(I, J);
        ASSERT_TRUE(m);
        auto b = buildModel(*m, config(c), 5.0f);
        ASSERT_TRUE(b.ok());
        auto r = (*b)->load(dir_ + "/src");
        ASSERT_TRUE(r.ok()) << r.status().toString();
        EXPECT_EQ(r->user["data_position"], "1234");
        EXPECT_EQ(r->user["rng"], std::string("\0\1\2\3", 4));
        for (int u = 0; u < 3; ++u) {
          std::vector<float> got;
          ASSERT_TRUE((*b)->gatherFullParameters(u, &got).ok());
          EXPECT_TRUE(got == want[u]) << "unit " << u;
        }
        const std::string again = strCat(dir_, "/again", n++);
        ASSERT_TRUE((*b)->save(again).ok());
        if (rank == 0) {
          auto d = diffCheckpoints(dir_ + "/src", again);
          ASSERT_TRUE(d.ok()) << d.status().toString();
          EXPECT_TRUE(d->identical());
        }
        // And it trains on from there like the original would have.
        ASSERT_TRUE(trainStep(**b, rank, 2, 1).ok());
      }
    }
  }
}

// keep_last keeps the newest K; `latest` names the newest; a root loads through it.
TEST_F(Checkpoint, KeepLastAndLatest) {
  const int rank = world().rank();
  auto m = mesh(0, 1);
  ASSERT_TRUE(m);
  auto a = buildModel(*m, config({"k", ShardMode::kZero2, 0, 1}), 3.0f);
  ASSERT_TRUE(a.ok());
  for (int s = 0; s < 4; ++s) {
    ASSERT_TRUE(trainStep(**a, rank, s, 1).ok());
    auto r = (*a)->save(dir_ + "/root", {.keep_last = 2});
    ASSERT_TRUE(r.ok()) << r.status().toString();
    EXPECT_EQ(r->step, s + 1);
  }
  (void)world().barrier();
  std::vector<std::string> names;
  for (auto& e : std::filesystem::directory_iterator(dir_ + "/root"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000003", "step-00000004"}));
  EXPECT_EQ(readFile(dir_ + "/root/latest"), "step-00000004\n");
  auto b = buildModel(*m, config({"k", ShardMode::kZero3, 0, 0}), 4.0f);
  ASSERT_TRUE(b.ok());
  auto r = (*b)->load(dir_ + "/root");
  ASSERT_TRUE(r.ok()) << r.status().toString();
  EXPECT_EQ(r->step, 4);
  EXPECT_EQ(r->dir, dir_ + "/root/step-00000004");
}

}  // namespace
}  // namespace hsdp
