// Adam and AdamW on fp32 shards, the update PyTorch's torch.optim.Adam/AdamW apply:
//   Adam : g += wd * p
//   AdamW: p *= 1 - lr * wd                       (decoupled weight decay)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hsdp/adam_coeffs.h"
#include "hsdp/dtype.h"
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

// The constants of step t (counting from 1) with the gradient multiplied by grad_scale first:
// the one place they are computed (hsdp/adam_coeffs.h says why that matters).
AdamCoeffs adamCoefficients(const AdamConfig& cfg, int64_t t, float grad_scale = 1.0f);

// One shard's arrays, n elements each, in the memory the stepper works on (host for adamStep and
// the CPU Adam, device for the CUDA kernel), not overlapping. param_bf16, when not null, receives
// the updated parameters rounded to bf16 (round to nearest even, as hsdp::toBf16).
struct AdamShard {
  float* param = nullptr;
  const float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  size_t n = 0;
  bf16* param_bf16 = nullptr;
};

// One step (t counts from 1) over n elements of a shard.
void adamStep(const AdamConfig& cfg, int64_t t, float* param, const float* grad, float* exp_avg,
              float* exp_avg_sq, size_t n);

}  // namespace hsdp
