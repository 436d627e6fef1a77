// The engine under mpirun, for every valid factor pair of the job's layout: parameter round
// trips, gradient averaging against a closed form, memory accounting, lifecycle errors, and
// mismatched registrations reported on every rank.
#include "hsdp/sharded_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/common/for_each_mesh.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::forEachMesh;
using testing::world;

std::vector<ParamSpec> oddUnit() { return {{"weight", {333, 7}}, {"bias", {333}}, {"s", {1}}}; }

// Adam with beta1 = beta2 = 0, lr 1 and a huge eps: one step moves each element by
// g / (|g| + 1e6), so the parameters read back reveal the gradient the step saw.
AdamConfig probeAdam() {
  AdamConfig adam;
  adam.kind = OptimizerKind::kAdam;
  adam.lr = 1.0f;
  adam.beta1 = 0.0f;
  adam.beta2 = 0.0f;
  adam.eps = 1e6f;
  return adam;
}

std::vector<float> iota(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * float(i % 1009) - 3.0f;
  return v;
}

TEST(ShardedModel, SetAndGatherRoundTrip) {
  forEachMesh([](const Mesh& mesh) {
    auto model = ShardedModel::create(mesh, {ShardMode::kZero3, {}});
    ASSERT_TRUE(model.ok());
    ASSERT_TRUE((*model)->addUnit("u0", oddUnit()).ok());
    ASSERT_TRUE((*model)->addUnit("u1", {{"w", {5}}}).ok());  // fewer elements than shards
    ASSERT_TRUE((*model)->finalize().ok());
    const FlatLayout& l = (*model)->layout(0);
    std::vector<float> w = iota(333 * 7, 0.5f), b = iota(333, -1.0f), s = {42.0f};
    ASSERT_TRUE((*model)->setParameter(0, "weight", w.data(), w.size()).ok());
    ASSERT_TRUE((*model)->setParameter(0, "bias", b.data(), b.size()).ok());
    ASSERT_TRUE((*model)->setParameter(0, "s", s.data(), 1).ok());
    std::vector<float> u1 = {1, 2, 3, 4, 5};
    ASSERT_TRUE((*model)->setParameter(1, "w", u1.data(), 5).ok());
    EXPECT_FALSE((*model)->setParameter(0, "bias", b.data(), 7).ok());

    std::vector<float> full;
    ASSERT_TRUE((*model)->gatherFullParameters(0, &full).ok());
    std::vector<float> want = w;
    want.insert(want.end(), b.begin(), b.end());
    want.push_back(42.0f);
    EXPECT_EQ(full, want);
    ASSERT_TRUE((*model)->gatherFullParameters(1, &full).ok());
    EXPECT_EQ(full, u1);

    // Unshard gives the same view; the memory report matches the padded shard size.
    ASSERT_TRUE((*model)->unshard(0).ok());
    ASSERT_TRUE((*model)->waitForUnshard(0).ok());
    auto bias = (*model)->param(0, "bias");
    ASSERT_TRUE(bias.ok());
    EXPECT_EQ(std::vector<float>(bias->data, bias->data + 333), b);
    ASSERT_TRUE((*model)->reshard(0).ok());
    const int S = mesh.shape().shardGroupSize();
    const size_t shard0 = (l.numel() + S - 1) / S, shard1 = (5 + S - 1) / S;
    MemoryReport r = (*model)->memoryReport();
    EXPECT_EQ(r.param_bytes, 4 * (shard0 + shard1));
    EXPECT_EQ(r.grad_bytes, r.param_bytes);
    EXPECT_EQ(r.optim_bytes, 2 * r.param_bytes);
    EXPECT_EQ(r.offload_host_bytes, 0u);  // no offload: the moments are counted in optim only
    if (S > 1) EXPECT_EQ(r.gathered_peak_bytes, 4 * shard0 * S);  // one unit gathered at a time
  });
}

