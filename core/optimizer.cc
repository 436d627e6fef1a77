#include "hsdp/optimizer.h"

#include <cmath>

#include "core/adam.h"

namespace hsdp {

StatusOr<OptimizerKind> parseOptimizerKind(std::string_view name) {
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "adamw") return OptimizerKind::kAdamW;
  return invalidArgument("unknown optimizer '", name, "' (expected adam or adamw)");
}

const char* optimizerName(OptimizerKind kind) {
  return kind == OptimizerKind::kAdam ? "adam" : "adamw";
}

// The one check of Adam's settings: ShardedModel::create, the CPU Adam, the examples' flags and
// every checkpoint load (its stored settings) use it. NaN fails every comparison below.
Status validate(const AdamConfig& c) {
  if (!(c.lr > 0.0f) || !std::isfinite(c.lr))
    return invalidArgument("learning rate ", c.lr, " must be positive and finite");
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f))
    return invalidArgument("beta1 ", c.beta1, " must be in [0, 1)");
  if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f))
    return invalidArgument("beta2 ", c.beta2, " must be in [0, 1)");
  if (!(c.eps > 0.0f) || !std::isfinite(c.eps))
    return invalidArgument("eps ", c.eps, " must be positive and finite");
  if (!(c.weight_decay >= 0.0f) || !std::isfinite(c.weight_decay))
    return invalidArgument("weight decay ", c.weight_decay, " must be >= 0 and finite");
  return okStatus();
}

Status checkAdamStep(const AdamConfig& cfg, int64_t t, const AdamShard& shard, float grad_scale,
                     const char* stepper) {
  HSDP_RETURN_IF_ERROR(validate(cfg));
  if (t < 1) return invalidArgument("Adam step t=", t, " must be >= 1");
  if (!(grad_scale >= 0.0f) || !std::isfinite(grad_scale))
    return invalidArgument("gradient scale ", grad_scale, " must be finite and >= 0");
  if (shard.n == 0) return okStatus();
  const char* missing = shard.param == nullptr        ? "param"
                        : shard.grad == nullptr       ? "grad"
                        : shard.exp_avg == nullptr    ? "exp_avg"
                        : shard.exp_avg_sq == nullptr ? "exp_avg_sq"
                                                      : nullptr;
  if (missing != nullptr)
    return invalidArgument(stepper, " shard of ", shard.n, " elements has a null ", missing,
                           " array");
  return okStatus();
}

AdamCoeffs adamCoefficients(const AdamConfig& c, int64_t t, float grad_scale) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(t));
  AdamCoeffs k;
  k.beta1 = c.beta1;
  k.beta2 = c.beta2;
  k.one_minus_beta1 = 1.0f - c.beta1;
  k.one_minus_beta2 = 1.0f - c.beta2;
  k.step_size = static_cast<float>(c.lr / bc1);
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  k.eps = c.eps;
  k.weight_decay = c.weight_decay;
  k.decay = 1.0f - c.lr * c.weight_decay;
  k.grad_scale = grad_scale;
  k.adamw = c.kind == OptimizerKind::kAdamW;
  return k;
}

void adamStep(const AdamConfig& c, int64_t t, float* p, const float* g, float* m, float* v,
              size_t n) {
  const AdamCoeffs k = adamCoefficients(c, t);
  const float step_size = k.step_size, inv_sqrt_bc2 = k.inv_sqrt_bc2, decay = k.decay;
  const float b1 = k.beta1, b2 = k.beta2, omb1 = k.one_minus_beta1, omb2 = k.one_minus_beta2;
  const bool adamw = k.adamw;
  const float wd = k.weight_decay;
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i];
    float pi = p[i];
    if (adamw)
      pi *= decay;
    else
      gi += wd * pi;
    float mi = b1 * m[i] + omb1 * gi;
    float vi = b2 * v[i] + omb2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + c.eps);
  }
}

}  // namespace hsdp
