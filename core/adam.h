// The steppers' side of Adam/AdamW (private to the library): the per-step constants, the shard a
// step works on and the reference step. What a user configures (OptimizerKind, AdamConfig) is
// public, in hsdp/optimizer.h; every implementation of the step (hsdp::adamStep, the CPU Adam,
// the CUDA kernel) works from these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/adam_coeffs.h"
#include "hsdp/dtype.h"
#include "hsdp/optimizer.h"

namespace hsdp {

// The constants of step t (counting from 1) with the gradient multiplied by grad_scale first:
// the one place they are computed (core/adam_coeffs.h says why that matters).
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

// The checks every stepper makes of a step's arguments, in this order: the settings
// (hsdp::validate), t >= 1, a finite grad_scale >= 0, and no null array when n > 0. Errors are
// InvalidArgument naming the value; `stepper` names the caller in the last ("GPU Adam shard of
// ...").
Status checkAdamStep(const AdamConfig& cfg, int64_t t, const AdamShard& shard, float grad_scale,
                     const char* stepper);

// One step (t counts from 1) over n elements of a shard.
void adamStep(const AdamConfig& cfg, int64_t t, float* param, const float* grad, float* exp_avg,
              float* exp_avg_sq, size_t n);

}  // namespace hsdp