// Every rank writes gradient (world rank + 1) * (i + 1) into element i: after reduceGrad the
// shard holds the world average, ((W + 1) / 2) * (i + 1), on every replica.
TEST(ShardedModel, ReduceGradAveragesOverAllRanks) {
  forEachMesh([](const Mesh& mesh) {
    for (ShardMode mode : {ShardMode::kZero3, ShardMode::kNone}) {
      if (mode == ShardMode::kNone && mesh.shape().shardGroupSize() != 1) continue;
      AdamConfig adam;
      adam.kind = OptimizerKind::kAdam;
      adam.lr = 0.125f;
      auto model = ShardedModel::create(mesh, {mode, adam});
      ASSERT_TRUE(model.ok());
      ASSERT_TRUE((*model)->addUnit("u", oddUnit()).ok());
      ASSERT_TRUE((*model)->finalize().ok());
      const FlatLayout& l = (*model)->layout(0);
      for (size_t p = 0; p < l.params().size(); ++p) {
        auto g = (*model)->grad(0, l.params()[p].name);
        ASSERT_TRUE(g.ok());
        for (size_t i = 0; i < g->numel; ++i)
          g->data[i] = float(world().rank() + 1) * float(l.offset(p) + i + 1);
      }
      ASSERT_TRUE((*model)->reduceGrad(0).ok());
      ASSERT_TRUE((*model)->step().ok());
      // Adam's first step moves every element by lr * g / (|g| + eps) = lr (g > 0), a closed
      // form that checks the averaged gradient's sign and that each element was stepped once.
      std::vector<float> full;
      ASSERT_TRUE((*model)->gatherFullParameters(0, &full).ok());
      for (size_t i = 0; i < full.size(); ++i) ASSERT_NEAR(full[i], -0.125f, 1e-6f) << i;
    }
  });
}

TEST(ShardedModel, GradientValuesAfterReduce) {
  // A direct check of the averaged gradient: use SGD-like Adam with beta1 = 0 and
  // beta2 -> the update is lr * g / (|g| + eps); with eps huge, the update is lr * g / eps.
  forEachMesh([](const Mesh& mesh) {
    const AdamConfig adam = probeAdam();
    auto model = ShardedModel::create(mesh, {ShardMode::kZero3, adam});
    ASSERT_TRUE(model.ok());
    ASSERT_TRUE((*model)->addUnit("u", oddUnit()).ok());
    ASSERT_TRUE((*model)->finalize().ok());
    const FlatLayout& l = (*model)->layout(0);
    const double W = world().size();
    for (size_t p = 0; p < l.params().size(); ++p) {
      auto g = (*model)->grad(0, l.params()[p].name);
      ASSERT_TRUE(g.ok());
      for (size_t i = 0; i < g->numel; ++i)
        g->data[i] = float(world().rank() + 1) * float((l.offset(p) + i) % 97 + 1);
    }
    ASSERT_TRUE((*model)->reduceGrad(0).ok());
    ASSERT_TRUE((*model)->step().ok());
    std::vector<float> full;
    ASSERT_TRUE((*model)->gatherFullParameters(0, &full).ok());
    for (size_t i = 0; i < full.size(); ++i) {
      const double g = (W + 1) / 2 * double(i % 97 + 1);
      ASSERT_NEAR(full[i], -g / (g + 1e6), 1e-9 + 1e-5 * g / 1e6) << i;
    }
  });
}

