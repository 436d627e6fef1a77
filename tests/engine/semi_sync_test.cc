// Semi-synchronous replicas in the library (EngineConfig::replica_sync, docs/semi_sync.md), on
// every mesh of the job, against closed forms (train_mlp --check replays whole runs against the
// Eigen reference: the semi_sync.* tests):
//  - the settings' errors: a Status naming the field and its value, or the policy (no replicas,
//    fragments > units; checkpoints: a mid-period resume, and other settings refused);
//  - one inner step and a sync (H = 1) with an Adam probe (beta 0, lr 1, eps 1e6: p -= g/(g+1e6)),
//    each replica's gradient the mean of its own ranks' only: local_sgd gives the mean of the
//    replicas' parameters, diloco the outer Nesterov step on the mean outer gradient;
//  - H = 2: no sync after the first step (each replica keeps its own parameters);
//  - streaming's delay tau = 1 (H = 2): the all-reduce started after step 2 is not applied
//    until after step 3, which takes the synced value (alpha = 0); a save or load inside the
//    window is refused naming the step, one after it resumes bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "hsdp/checkpoint_offline.h"
#include "hsdp/sharded_model.h"
#include "tests/common/for_each_mesh.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::forEachMesh;
using testing::world;

constexpr size_t kN = 53;  // a size no shard count here divides

float rankGrad(int rank, size_t i) { return float(rank + 1) * float(i % 7 + 1); }
float initial(size_t i) { return 0.01f * float(i % 13) - 0.05f; }

EngineConfig probe(ShardMode mode, ReplicaPolicy policy, int h) {
  EngineConfig cfg;
  cfg.mode = mode;
  cfg.adam.kind = OptimizerKind::kAdam;
  cfg.adam.lr = 1.0f;
  cfg.adam.beta1 = 0.0f;
  cfg.adam.beta2 = 0.0f;
  cfg.adam.eps = 1e6f;
  cfg.adam.weight_decay = 0.0f;
  cfg.replica_sync.policy = policy;
  cfg.replica_sync.sync_every = h;
  cfg.replica_sync.outer_lr = 0.5f;
  cfg.replica_sync.outer_momentum = 0.25f;
  return cfg;
}

// The world ranks of every replica (replica_rank of each rank, gathered).
std::vector<std::vector<int>> replicaRanks(const Mesh& mesh) {
  int me = mesh.coords().replica_rank;
  std::vector<int> all(world().size());
  EXPECT_TRUE(world().allGather(&me, all.data(), 1, DType::kInt32).ok());
  std::vector<std::vector<int>> out(mesh.shape().replicas());
  for (int q = 0; q < world().size(); ++q) out[all[q]].push_back(q);
  return out;
}

// Replica r's parameter after one probe step: initial - g_r/(g_r + 1e6), g_r its ranks' mean.
double afterInner(const std::vector<int>& ranks, size_t i) {
  double g = 0;
  for (int q : ranks) g += rankGrad(q, i);
  g /= double(ranks.size());
  return initial(i) - g / (g + 1e6);
}

TEST(SemiSync, SettingsAreCheckedByName) {
  forEachMesh([](const Mesh& mesh) {
    const int replicas = mesh.shape().replicas();
    EngineConfig cfg = probe(ShardMode::kZero3, ReplicaPolicy::kDiloco, 2);
    if (replicas == 1) {
      auto m = ShardedModel::create(mesh, cfg);
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("replica policy diloco needs replica groups"),
                std::string::npos)
          << m.status().toString();
      return;
    }
    auto expectError = [&](EngineConfig c, const std::string& want) {
      auto m = ShardedModel::create(mesh, c);
      ASSERT_FALSE(m.ok()) << want;
      EXPECT_NE(m.status().message().find(want), std::string::npos) << m.status().toString();
    };
    EngineConfig c = cfg;
    c.replica_sync.sync_every = 0;
    expectError(c, "replica_sync.sync_every=0 must be >= 1");
    c = cfg;
    c.replica_sync.outer_lr = NAN;
    expectError(c, "replica_sync.outer_lr=nan must be finite and > 0");
    c.replica_sync.outer_lr = -1;
    expectError(c, "replica_sync.outer_lr=-1 must be finite and > 0");
    c = cfg;
    c.replica_sync.outer_momentum = 1;
    expectError(c, "replica_sync.outer_momentum=1 must be in [0, 1)");
    c = cfg;
    c.replica_sync.sync_delay = 2;  // tau < H: a fragment lands before it is sent again
    expectError(c, "replica_sync.sync_delay=2 must be in [0, sync_every=2)");
    c.replica_sync.sync_delay = -1;
    expectError(c, "replica_sync.sync_delay=-1 must be in [0, sync_every=2)");
    c = cfg;
    c.replica_sync.policy = ReplicaPolicy::kSync;
    c.replica_sync.sync_delay = 1;
    expectError(c, "replica_sync.sync_delay=1 needs replica policy local_sgd or diloco");
    // F > units: at finalize(), when the units are known.
    c = cfg;
    c.replica_sync.fragments = 3;
    auto m = ShardedModel::create(mesh, c);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    ASSERT_TRUE((*m)->addUnit("a", {{"w", {kN}}}).ok());
    ASSERT_TRUE((*m)->addUnit("b", {{"w", {kN}}}).ok());
    Status f = (*m)->finalize();
    EXPECT_NE(f.message().find("replica_sync.fragments=3 exceeds the model's 2 units"),
              std::string::npos)
        << f.toString();
  });
}

