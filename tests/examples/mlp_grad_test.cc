// The example model's backward pass against central finite differences of its loss, and the
// reference trainer's own Adam against the closed form. These make the Eigen reference an
// independent truth: its gradients are checked here, not only compared with hsdp.
#include <gtest/gtest.h>

#include <cmath>

#include "mlp/mlp.h"
#include "mlp/reference.h"

namespace {

using mlp::Matrix;

double lossOf(const mlp::Spec& spec, std::vector<std::vector<float>>& params,
              const mlp::Batch& batch, std::vector<std::vector<float>>* grads) {
  const int L = spec.layers();
  std::vector<Matrix> acts(L + 1);
  acts[0] = batch.x;
  for (int l = 0; l < L; ++l) {
    const int in = spec.dims[l], out = spec.dims[l + 1];
    Matrix z;
    mlp::linearForward(params[l].data(), params[l].data() + out * in, out, in, acts[l], &z);
    acts[l + 1] = l + 1 < L ? Matrix(z.array().tanh()) : z;
  }
  Matrix dz;
  const double loss = mlp::crossEntropy(acts[L], batch.labels, &dz);
  if (grads) {
    grads->resize(L);
    for (int l = L - 1; l >= 0; --l) {
      const int in = spec.dims[l], out = spec.dims[l + 1];
      (*grads)[l].assign(params[l].size(), 0.0f);
      Matrix dx;
      mlp::linearBackward(params[l].data(), out, in, acts[l], dz, (*grads)[l].data(),
                          (*grads)[l].data() + out * in, l > 0 ? &dx : nullptr);
      if (l > 0) dz = (dx.array() * (1.0f - acts[l].array().square())).matrix();
    }
  }
  return loss;
}

TEST(MlpExample, BackwardMatchesFiniteDifferences) {
  mlp::Spec spec;
  spec.dims = {5, 7, 6, 3};
  mlp::Batch batch = mlp::makeBatch(spec, 0, 0, 4);
  std::vector<std::vector<float>> params(spec.layers()), grads;
  for (int l = 0; l < spec.layers(); ++l) {
    std::vector<float> w, b;
    mlp::initLayer(spec, l, &w, &b);
    params[l] = w;
    params[l].insert(params[l].end(), b.begin(), b.end());
  }
  lossOf(spec, params, batch, &grads);
  const float h = 1e-2f;
  for (int l = 0; l < spec.layers(); ++l) {
    for (size_t i = 0; i < params[l].size(); ++i) {
      const float keep = params[l][i];
      params[l][i] = keep + h;
      const double up = lossOf(spec, params, batch, nullptr);
      params[l][i] = keep - h;
      const double down = lossOf(spec, params, batch, nullptr);
      params[l][i] = keep;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(grads[l][i], fd, 2e-3 + 2e-2 * std::fabs(fd)) << "layer " << l << " i " << i;
    }
  }
}

TEST(MlpExample, BatchesAreDeterministicSlices) {
  mlp::Spec spec;
  mlp::Batch whole = mlp::makeBatch(spec, 3, 0, 12);
  mlp::Batch part = mlp::makeBatch(spec, 3, 4, 4);
  EXPECT_EQ(Matrix(whole.x.middleCols(4, 4)), part.x);
  EXPECT_EQ(std::vector<int>(whole.labels.begin() + 4, whole.labels.begin() + 8), part.labels);
}

// The reference's optimizer on a one-layer model whose loss gradient we do not need: zero steps
// leave the init; the loss decreases over training (the task is learnable).
TEST(MlpExample, ReferenceTrains) {
  mlp::Spec spec;
  spec.dims = {32, 64, 10};
  hsdp::AdamConfig adam;
  adam.lr = 1e-2f;
  mlp::ReferenceResult r = mlp::trainReference(spec, adam, 30, 64);
  ASSERT_EQ(r.losses.size(), 30u);
  EXPECT_LT(r.losses.back(), 0.8 * r.losses.front());
  mlp::ReferenceResult r0 = mlp::trainReference(spec, adam, 0, 64);
  std::vector<float> w, b;
  mlp::initLayer(spec, 0, &w, &b);
  EXPECT_EQ(std::vector<float>(r0.params[0].begin(), r0.params[0].begin() + w.size()), w);
}

TEST(MlpExample, RelativeErrorIsScaledPerTensor) {
  EXPECT_DOUBLE_EQ(examples::maxRelativeError({{1, 2}, {10}}, {{1, 2}, {10}}), 0.0);
  EXPECT_NEAR(examples::maxRelativeError({{1, 2.5f}}, {{1, 2}}), 0.25, 1e-12);
  EXPECT_TRUE(std::isinf(examples::maxRelativeError({{1}}, {{1, 2}})));
}

}  // namespace

namespace {

// The bf16 reduction tree the reference follows, against the mesh layout written out by hand:
// 8 ranks as 2 nodes x 4, intra_shard 2 x inter_shard 2, so 2 replicas. Rank r sits on node r/4
// with local rank r%4; intra_idx = local%2, intra_group = local/2; inter_idx = node.
TEST(MeshGradReduction, EightRanksTwoByTwoWithReplicas) {
  auto layout = hsdp::virtualNodeLayout(8, 4);
  ASSERT_TRUE(layout.ok());
  hsdp::MeshShape shape{8, 2, 4, 2, 2};
  using Groups = std::vector<std::vector<int>>;
  examples::GradReduction hier = examples::meshGradReduction(*layout, shape, /*hierarchical=*/true);
  EXPECT_EQ(hier.ranks, 8);
  ASSERT_EQ(hier.levels.size(), 3u);
  EXPECT_EQ(hier.levels[0].groups, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));  // intra
  EXPECT_EQ(hier.levels[1].groups, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));  // inter
  EXPECT_TRUE(hier.levels[0].bf16 && hier.levels[1].bf16);
  // Replicas: owners of shard k = intra_idx*2 + inter_idx are {r, r+2} (intra_group 0 and 1).
  EXPECT_EQ(hier.levels[2].groups, (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_FALSE(hier.levels[2].bf16);

  examples::GradReduction flat =
      examples::meshGradReduction(*layout, shape, /*hierarchical=*/false);
  ASSERT_EQ(flat.levels.size(), 2u);
  // Shard group of replica 0: shard 0 = rank 0, 1 = rank 4 (node 1), 2 = rank 1, 3 = rank 5.
  EXPECT_EQ(flat.levels[0].groups, (Groups{{0, 4, 1, 5}, {2, 6, 3, 7}}));
}

}  // namespace