// FSDP2's copy-out / copy-in. Out: the gathered parameters land in the caller's tensors, any
// subset in any order, equal to the values set (closed form), untouched tensors stay untouched.
// In: gradients added in two halves (exact in float) reach the same closed form as
// GradientValuesAfterReduce: the probe step reveals the world average. Every mode.
TEST(ShardedModel, CopyOutParamsAndCopyInGradsClosedForms) {
  forEachMesh([](const Mesh& mesh) {
    for (ShardMode mode : {ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3}) {
      SCOPED_TRACE(shardModeName(mode));
      auto model = ShardedModel::create(mesh, {mode, probeAdam()});
      ASSERT_TRUE(model.ok());
      ShardedModel& m = **model;
      ASSERT_TRUE(m.addUnit("u", oddUnit()).ok());
      ASSERT_TRUE(m.finalize().ok());
      const FlatLayout& l = m.layout(0);
      std::vector<float> w = iota(333 * 7, 0.5f), b = iota(333, -1.0f), s = {42.0f};
      ASSERT_TRUE(m.setParameter(0, "weight", w.data(), w.size()).ok());
      ASSERT_TRUE(m.setParameter(0, "bias", b.data(), b.size()).ok());
      ASSERT_TRUE(m.setParameter(0, "s", s.data(), 1).ok());
      std::vector<float> tw(w.size(), -7.0f), tb(b.size(), -7.0f), ts(1, -7.0f);
      std::vector<TensorRef> out = {{"s", ts.data(), 1}, {"weight", tw.data(), tw.size()}};
      EXPECT_EQ(m.copyOutParams(0, out).code(), StatusCode::kFailedPrecondition);  // sharded
      ASSERT_TRUE(m.unshard(0).ok());
      if (mode == ShardMode::kZero3 && mesh.shape().shardGroupSize() > 1)
        EXPECT_EQ(m.copyOutParams(0, out).code(), StatusCode::kFailedPrecondition);  // in flight
      ASSERT_TRUE(m.waitForUnshard(0).ok());
      ASSERT_TRUE(m.copyOutParams(0, out).ok());
      EXPECT_EQ(tw, w);
      EXPECT_EQ(ts, s);
      EXPECT_EQ(tb, std::vector<float>(b.size(), -7.0f));  // not asked for
      // Bad tensors: named, and nothing is copied.
      std::vector<TensorRef> unknown = {{"bias", tb.data(), tb.size()}, {"gamma", tb.data(), 3}};
      Status st = m.copyOutParams(0, unknown);
      EXPECT_EQ(st.code(), StatusCode::kNotFound);
      EXPECT_NE(st.message().find("tensor 1"), std::string::npos) << st.message();
      EXPECT_NE(st.message().find("'gamma'"), std::string::npos) << st.message();
      EXPECT_EQ(tb, std::vector<float>(b.size(), -7.0f));
      std::vector<TensorRef> short_numel = {{"bias", tb.data(), 5}};
      st = m.copyOutParams(0, short_numel);
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(st.message().find("holds 5 elements, the parameter 333"), std::string::npos)
          << st.message();
      std::vector<TensorRef> twice = {{"s", ts.data(), 1}, {"s", ts.data(), 1}};
      st = m.copyOutParams(0, twice);
      EXPECT_NE(st.message().find("'s' is given twice"), std::string::npos) << st.message();
      std::vector<TensorRef> null = {{"bias", nullptr, 333}};
      st = m.copyOutParams(0, null);
      EXPECT_NE(st.message().find("null pointer"), std::string::npos) << st.message();
      std::vector<float> big(w.size() + 100);
      std::vector<TensorRef> overlap = {{"bias", big.data(), 333},
                                        {"weight", big.data() + 100, w.size()}};
      st = m.copyOutParams(0, overlap);
      EXPECT_NE(st.message().find("tensors 0 and 1 overlap"), std::string::npos) << st.message();
      auto view = m.param(0, "bias");
      ASSERT_TRUE(view.ok());
      std::vector<TensorRef> inside = {{"bias", view->data, 333}};
      st = m.copyOutParams(0, inside);
      EXPECT_NE(st.message().find("inside the unit's own flat buffer"), std::string::npos)
          << st.message();
      ASSERT_TRUE(m.reshard(0).ok());

      // Copy-in, on a fresh model (zero parameters, so the probe step reads the gradient).
      auto fresh = ShardedModel::create(mesh, {mode, probeAdam()});
      ASSERT_TRUE(fresh.ok());
      ShardedModel& f = **fresh;
      ASSERT_TRUE(f.addUnit("u", oddUnit()).ok());
      ASSERT_TRUE(f.finalize().ok());
      EXPECT_EQ(f.copyInGrads(0, null).code(), StatusCode::kInvalidArgument);
      // A rejected copy-in took no gradient buffer.
      EXPECT_EQ(f.reduceGrad(0).code(), StatusCode::kFailedPrecondition);
      std::vector<std::vector<float>> half(l.params().size());
      for (size_t p = 0; p < l.params().size(); ++p) {
        half[p].resize(l.params()[p].numel());
        for (size_t i = 0; i < half[p].size(); ++i)
          half[p][i] = 0.5f * float(world().rank() + 1) * float((l.offset(p) + i) % 97 + 1);
      }
      for (int rep = 0; rep < 2; ++rep) {  // two micro-steps: the second adds to the first
        std::vector<TensorRef> in;
        for (size_t p = l.params().size(); p-- > 0;)  // reverse order
          in.push_back({l.params()[p].name, half[p].data(), half[p].size()});
        ASSERT_TRUE(f.copyInGrads(0, in).ok());
      }
      ASSERT_TRUE(f.reduceGrad(0).ok());
      ASSERT_TRUE(f.step().ok());
      std::vector<float> full;
      ASSERT_TRUE(f.gatherFullParameters(0, &full).ok());
      const double W = world().size();
      for (size_t i = 0; i < full.size(); ++i) {
        const double g = (W + 1) / 2 * double(i % 97 + 1);
        ASSERT_NEAR(full[i], -g / (g + 1e6), 1e-9 + 1e-5 * g / 1e6) << i;
      }
    }
  });
}

