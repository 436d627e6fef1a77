// What a training run is (the settings train_gpt and the reference share: optimizer, schedule,
// batching) and the single-process reference: the same model code (gpt/model.h) trained on the
// whole global batch in one process with its own AdamW (examples::EigenAdam), no engine. train_gpt
// --check compares the engine's parameters after training with the reference's.
#pragma once

#include <cstdint>
#include <vector>

#include "common/membership.h"
#include "common/reference.h"
#include "gpt/data.h"
#include "gpt/model.h"
#include "hsdp/optimizer.h"

namespace gpt {

// Linear warm-up over `warmup` steps to `lr`, then cosine decay to `min_lr` at step `steps`.
struct LrSchedule {
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int warmup = 0;
  int steps = 1;
  float at(int step) const;  // the rate of step `step` (0-based)
};

struct TrainSettings {
  hsdp::AdamConfig adam;  // lr here is unused: the schedule gives each step's rate
  LrSchedule schedule;
  int steps = 0;
  int batch = 1;  // sequences per global batch
  int accum = 1;  // micro-steps per step
  float clip_norm = 0.0f;
  uint64_t data_seed = 1;
  bool checkpoint = false;       // activation checkpointing (same values, recomputed)
  bool allow_nonfinite = false;  // train on through a non-finite loss or norm (train_gpt's loop)
};

// The sequences [first, first + count) of step `step`'s global batch, context-long: tokens and
// targets, count * context each.
void fillBatch(const Corpus& corpus, const Config& cfg, uint64_t seed, int64_t step, int64_t first,
               int count, std::vector<int32_t>* tokens, std::vector<int32_t>* targets);

// The unit's parameter pointers in registration order, from its flat vector (reference and
// tests: the flat layout of gpt::units).
std::vector<const float*> paramPointers(const UnitInfo& unit, const std::vector<float>& flat);
std::vector<float*> gradPointers(const UnitInfo& unit, std::vector<float>* flat);

// Forward and backward of one batch through the model on flat per-unit parameters; gradients
// ADDED into *grads (one flat vector per unit, sized like params). Returns the loss.
float modelGradients(Model& model, const std::vector<UnitInfo>& units,
                     const std::vector<std::vector<float>>& params, int B, const int32_t* tokens,
                     const int32_t* targets, float grad_scale,
                     std::vector<std::vector<float>>* grads);

struct ReferenceResult {
  std::vector<std::vector<float>> params;  // per unit, flat, after training
  std::vector<float> losses;               // each step's loss, before its update
};

// Elastic groups that keep their slice (common/reference.h).
using Membership = examples::Membership;

// bf16_params: forward and backward see the parameters rounded to bf16 (the master stays fp32).
// bf16_grads (not null): each rank's gradient (its slice of every micro-batch, averaged over the
// micro-steps) rounded to bf16 and reduced through that tree (the mesh's, examples::GradReduction);
// null: the exact mean gradient of the whole global batch.
// membership (not null, elastic keep-slice): the gradient of each step replays the groups present
// (exact float means; bf16_grads is then not modelled).
ReferenceResult trainReference(const Config& cfg, const Corpus& corpus, const TrainSettings& s,
                               bool bf16_params = false,
                               const examples::GradReduction* bf16_grads = nullptr,
                               const Membership* membership = nullptr);

// Splits per-unit flat vectors into per-tensor ones (for a per-tensor relative error).
std::vector<std::vector<float>> perTensor(const std::vector<UnitInfo>& units,
                                          const std::vector<std::vector<float>>& flat);

}  // namespace gpt