// One probe step: every rank's own gradient (rankGrad), reduced in its shard group, stepped.
void probeStep(ShardedModel& m) {
  ASSERT_TRUE(m.unshard(0).ok());
  ASSERT_TRUE(m.waitForUnshard(0).ok());
  auto g = m.grad(0, "w");
  ASSERT_TRUE(g.ok()) << g.status().toString();
  for (size_t i = 0; i < kN; ++i) g->data[i] = rankGrad(world().rank(), i);
  ASSERT_TRUE(m.reduceGrad(0).ok());
  ASSERT_TRUE(m.reshard(0).ok());
  ASSERT_TRUE(m.step().ok());
}

// One step of every replica on its own ranks' gradients, then (H = 1) the sync; with H = 2 none.
void oneStep(const Mesh& mesh, ShardMode mode, ReplicaPolicy policy, int h) {
  SCOPED_TRACE(strCat(shardModeName(mode), " ", replicaPolicyName(policy), " H=", h));
  auto model = ShardedModel::create(mesh, probe(mode, policy, h));
  ASSERT_TRUE(model.ok()) << model.status().toString();
  ShardedModel& m = **model;
  ASSERT_TRUE(m.addUnit("u", {{"w", {kN}}}).ok());
  ASSERT_TRUE(m.finalize().ok());
  std::vector<float> init(kN);
  for (size_t i = 0; i < kN; ++i) init[i] = initial(i);
  ASSERT_TRUE(m.setParameter(0, "w", init.data(), init.size()).ok());
  probeStep(m);
  std::vector<float> full;
  ASSERT_TRUE(m.gatherFullParameters(0, &full).ok());
  const auto ranks = replicaRanks(mesh);
  const int me = mesh.coords().replica_rank;
  const double lr = 0.5, mu = 0.25;
  for (size_t i = 0; i < kN; ++i) {
    double want = afterInner(ranks[me], i);
    if (h == 1) {
      double mean = 0;  // local_sgd: the replicas' mean; diloco: the mean outer gradient
      for (const auto& r : ranks) mean += afterInner(r, i) / double(ranks.size());
      const double gout = initial(i) - mean;  // anchor - mean p_r
      want = policy == ReplicaPolicy::kLocalSgd ? mean : initial(i) - lr * (gout + mu * gout);
    }
    ASSERT_NEAR(full[i], want, 1e-6) << "element " << i;
  }
}

TEST(SemiSync, OneStepAgainstClosedForms) {
  forEachMesh([](const Mesh& mesh) {
    if (mesh.shape().replicas() < 2) return;
    std::vector<ShardMode> modes = {ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3};
    if (mesh.shape().shardGroupSize() == 1) modes.push_back(ShardMode::kNone);
    for (ShardMode mode : modes)
      for (ReplicaPolicy p : {ReplicaPolicy::kLocalSgd, ReplicaPolicy::kDiloco})
        for (int h : {1, 2}) oneStep(mesh, mode, p, h);
  });
}

std::unique_ptr<ShardedModel> probeModel(const Mesh& mesh, ShardMode mode, ReplicaPolicy p, int h) {
  auto model = ShardedModel::create(mesh, probe(mode, p, h));
  EXPECT_TRUE(model.ok()) << model.status().toString();
  if (!model.ok()) return nullptr;
  EXPECT_TRUE((*model)->addUnit("u", {{"w", {kN}}}).ok());
  EXPECT_TRUE((*model)->finalize().ok());
  return std::move(*model);
}