TEST(ShardedModel, LifecycleErrors) {
  forEachMesh([](const Mesh& mesh) {
    auto model = ShardedModel::create(mesh, {ShardMode::kZero3, {}});
    ASSERT_TRUE(model.ok());
    EXPECT_EQ((*model)->unshard(0).code(), StatusCode::kFailedPrecondition);  // not finalized
    ASSERT_TRUE((*model)->addUnit("u", oddUnit()).ok());
    EXPECT_FALSE((*model)->addUnit("u", oddUnit()).ok());  // duplicate unit name
    ASSERT_TRUE((*model)->finalize().ok());
    EXPECT_FALSE((*model)->addUnit("v", oddUnit()).ok());
    EXPECT_EQ((*model)->param(0, "bias").status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ((*model)->reduceGrad(0).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ((*model)->step().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ((*model)->unshard(1).code(), StatusCode::kOutOfRange);
    EXPECT_EQ((*model)->reshard(0).code(), StatusCode::kFailedPrecondition);
  });
}

TEST(ShardedModel, ModeNoneNeedsShardGroupOfOne) {
  EXPECT_EQ(*parseShardMode("zero2"), ShardMode::kZero2);
  EXPECT_NE(parseShardMode("zero4").status().message().find("zero4"), std::string::npos);
  forEachMesh([](const Mesh& mesh) {
    auto model = ShardedModel::create(mesh, {ShardMode::kNone, {}});
    EXPECT_EQ(model.ok(), mesh.shape().shardGroupSize() == 1);
    if (!model.ok()) EXPECT_NE(model.status().message().find("mode none"), std::string::npos);
  });
}

TEST(ShardedModel, MismatchedRegistrationFailsOnEveryRank) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks to disagree";
  forEachMesh([](const Mesh& mesh) {
    auto model = ShardedModel::create(mesh, {ShardMode::kZero3, {}});
    ASSERT_TRUE(model.ok());
    const int64_t rows = world().rank() == 1 ? 334 : 333;  // rank 1 disagrees
    ASSERT_TRUE((*model)->addUnit("u", {{"weight", {rows, 7}}}).ok());
    Status s = (*model)->finalize();
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("unit registrations differ across ranks"), std::string::npos);
    EXPECT_NE(s.message().find("rank 1 registered"), std::string::npos) << s.message();
  });
}

}  // namespace
}  // namespace hsdp

