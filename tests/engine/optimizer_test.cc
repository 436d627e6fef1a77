// Adam/AdamW against closed forms.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/adam.h"

namespace hsdp {
namespace {

// With a constant gradient g, m_t = (1-b1^t) g and v_t = (1-b2^t) g^2, so the bias-corrected
// step is exactly lr * g / (|g| + eps) every step: p_t = p_0 - t * lr * g / (|g| + eps).
TEST(Adam, ConstantGradientClosedForm) {
  AdamConfig c;
  c.kind = OptimizerKind::kAdam;
  c.lr = 0.01f;
  const std::vector<float> g = {0.5f, -2.0f, 1e-3f, 0.0f, 3.0f};
  std::vector<float> p = {1.0f, 1.0f, -1.0f, 0.25f, 0.0f}, p0 = p, m(5, 0), v(5, 0);
  for (int t = 1; t <= 50; ++t) adamStep(c, t, p.data(), g.data(), m.data(), v.data(), 5);
  for (int i = 0; i < 5; ++i) {
    const double want = p0[i] - 50.0 * c.lr * g[i] / (std::fabs(g[i]) + c.eps);
    EXPECT_NEAR(p[i], want, 2e-5) << i;
  }
}

// AdamW with a zero gradient only decays: p_t = p_0 (1 - lr wd)^t.
TEST(AdamW, DecoupledDecayClosedForm) {
  AdamConfig c;
  c.kind = OptimizerKind::kAdamW;
  c.lr = 0.1f;
  c.weight_decay = 0.5f;
  std::vector<float> p = {2.0f, -4.0f}, g(2, 0.0f), m(2, 0), v(2, 0);
  for (int t = 1; t <= 10; ++t) adamStep(c, t, p.data(), g.data(), m.data(), v.data(), 2);
  EXPECT_NEAR(p[0], 2.0 * std::pow(0.95, 10), 1e-5);
  EXPECT_NEAR(p[1], -4.0 * std::pow(0.95, 10), 1e-5);
}

// Adam's L2 decay enters the gradient: one step from m = v = 0 moves by lr * sign(g + wd p).
TEST(Adam, CoupledDecayFirstStep) {
  AdamConfig c;
  c.kind = OptimizerKind::kAdam;
  c.lr = 0.1f;
  c.weight_decay = 1.0f;
  std::vector<float> p = {2.0f}, g = {-1.0f}, m(1, 0), v(1, 0);  // g + wd p = 1
  adamStep(c, 1, p.data(), g.data(), m.data(), v.data(), 1);
  EXPECT_NEAR(p[0], 2.0f - 0.1f, 1e-6);
}

TEST(AdamConfig, ValidationNamesTheValue) {
  AdamConfig c;
  c.lr = -1.0f;
  EXPECT_NE(validate(c).message().find("learning rate -1"), std::string::npos);
  c = AdamConfig();
  c.beta2 = 1.0f;
  EXPECT_FALSE(validate(c).ok());
  EXPECT_FALSE(parseOptimizerKind("sgd").ok());
}

}  // namespace
}  // namespace hsdp
