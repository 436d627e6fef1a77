// What a model of the user's own needs from the engine beyond the MLP, under mpirun, against
// closed forms and the engine's reference step (hsdp::adamStep on a plain array):
//  - per-parameter weight decay (ParamSpec::weight_decay) and setLearningRate between steps;
//  - frozen units (no gradient, no optimizer state, never reduced, parameters unchanged);
//  - the unit schedule helper (forwardUnits / backwardUnits) with a unit used twice (a tied
//    embedding), every prefetch depth;
//  - EngineConfig fields against their environment variables (resolveEngineConfig).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "core/adam.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "tests/common/for_each_mesh.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::forEachMesh;
using testing::world;

std::vector<ShardMode> modesFor(const Mesh& mesh) {
  std::vector<ShardMode> modes = {ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3};
  if (mesh.shape().shardGroupSize() == 1) modes.push_back(ShardMode::kNone);
  return modes;
}

// Gradient of element i on this rank: (rank + 1) * (i % 97 + 1). The world average is
// (W + 1) / 2 * (i % 97 + 1), exact in float for the world sizes here.
float rankGrad(size_t i) { return float(world().rank() + 1) * float(i % 97 + 1); }
float averageGrad(size_t i) { return float(world().size() + 1) / 2 * float(i % 97 + 1); }

void writeGrads(ShardedModel& m, int unit, float scale = 1.0f) {
  const FlatLayout& l = m.layout(unit);
  for (size_t p = 0; p < l.params().size(); ++p) {
    auto g = m.grad(unit, l.params()[p].name);
    ASSERT_TRUE(g.ok()) << g.status().toString();
    for (size_t i = 0; i < g->numel; ++i) g->data[i] += scale * rankGrad(l.offset(p) + i);
  }
}

std::vector<float> initial(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.01f * float(i % 113) - 0.5f;
  return v;
}

// AdamW with decay on "w" only: two steps at two learning rates, against hsdp::adamStep run per
// parameter on the whole vector with the same gradients, bit for bit (every shard and mode runs
// the same float operations per element).
TEST(EngineFeatures, WeightDecayMaskAndLearningRateSchedule) {
  forEachMesh([](const Mesh& mesh) {
    for (ShardMode mode : modesFor(mesh)) {
      for (bool offload : {false, true}) {
        if (offload && mode == ShardMode::kNone) continue;
        SCOPED_TRACE(strCat(shardModeName(mode), offload ? " offload" : ""));
        EngineConfig cfg;
        cfg.mode = mode;
        cfg.offload.cpu = offload;
        cfg.adam.lr = 0.5f;
        cfg.adam.weight_decay = 0.1f;
        cfg.adam.eps = 1e-3f;
        auto model = ShardedModel::create(mesh, cfg);
        ASSERT_TRUE(model.ok()) << model.status().toString();
        ShardedModel& m = **model;
        // Decay, no decay, decay: spans split inside shards in every mesh.
        std::vector<ParamSpec> params = {
            {"w", {61, 7}, true}, {"b", {61}, false}, {"w2", {5, 3}, true}, {"g", {11}, false}};
        ASSERT_TRUE(m.addUnit("u", params).ok());
        ASSERT_TRUE(m.finalize().ok());
        const FlatLayout& l = m.layout(0);
        std::vector<std::vector<float>> want(params.size()), mom1(params.size()),
            mom2(params.size());
        for (size_t p = 0; p < params.size(); ++p) {
          want[p] = initial(params[p].numel());
          mom1[p].assign(want[p].size(), 0.0f);
          mom2[p].assign(want[p].size(), 0.0f);
          ASSERT_TRUE(m.setParameter(0, params[p].name, want[p].data(), want[p].size()).ok());
        }
        for (int t = 1; t <= 2; ++t) {
          const float lr = t == 1 ? 0.5f : 0.125f;
          ASSERT_TRUE(m.setLearningRate(lr).ok());
          EXPECT_EQ(m.learningRate(), lr);
          writeGrads(m, 0);
          ASSERT_TRUE(m.reduceGrad(0).ok());
          ASSERT_TRUE(m.step().ok());
          for (size_t p = 0; p < params.size(); ++p) {
            AdamConfig ref = cfg.adam;
            ref.lr = lr;
            if (!params[p].weight_decay) ref.weight_decay = 0.0f;
            std::vector<float> g(want[p].size());
            for (size_t i = 0; i < g.size(); ++i) g[i] = averageGrad(l.offset(p) + i);
            adamStep(ref, t, want[p].data(), g.data(), mom1[p].data(), mom2[p].data(), g.size());
          }
        }
        std::vector<float> full;
        ASSERT_TRUE(m.gatherFullParameters(0, &full).ok());
        for (size_t p = 0; p < params.size(); ++p)
          for (size_t i = 0; i < want[p].size(); ++i)
            ASSERT_EQ(full[l.offset(p) + i], want[p][i]) << params[p].name << "[" << i << "]";
        // Bad rates are named and change nothing.
        Status bad = m.setLearningRate(-1.0f);
        EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
        EXPECT_NE(bad.message().find("lr=-1"), std::string::npos) << bad.message();
        EXPECT_EQ(m.setLearningRate(std::nanf("")).code(), StatusCode::kInvalidArgument);
        EXPECT_EQ(m.learningRate(), 0.125f);
        if (offload) {
          // Offload without clipping steps a unit as soon as it is reduced (here, inside
          // reduceGrad's or step's poll): once launched, the step's rate cannot change.
          writeGrads(m, 0);
          ASSERT_TRUE(m.reduceGrad(0).ok());
          ASSERT_TRUE(m.step().ok());
          writeGrads(m, 0);
          ASSERT_TRUE(m.reduceGrad(0).ok());
          // With one unit the all-reduce may still be in flight; unshard polls the reductions.
          ASSERT_TRUE(m.unshard(0).ok());
          ASSERT_TRUE(m.waitForUnshard(0).ok());
          ASSERT_TRUE(m.reshard(0).ok());
          // On one rank there is nothing to wait for: the step has surely been launched. On
          // more, the all-reduce may still be in flight, and then the rate may still change.
          Status late = m.setLearningRate(0.3f);
          if (world().size() == 1) EXPECT_FALSE(late.ok());
          if (!late.ok()) {
            EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition);
            EXPECT_NE(late.message().find("before the step's first reduceGrad"), std::string::npos)
                << late.message();
          }
          Status last = m.step();
          ASSERT_TRUE(last.ok()) << last.toString();
        }
      }
    }
  });
}