// Checkpoints (docs/checkpoint.md, "Semi-synchronous replicas"): saved after one step of H = 2
// (mid-period: each replica's own parameters), loaded by a new model, which holds each replica's
// closed form; both take step 2 (the sync, which needs the loaded anchor and momentum) and agree
// bit for bit. A model with another H, another policy or sync refuses it by name.
// This job's own directory (rank 0's mkdtemp, broadcast): the test's layouts run side by side
// under ctest -j, and a shared fixed path let one job load another's checkpoint.
const std::string& jobDir() {
  static const std::string dir = [] {
    char buf[256] = {};
    if (world().rank() == 0) {
      const std::string t = (std::filesystem::temp_directory_path() / "hsdp-semi-sync-XXXXXX");
      std::snprintf(buf, sizeof buf, "%s", t.c_str());
      if (mkdtemp(buf) == nullptr) buf[0] = 0;
    }
    EXPECT_TRUE(world().broadcast(buf, sizeof buf, DType::kUInt8, 0).ok());
    return std::string(buf);
  }();
  return dir;
}

void resumeMidPeriod(const Mesh& mesh, ShardMode mode, ReplicaPolicy policy) {
  SCOPED_TRACE(strCat(shardModeName(mode), " ", replicaPolicyName(policy)));
  ASSERT_FALSE(jobDir().empty()) << "mkdtemp in " << std::filesystem::temp_directory_path();
  const std::string dir = jobDir() + "/ckpt";
  auto a = probeModel(mesh, mode, policy, 2);
  ASSERT_TRUE(a);
  std::vector<float> init(kN);
  for (size_t i = 0; i < kN; ++i) init[i] = initial(i);
  ASSERT_TRUE(a->setParameter(0, "w", init.data(), init.size()).ok());
  probeStep(*a);
  auto saved = a->save(dir);
  ASSERT_TRUE(saved.ok()) << saved.status().toString();
  const auto ranks = replicaRanks(mesh);
  {  // The files, read offline: every replica's own parameters, the outer state once.
    auto rd = CheckpointReader::open(dir);
    ASSERT_TRUE(rd.ok()) << rd.status().toString();
    EXPECT_EQ((*rd)->find("u.w"), -1);
    auto tensor = [&](const std::string& name) {
      const int t = (*rd)->find(name);
      EXPECT_GE(t, 0) << name;
      std::vector<float> v(kN, -1.0f);
      if (t >= 0) EXPECT_TRUE((*rd)->readInto(t, TensorState::kParam, v.data()).ok()) << name;
      return v;
    };
    for (size_t q = 0; q < ranks.size(); ++q) {
      const std::vector<float> w = tensor(strCat("replica", q, "/u.w"));
      for (size_t i = 0; i < kN; ++i) ASSERT_NEAR(w[i], afterInner(ranks[q], i), 1e-6) << q;
    }
    EXPECT_EQ((*rd)->find("outer_anchor/u.w") >= 0, policy == ReplicaPolicy::kDiloco);
    if (policy == ReplicaPolicy::kDiloco) {
      const std::vector<float> anchor = tensor("outer_anchor/u.w");
      const std::vector<float> momentum = tensor("outer_momentum/u.w");
      for (size_t i = 0; i < kN; ++i) {
        ASSERT_EQ(anchor[i], initial(i)) << i;
        ASSERT_EQ(momentum[i], 0.0f) << i;
      }
    }
  }
  auto b = probeModel(mesh, mode, policy, 2);
  ASSERT_TRUE(b);
  auto loaded = b->load(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  EXPECT_EQ(loaded->step, 1);
  std::vector<float> fa, fb;
  ASSERT_TRUE(b->gatherFullParameters(0, &fb).ok());
  for (size_t i = 0; i < kN; ++i)
    ASSERT_NEAR(fb[i], afterInner(ranks[mesh.coords().replica_rank], i), 1e-6) << i;
  probeStep(*a);
  probeStep(*b);
  ASSERT_TRUE(a->gatherFullParameters(0, &fa).ok());
  ASSERT_TRUE(b->gatherFullParameters(0, &fb).ok());
  EXPECT_EQ(fa, fb);
  const char* name = replicaPolicyName(policy);
  const std::pair<std::unique_ptr<ShardedModel>, std::string> others[] = {
      {probeModel(mesh, mode, policy, 3), "sync_every (H) 2 (this model's: 3)"},
      {probeModel(mesh, mode, ReplicaPolicy::kSync, 1),
       strCat("replica policy ", name, " (this model's: sync")}};
  for (const auto& [m, want] : others) {
    ASSERT_TRUE(m);
    auto s = m->load(dir);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find(want), std::string::npos) << s.status().toString();
  }
}

