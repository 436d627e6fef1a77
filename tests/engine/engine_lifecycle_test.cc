// The unit state machines (engine/unit_state.h) through the public API, under mpirun: calls made
// at the wrong time (unshard twice, waitForUnshard or reshard of a sharded unit, param() before
// the gather, reduceGrad without a gradient or twice, step before the reductions, a gradient
// written while the unit's offloaded step runs) are FailedPrecondition naming the unit, the
// state it is in and the states the call needs, change nothing, and the model then trains
// exactly as hsdp::adamStep on the whole vector (the independent reference), bit for bit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/adam.h"
#include "hsdp/sharded_model.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::world;

float rankGrad(size_t i) { return float(world().rank() + 1) * float(i % 89 + 1); }
float averageGrad(size_t i) { return float(world().size() + 1) / 2 * float(i % 89 + 1); }

// `s` is FailedPrecondition and its message holds every one of `parts`.
void expectRefused(const Status& s, std::initializer_list<std::string> parts) {
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.toString();
  for (const std::string& p : parts)
    EXPECT_NE(s.message().find(p), std::string::npos) << s.message();
}

void writeGrads(ShardedModel& m, int unit) {
  const FlatLayout& l = m.layout(unit);
  for (size_t p = 0; p < l.params().size(); ++p) {
    auto g = m.grad(unit, l.params()[p].name);
    ASSERT_TRUE(g.ok()) << g.status().toString();
    for (size_t i = 0; i < g->numel; ++i) g->data[i] += rankGrad(l.offset(p) + i);
  }
}

struct Case {
  ShardMode mode;
  bool offload;
  int max_gathered;  // 1: the second unit's unshard is deferred (zero3)
};