namespace hsdp {
namespace {

// Clipping against closed forms: every rank writes gradient (rank + 1) * (i % 7 + 1); the
// averaged gradient is g_i = (W + 1) / 2 * (i % 7 + 1), its norm sqrt(sum g_i^2) is known, and with
// beta1 = beta2 = 0 and a huge eps the update is lr * g * coef / eps, coef = clip / norm.
TEST(ShardedModel, GlobalNormClippingEveryMode) {
  forEachMesh([](const Mesh& mesh) {
    for (ShardMode mode : {ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3}) {
      const AdamConfig adam = probeAdam();
      EngineConfig cfg{mode, adam, /*clip_norm=*/3.0f};
      auto model = ShardedModel::create(mesh, cfg);
      ASSERT_TRUE(model.ok());
      ASSERT_TRUE((*model)->addUnit("a", oddUnit()).ok());
      ASSERT_TRUE((*model)->addUnit("", {{"w", {5}}}).ok());  // the root unit: named "w" alone
      ASSERT_TRUE((*model)->finalize().ok());
      // gradNorm() before every unit's reduceGrad names the first unit without one.
      auto early = (*model)->gradNorm();
      ASSERT_FALSE(early.ok());
      EXPECT_EQ(early.status().code(), StatusCode::kFailedPrecondition);
      EXPECT_NE(early.status().message().find("unit 'a'"), std::string::npos)
          << early.status().message();
      const double W = world().size();
      double sumsq = 0;
      for (int u = 0; u < 2; ++u) {
        const FlatLayout& l = (*model)->layout(u);
        for (size_t p = 0; p < l.params().size(); ++p) {
          auto g = (*model)->grad(u, l.params()[p].name);
          ASSERT_TRUE(g.ok());
          for (size_t i = 0; i < g->numel; ++i) {
            const size_t flat = l.offset(p) + i;
            g->data[i] = float(world().rank() + 1) * float(flat % 7 + 1);
            const double avg = (W + 1) / 2 * double(flat % 7 + 1);
            sumsq += avg * avg;
          }
        }
        ASSERT_TRUE((*model)->reduceGrad(u).ok());
      }
      const double norm = std::sqrt(sumsq), coef = 3.0 / (norm + 1e-6);
      // gradNorm() before the step (zero2 here): the norm step() then clips with, unchanged.
      float before = 0;
      if (mode == ShardMode::kZero2) {
        auto n = (*model)->gradNorm();
        ASSERT_TRUE(n.ok()) << n.status().message();
        before = *n;
        EXPECT_NEAR(before, norm, 1e-4 * norm);
      }
      ASSERT_TRUE((*model)->step().ok());
      EXPECT_NEAR((*model)->lastGradNorm(), norm, 1e-4 * norm) << shardModeName(mode);
      if (mode == ShardMode::kZero2) EXPECT_EQ((*model)->lastGradNorm(), before);
      std::vector<float> full;
      ASSERT_TRUE((*model)->gatherFullParameters(0, &full).ok());
      for (size_t i = 0; i < full.size(); ++i) {
        const double g = (W + 1) / 2 * double(i % 7 + 1) * coef;
        ASSERT_NEAR(full[i], -g / (g + 1e6), 1e-6 * g / 1e6 + 1e-12)
            << shardModeName(mode) << " " << i;
      }
    }
  });
}

// Accumulation: two micro-steps add into the same gradient buffer before one reduction.
TEST(ShardedModel, AccumulatesMicroStepsBeforeReducing) {
  forEachMesh([](const Mesh& mesh) {
    for (ShardMode mode : {ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3}) {
      const AdamConfig adam = probeAdam();
      auto model = ShardedModel::create(mesh, {mode, adam});
      ASSERT_TRUE(model.ok());
      ASSERT_TRUE((*model)->addUnit("a", oddUnit()).ok());
      ASSERT_TRUE((*model)->finalize().ok());
      for (int micro = 0; micro < 2; ++micro) {
        auto g = (*model)->grad(0, "weight");
        ASSERT_TRUE(g.ok());
        for (size_t i = 0; i < g->numel; ++i) g->data[i] += float(micro + 1);  // 1 then 2
      }
      ASSERT_TRUE((*model)->reduceGrad(0).ok());
      ASSERT_TRUE((*model)->step().ok());
      std::vector<float> full;
      ASSERT_TRUE((*model)->gatherFullParameters(0, &full).ok());
      for (size_t i = 0; i < 333 * 7; ++i) ASSERT_NEAR(full[i], -3.0 / (3.0 + 1e6), 1e-12) << i;
      for (size_t i = 333 * 7; i < full.size(); ++i) ASSERT_EQ(full[i], 0.0f) << i;  // no grad
    }
  });
}

}  // namespace
}  // namespace hsdp