// The streaming delay: H = 2, tau = 1 on one unit. Replica r's parameter after k probe steps
// is initial - k*d_r (d_r = g_r/(g_r + 1e6): Adam with beta 0 steps by g/(|g| + eps)).
void delayedSync(const Mesh& mesh, ShardMode mode, ReplicaPolicy policy) {
  SCOPED_TRACE(strCat(shardModeName(mode), " ", replicaPolicyName(policy), " tau=1"));
  const std::string dir = jobDir() + "/delay";
  auto make = [&](int tau) {
    EngineConfig cfg = probe(mode, policy, 2);
    cfg.replica_sync.sync_delay = tau;
    auto model = ShardedModel::create(mesh, cfg);
    EXPECT_TRUE(model.ok()) << model.status().toString();
    EXPECT_TRUE((*model)->addUnit("u", {{"w", {kN}}}).ok());
    EXPECT_TRUE((*model)->finalize().ok());
    return std::move(*model);
  };
  auto a = make(1);
  std::vector<float> init(kN), full, other;
  for (size_t i = 0; i < kN; ++i) init[i] = initial(i);
  ASSERT_TRUE(a->setParameter(0, "w", init.data(), init.size()).ok());
  const auto ranks = replicaRanks(mesh);
  const int me = mesh.coords().replica_rank;
  auto local = [&](int r, size_t i, int k) {  // initial - k * d_r
    return initial(i) + double(k) * (afterInner(ranks[r], i) - initial(i));
  };
  probeStep(*a);
  probeStep(*a);  // the sync's all-reduce starts: in flight, nothing applied yet
  ASSERT_TRUE(a->gatherFullParameters(0, &full).ok());
  for (size_t i = 0; i < kN; ++i) ASSERT_NEAR(full[i], local(me, i, 2), 1e-6) << "element " << i;
  for (bool save : {true, false}) {
    Status s = save ? a->save(dir).status() : a->load(dir).status();
    ASSERT_FALSE(s.ok());
    const char* verb = save ? "save" : "load";
    EXPECT_NE(s.message().find(strCat(verb,
                                      ": step 2 is inside the outer sync delay window: unit "
                                      "'u' (fragment 0) started its outer all-reduce after step "
                                      "2 and applies it after step 3")),
              std::string::npos)
        << s.toString();
  }
  Status set = a->setParameter(0, "w", init.data(), init.size());
  EXPECT_NE(set.message().find("setParameter: step 2 is inside the outer sync delay window"),
            std::string::npos)
      << set.toString();
  probeStep(*a);  // lands: the synced value replaces this replica's step 3 (alpha = 0)
  ASSERT_TRUE(a->gatherFullParameters(0, &full).ok());
  const double lr = 0.5, mu = 0.25;
  for (size_t i = 0; i < kN; ++i) {
    double mean = 0;
    for (size_t r = 0; r < ranks.size(); ++r) mean += local(r, i, 2) / double(ranks.size());
    const double g = initial(i) - mean;
    const double want = policy == ReplicaPolicy::kLocalSgd ? mean : initial(i) - lr * (g + mu * g);
    ASSERT_NEAR(full[i], want, 1e-6) << "element " << i;
  }
  // Outside the window: saved, loaded by a new model (another tau refused by name), and both
  // take steps 4 (start) and 5 (land) to the same bits.
  auto saved = a->save(dir);
  ASSERT_TRUE(saved.ok()) << saved.status().toString();
  auto refused = make(0)->load(dir);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("sync_delay 1 (this model's: 0)"), std::string::npos)
      << refused.status().toString();
  auto b = make(1);
  auto loaded = b->load(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status().toString();
  for (ShardedModel* m : {a.get(), b.get()}) {
    probeStep(*m);
    probeStep(*m);
  }
  ASSERT_TRUE(a->gatherFullParameters(0, &full).ok());
  ASSERT_TRUE(b->gatherFullParameters(0, &other).ok());
  for (size_t i = 0; i < kN; ++i) ASSERT_EQ(full[i], other[i]) << "element " << i;
}

TEST(SemiSync, DelayedSyncAgainstClosedFormAndSavesInTheWindowAreRefused) {
  forEachMesh([](const Mesh& mesh) {
    if (mesh.shape().replicas() < 2) return;
    ASSERT_FALSE(jobDir().empty());
    for (ShardMode mode : {ShardMode::kZero1, ShardMode::kZero3})
      for (ReplicaPolicy p : {ReplicaPolicy::kLocalSgd, ReplicaPolicy::kDiloco})
        delayedSync(mesh, mode, p);
  });
}

TEST(SemiSync, CheckpointsResumeMidPeriodAndOtherSettingsAreRefusedByName) {
  forEachMesh([](const Mesh& mesh) {
    if (mesh.shape().replicas() < 2) return;
    for (ShardMode mode : {ShardMode::kZero1, ShardMode::kZero3})
      for (ReplicaPolicy p : {ReplicaPolicy::kLocalSgd, ReplicaPolicy::kDiloco})
        resumeMidPeriod(mesh, mode, p);
  });
  EXPECT_TRUE(world().barrier().ok());
  if (world().rank() == 0 && !jobDir().empty()) std::filesystem::remove_all(jobDir());
}

}  // namespace
}  // namespace hsdp
