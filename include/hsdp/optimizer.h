// Adam and AdamW on fp32 shards, the update PyTorch's torch.optim.Adam/AdamW apply:
//   Adam : g += wd * p
//   AdamW: p *= 1 - lr * wd                       (decoupled weight decay)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// What a user sets; the step itself (hsdp::adamStep, the per-step constants) is the library's
// (core/adam.h).
#pragma once

#include <string_view>

#include "hsdp/status.h"

namespace hsdp {

enum class OptimizerKind { kAdam, kAdamW };

struct AdamConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

StatusOr<OptimizerKind> parseOptimizerKind(std::string_view name);  // "adam", "adamw"
const char* optimizerName(OptimizerKind kind);
// Errors name the value: lr <= 0, betas outside [0, 1), eps <= 0, weight_decay < 0.
Status validate(const AdamConfig& cfg);

}  // namespace hsdp