namespace hsdp {
namespace {

// CPU offload: the step runs on the worker thread; parameters read right after step() (and the
// next unshard) must already hold the stepped values: a closed form per element, two steps.
TEST(ShardedModel, OffloadedStepLandsBeforeParametersAreRead) {
  forEachMesh([](const Mesh& mesh) {
    for (ShardMode mode : {ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3}) {
      const AdamConfig adam = probeAdam();
      EngineConfig cfg{mode, adam};
      cfg.offload.cpu = true;
      auto model = ShardedModel::create(mesh, cfg);
      ASSERT_TRUE(model.ok()) << model.status().toString();
      ASSERT_TRUE((*model)->addUnit("a", oddUnit()).ok());
      ASSERT_TRUE((*model)->finalize().ok());
      const FlatLayout& l = (*model)->layout(0);
      std::vector<float> expect(l.numel(), 0.0f);
      for (int step = 0; step < 2; ++step) {
        ASSERT_TRUE((*model)->unshard(0).ok());
        ASSERT_TRUE((*model)->waitForUnshard(0).ok());
        auto w = (*model)->param(0, "weight");
        ASSERT_TRUE(w.ok());
        for (size_t i = 0; i < w->numel; ++i) ASSERT_NEAR(w->data[i], expect[i], 1e-12) << i;
        for (size_t p = 0; p < l.params().size(); ++p) {
          auto g = (*model)->grad(0, l.params()[p].name);
          ASSERT_TRUE(g.ok());
          for (size_t i = 0; i < g->numel; ++i) g->data[i] = float((l.offset(p) + i) % 5 + 1);
        }
        ASSERT_TRUE((*model)->reduceGrad(0).ok());
        ASSERT_TRUE((*model)->reshard(0).ok());
        ASSERT_TRUE((*model)->step().ok());
        for (size_t i = 0; i < expect.size(); ++i) {
          const double g = double(i % 5 + 1);
          expect[i] -= float(g / (g + 1e6));
        }
        std::vector<float> full;
        ASSERT_TRUE((*model)->gatherFullParameters(0, &full).ok());
        for (size_t i = 0; i < full.size(); ++i) ASSERT_NEAR(full[i], expect[i], 1e-12) << i;
      }
      const MemoryReport r = (*model)->memoryReport();
      EXPECT_GE(r.offload_host_bytes, 4 * 4 * l.shardNumel());  // master, grad, two moments
    }
    EngineConfig none_cfg{ShardMode::kNone, {}};
    none_cfg.offload.cpu = true;
    auto none = ShardedModel::create(mesh, none_cfg);
    EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  });
}

}  // namespace
}  // namespace hsdp
