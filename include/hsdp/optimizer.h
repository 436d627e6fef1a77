// Adam and AdamW on fp32 shards, the update PyTorch's torch.optim.Adam/AdamW apply:
//   Adam : g += wd * p
//   AdamW: p *= 1 - lr * wd                       (decoupled weight decay)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#pragma once

#include <cstddef>
#include <cstdint>
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

// The per-step constants of the update: the bias corrections computed in double and each rounded
// to float once. adamStep, the SIMD CPU Adam and the CUDA kernel all take them from here, which is
// half of why they agree bit for bit (the other half: the same float operations per element).
struct AdamStepConstants {
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float decay;         // AdamW: 1 - lr * weight_decay
};
AdamStepConstants adamStepConstants(const AdamConfig& cfg, int64_t t);

// One step (t counts from 1) over n elements of a shard.
void adamStep(const AdamConfig& cfg, int64_t t, float* param, const float* grad, float* exp_avg,
              float* exp_avg_sq, size_t n);

}  // namespace hsdp