// A frozen unit keeps its parameters, has no gradient and no optimizer state, and step() needs
// no reduceGrad for it; the trainable unit beside it steps as usual.
TEST(EngineFeatures, FrozenUnitsAreGatheredButNeverTrained) {
  forEachMesh([](const Mesh& mesh) {
    for (ShardMode mode : modesFor(mesh)) {
      SCOPED_TRACE(shardModeName(mode));
      EngineConfig cfg;
      cfg.mode = mode;
      auto model = ShardedModel::create(mesh, cfg);
      ASSERT_TRUE(model.ok());
      ShardedModel& m = **model;
      ASSERT_TRUE(m.addUnit("trained", {{"w", {40, 3}}}).ok());
      ASSERT_TRUE(m.addUnit("frozen", {{"w", {33, 5}}, {"b", {5}}}, {.frozen = true}).ok());
      ASSERT_TRUE(m.finalize().ok());
      EXPECT_FALSE(m.frozen(0));
      EXPECT_TRUE(m.frozen(1));
      const std::vector<float> fw = initial(33 * 5), fb = initial(5);
      ASSERT_TRUE(m.setParameter(1, "w", fw.data(), fw.size()).ok());
      ASSERT_TRUE(m.setParameter(1, "b", fb.data(), fb.size()).ok());
      for (int t = 0; t < 2; ++t) {
        ASSERT_TRUE(m.unshard(1).ok());
        ASSERT_TRUE(m.waitForUnshard(1).ok());
        auto w = m.param(1, "w");
        ASSERT_TRUE(w.ok());
        EXPECT_EQ(std::vector<float>(w->data, w->data + fw.size()), fw);
        ASSERT_TRUE(m.reshard(1).ok());
        EXPECT_EQ(m.grad(1, "w").status().code(), StatusCode::kFailedPrecondition);
        EXPECT_NE(m.grad(1, "w").status().message().find("frozen"), std::string::npos);
        std::vector<float> g(fw.size(), 1.0f);
        std::vector<TensorRef> in = {{"w", g.data(), g.size()}};
        EXPECT_EQ(m.copyInGrads(1, in).code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(m.reduceGrad(1).code(), StatusCode::kFailedPrecondition);
        writeGrads(m, 0);
        ASSERT_TRUE(m.reduceGrad(0).ok());
        ASSERT_TRUE(m.step().ok());
      }
      std::vector<float> full;
      ASSERT_TRUE(m.gatherFullParameters(1, &full).ok());
      std::vector<float> want = fw;
      want.insert(want.end(), fb.begin(), fb.end());
      EXPECT_EQ(full, want);
      ASSERT_TRUE(m.gatherFullParameters(0, &full).ok());
      for (float x : full) ASSERT_LT(x, 0.0f);  // two Adam steps against a positive gradient
      // Memory: the frozen unit holds parameters only.
      const MemoryReport r = m.memoryReport();
      const size_t S = mode == ShardMode::kNone ? 1 : mesh.shape().shardGroupSize();
      const size_t trained_shard = (40 * 3 + S - 1) / S;
      EXPECT_EQ(r.optim_bytes, 2 * sizeof(float) * trained_shard);
      EXPECT_EQ(r.grad_bytes,
                sizeof(float) *
                    (mode == ShardMode::kZero1 && S > 1 ? trained_shard * (S + 1) : trained_shard));
    }
  });
}

// forwardUnits / backwardUnits over {a, b, c, a} (unit a used twice, as a tied embedding): the
// visit order, the parameters each visit sees, a gradient accumulated from both visits of a and
// reduced once, at every prefetch depth; against the closed-form world average.
TEST(EngineFeatures, UnitScheduleWithATiedUnit) {
  forEachMesh([](const Mesh& mesh) {
    for (int prefetch : {0, 1, 2, 5}) {
      SCOPED_TRACE(strCat("prefetch ", prefetch));
      EngineConfig cfg;
      cfg.mode = ShardMode::kZero3;
      cfg.adam.kind = OptimizerKind::kAdam;  // probe: beta 0, lr 1, eps 1e6 -> p = -g/(g+1e6)
      cfg.adam.lr = 1.0f;
      cfg.adam.beta1 = 0.0f;
      cfg.adam.beta2 = 0.0f;
      cfg.adam.eps = 1e6f;
      auto model = ShardedModel::create(mesh, cfg);
      ASSERT_TRUE(model.ok());
      ShardedModel& m = **model;
      for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(m.addUnit(name, {{"w", {29}}}).ok());
      ASSERT_TRUE(m.finalize().ok());
      const std::vector<int> order = {0, 1, 2, 0};
      std::vector<int> seen;
      ASSERT_TRUE(forwardUnits(m, order,
                               [&](int u) -> Status {
                                 seen.push_back(u);
                                 HSDP_ASSIGN_OR_RETURN(ParamView w, m.param(u, "w"));
                                 for (size_t i = 0; i < w.numel; ++i)
                                   if (w.data[i] != 0.0f) return internalError("not zero");
                                 return okStatus();
                               },
                               {prefetch})
                      .ok());
      EXPECT_EQ(seen, order);
      seen.clear();
      ASSERT_TRUE(backwardUnits(m, order,
                                [&](int u) -> Status {
                                  seen.push_back(u);
                                  HSDP_ASSIGN_OR_RETURN(ParamView g, m.grad(u, "w"));
                                  for (size_t i = 0; i < g.numel; ++i) g.data[i] += rankGrad(i);
                                  return okStatus();
                                },
                                /*reduce_grads=*/true, {prefetch})
                      .ok());
      EXPECT_EQ(seen, (std::vector<int>{0, 2, 1, 0}));
      ASSERT_TRUE(m.step().ok());
      for (int u = 0; u < 3; ++u) {
        std::vector<float> full;
        ASSERT_TRUE(m.gatherFullParameters(u, &full).ok());
        const double uses = u == 0 ? 2 : 1;
        for (size_t i = 0; i < full.size(); ++i) {
          const double g = uses * averageGrad(i);
          ASSERT_NEAR(full[i], -g / (g + 1e6), 1e-9 + 1e-5 * g / 1e6) << u << "[" << i << "]";
        }
      }
    }
    // Bad arguments are named; a failing fn names the unit and position.
    auto model = ShardedModel::create(mesh, {});
    ASSERT_TRUE(model.ok());
    ShardedModel& m = **model;
    ASSERT_TRUE(m.addUnit("a", {{"w", {3}}}).ok());
    ASSERT_TRUE(m.finalize().ok());
    auto ok = [](int) { return okStatus(); };
    const std::vector<int> one = {0}, bad = {0, 7};
    EXPECT_EQ(forwardUnits(m, one, ok, {-1}).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(forwardUnits(m, {}, ok).code(), StatusCode::kInvalidArgument);
    Status s = forwardUnits(m, bad, ok);
    EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
    EXPECT_NE(s.message().find("position 1 names unit 7"), std::string::npos) << s.message();
    s = forwardUnits(m, one, [](int) { return invalidArgument("boom"); });
    EXPECT_NE(s.message().find("forward: unit 'a' (position 0)"), std::string::npos) << s.message();
  });
}

// Each engine setting: a field given wins over its variable; an unset field takes the variable,
// else the default; malformed values are named.
TEST(EngineFeatures, ConfigFieldsAndTheirEnvironmentVariables) {
  unsetenv("HSDP_HIER");
  unsetenv("HSDP_PIPELINE_CHUNKS");
  unsetenv("HSDP_PIPELINE_MIN_CHUNK_BYTES");
  unsetenv("HSDP_INTER_DTYPE");
  unsetenv("HSDP_CPU_ADAM_THREADS");
  auto d = resolveEngineConfig({});
  ASSERT_TRUE(d.ok()) << d.status().toString();
  EXPECT_EQ(*d->pipeline.hierarchical, true);
  EXPECT_EQ(*d->pipeline.chunks, 32);
  EXPECT_EQ(*d->pipeline.min_chunk_bytes, size_t{1} << 20);
  EXPECT_EQ(*d->wires.inter_dtype, DType::kFloat32);
  EXPECT_EQ(*d->offload.adam_threads, 1);
  setenv("HSDP_HIER", "0", 1);
  setenv("HSDP_PIPELINE_CHUNKS", "7", 1);
  setenv("HSDP_INTER_DTYPE", "bf16", 1);
  setenv("HSDP_CPU_ADAM_THREADS", "3", 1);
  auto e = resolveEngineConfig({});
  ASSERT_TRUE(e.ok()) << e.status().toString();
  EXPECT_EQ(*e->pipeline.hierarchical, false);
  EXPECT_EQ(*e->pipeline.chunks, 7);
  EXPECT_EQ(*e->pipeline.min_chunk_bytes, 0u);  // chunks set: exactly that many
  EXPECT_EQ(*e->wires.inter_dtype, DType::kBFloat16);
  EXPECT_EQ(*e->offload.adam_threads, 3);
  EngineConfig given;
  given.pipeline.hierarchical = true;
  given.pipeline.chunks = 4;
  given.wires.inter_dtype = DType::kFloat32;
  given.offload.adam_threads = 2;
  auto f = resolveEngineConfig(given);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f->pipeline.hierarchical, true);
  EXPECT_EQ(*f->pipeline.chunks, 4);
  EXPECT_EQ(*f->wires.inter_dtype, DType::kFloat32);
  EXPECT_EQ(*f->offload.adam_threads, 2);
  setenv("HSDP_PIPELINE_CHUNKS", "1000000000", 1);
  auto big = resolveEngineConfig({});
  EXPECT_EQ(big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("HSDP_PIPELINE_CHUNKS=1000000000"), std::string::npos);
  unsetenv("HSDP_PIPELINE_CHUNKS");
  given.pipeline.chunks = 0;
  auto zero = resolveEngineConfig(given);
  EXPECT_NE(zero.status().message().find("EngineConfig::pipeline.chunks=0"), std::string::npos);
  for (const char* v : {"HSDP_HIER", "HSDP_INTER_DTYPE", "HSDP_CPU_ADAM_THREADS"}) unsetenv(v);
}

}  // namespace
}  // namespace hsdp