TEST(UnitLifecycle, IllegalCallsNameTheUnitAndBothStatesThenTrainingIsExact) {
  auto layout = groupRanksIntoNodes(world());
  ASSERT_TRUE(layout.ok());
  auto made = Mesh::create(world(), *layout, {layout->ranks_per_node, 1});
  ASSERT_TRUE(made.ok()) << made.status().toString();
  const Mesh& mesh = **made;
  const bool sharded = mesh.shape().shardGroupSize() > 1;
  std::vector<Case> cases = {{ShardMode::kZero3, false, 0},
                             {ShardMode::kZero3, true, 0},
                             {ShardMode::kZero3, false, 1},
                             {ShardMode::kZero2, true, 0},
                             {ShardMode::kZero1, false, 0}};
  if (!sharded) cases.push_back({ShardMode::kNone, false, 0});
  for (const Case& c : cases) {
    SCOPED_TRACE(strCat(shardModeName(c.mode), c.offload ? " offload" : "", " max_gathered ",
                        c.max_gathered));
    EngineConfig cfg;
    cfg.mode = c.mode;
    cfg.offload.cpu = c.offload;
    cfg.pipeline.max_gathered_units = c.max_gathered;
    cfg.adam.lr = 0.25f;
    cfg.adam.eps = 1e-3f;
    auto model = ShardedModel::create(mesh, cfg);
    ASSERT_TRUE(model.ok()) << model.status().toString();
    ShardedModel& m = **model;
    const std::vector<ParamSpec> params = {{"w", {37, 5}}, {"b", {37}}};
    ASSERT_TRUE(m.addUnit("a", params).ok());
    ASSERT_TRUE(m.addUnit("b", params).ok());
    ASSERT_TRUE(m.finalize().ok());
    const size_t n = m.layout(0).numel();
    std::vector<float> want(n), mom1(n, 0.0f), mom2(n, 0.0f);
    for (size_t i = 0; i < n; ++i) want[i] = 0.01f * float(i % 53) - 0.2f;
    for (int u = 0; u < 2; ++u)
      for (const ParamSpec& p : params)
        ASSERT_TRUE(m.setParameter(u, p.name,
                                   want.data() + m.layout(u).offset(*m.layout(u).indexOf(p.name)),
                                   p.numel())
                        .ok());

    // ---- parameters: Sharded -> Gathering/Deferred -> Gathered -> Sharded ----
    expectRefused(m.waitForUnshard(0),
                  {"waitForUnshard: unit 'a' is Sharded, waitForUnshard needs Deferred, "
                   "Gathering or Gathered"});
    expectRefused(m.reshard(0), {"reshard: unit 'a' is Sharded, reshard needs Deferred, "
                                 "Gathering or Gathered"});
    expectRefused(m.param(0, "w").status(),
                  {"param('a.w'): unit 'a' is Sharded", "needs Gathered"});
    ASSERT_TRUE(m.unshard(0).ok());
    if (c.max_gathered == 1 && sharded) {  // the limit holds unit a: b waits for a slot
      ASSERT_TRUE(m.unshard(1).ok());
      expectRefused(m.param(1, "w").status(), {"unit 'b' is Deferred", "needs Gathered"});
      expectRefused(m.unshard(1), {"unshard: unit 'b' is Deferred, unshard needs Sharded"});
      ASSERT_TRUE(m.reshard(1).ok());  // never issued: back to Sharded
    }
    ASSERT_TRUE(m.waitForUnshard(0).ok());
    expectRefused(m.unshard(0),
                  {"unshard: unit 'a' is Gathered, unshard needs Sharded", "already unsharded"});
    {  // the gathered parameters are the ones set
      auto w = m.param(0, "w");
      ASSERT_TRUE(w.ok()) << w.status().toString();
      for (size_t i = 0; i < w->numel; ++i) ASSERT_EQ(w->data[i], want[i]) << i;
    }

    // ---- gradients: Empty -> Accumulating -> Reducing -> Reduced -> (Stepping ->) Empty ----
    expectRefused(m.reduceGrad(0),
                  {"reduceGrad: unit 'a' is Empty, reduceGrad needs Accumulating"});
    expectRefused(m.step(), {"step: unit 'a' is Empty, step needs Reduced, Stepping or Stepped"});
    writeGrads(m, 0);
    expectRefused(m.step(),
                  {"step: unit 'a' is Accumulating, step needs Reduced, Stepping or Stepped"});
    ASSERT_TRUE(m.reshard(0).ok());
    ASSERT_TRUE(m.reduceGrad(0).ok());
    {
      Status twice = m.reduceGrad(0);  // Reducing, Reduced or (offload) Stepping / Stepped
      expectRefused(twice, {"reduceGrad: unit 'a' is ", "reduceGrad needs Accumulating"});
      EXPECT_EQ(twice.message().find("is Accumulating"), std::string::npos) << twice.message();
    }
    if (c.offload) {
      // No clipping: the unit's step starts as soon as its gradient is reduced; unshard waits for
      // it (Stepped), and a gradient written now would be lost to that step.
      ASSERT_TRUE(m.unshard(0).ok());
      ASSERT_TRUE(m.waitForUnshard(0).ok());
      ASSERT_TRUE(m.reshard(0).ok());
      Status late = m.grad(0, "w").status();
      expectRefused(late, {"grad('a.w'): unit 'a' is ", "needs Empty, Accumulating or Reduced"});
      if (world().size() == 1) EXPECT_NE(late.message().find("is Stepped"), std::string::npos);
    }
    expectRefused(m.step(), {"step: unit 'b' is Empty, step needs Reduced"});
    ASSERT_TRUE(m.unshard(1).ok());
    ASSERT_TRUE(m.waitForUnshard(1).ok());
    writeGrads(m, 1);
    ASSERT_TRUE(m.reshard(1).ok());
    ASSERT_TRUE(m.reduceGrad(1).ok());
    ASSERT_TRUE(m.step().ok());

    // ---- after the errors: one more ordinary step, both exact against the reference ----
    for (int u = 0; u < 2; ++u) {
      ASSERT_TRUE(m.unshard(u).ok());
      ASSERT_TRUE(m.waitForUnshard(u).ok());
      writeGrads(m, u);
      ASSERT_TRUE(m.reshard(u).ok());
      ASSERT_TRUE(m.reduceGrad(u).ok());
    }
    ASSERT_TRUE(m.step().ok());
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = averageGrad(i);
    for (int t = 1; t <= 2; ++t)
      adamStep(cfg.adam, t, want.data(), g.data(), mom1.data(), mom2.data(), n);
    for (int u = 0; u < 2; ++u) {
      std::vector<float> full;
      ASSERT_TRUE(m.gatherFullParameters(u, &full).ok());
      ASSERT_EQ(full.size(), n);
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(full[i], want[i]) << "unit " << u << " [" << i << "]";
    }
    EXPECT_EQ(m.stepCount(), 2);
  }
}

}  // namespace
}  // namespace hsdp
