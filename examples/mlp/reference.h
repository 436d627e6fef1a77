// The single-process reference: the same model trained on the whole global batch by one process
// with Eigen, with its own Adam/AdamW written against Eigen arrays (not hsdp's optimizer). hsdp's
// sharded runs must reproduce its parameters.
#pragma once

#include <vector>

#include "hsdp/optimizer.h"
#include "mlp/mlp.h"

namespace mlp {

struct ReferenceResult {
  // Per layer, the flat parameter vector in the unit's layout: weight (out x in, column-major)
  // then bias.
  std::vector<std::vector<float>> params;
  std::vector<float> losses;  // loss of each step, before its update
};

// clip_norm > 0 clips the global gradient norm as torch.nn.utils.clip_grad_norm_ does.
// bf16_params: forward and backward use the parameters rounded to bf16 (the master stays fp32);
// bf16_grads: the gradient is reduced in bf16 as by `ranks` data-parallel ranks with `accum`
// micro-steps each: every rank's gradient is rounded to bf16, the mean of those is rounded again.
// The roundings a bf16 policy applies.
ReferenceResult trainReference(const Spec& spec, const hsdp::AdamConfig& adam, int steps,
                               int global_batch, float clip_norm = 0.0f,
                               bool bf16_params = false, bool bf16_grads = false, int ranks = 1,
                               int accum = 1);

// max over layers of max|a - b| / max|b|: the error relative to each tensor's scale.
double maxRelativeError(const std::vector<std::vector<float>>& a,
                        const std::vector<std::vector<float>>& b);

}  // namespace mlp
