// The examples' optimizer step with gradient accumulation: `accum` micro-steps (forward and
// backward each; the engine adds their gradients), then the step on the shards.
#pragma once

#include "hsdp/sharded_model.h"
#include "hsdp/status.h"

namespace examples {

// micro(k, last) runs micro-step k of the step (last: k == accum - 1, the one whose backward
// reduces the gradients) and returns its loss; the result is the mean of the micro-steps' losses.
template <class Micro>
hsdp::StatusOr<float> accumulateStep(hsdp::ShardedModel& model, int accum, Micro&& micro) {
  float loss = 0;
  for (int k = 0; k < accum; ++k) {
    HSDP_ASSIGN_OR_RETURN(float l, micro(k, k + 1 == accum));
    loss += l / accum;
  }
  HSDP_RETURN_IF_ERROR(model.step());
  return loss;
}

}  // namespace examples
