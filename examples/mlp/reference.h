// The MLP's single-process reference: the same model trained on the whole global batch by one
// process with Eigen and the examples' own Adam/AdamW (common/reference.h), no engine. hsdp's
// sharded runs must reproduce its parameters (train_mlp --check).
#pragma once

#include <vector>

#include "common/membership.h"
#include "common/reference.h"
#include "hsdp/config.h"
#include "hsdp/optimizer.h"
#include "mlp/mlp.h"

namespace mlp {

struct ReferenceResult {
  // Per layer, the flat parameter vector in the unit's layout: weight (out x in, column-major)
  // then bias.
  std::vector<std::vector<float>> params;
  std::vector<float> losses;  // loss of each step, before its update
};

// Elastic groups that keep their slice (common/reference.h).
using Membership = examples::Membership;

// clip_norm > 0 clips the global gradient norm as torch.nn.utils.clip_grad_norm_ does.
// bf16_params: forward and backward use the parameters rounded to bf16 (the master stays fp32).
// bf16_grads (not null): the gradient is reduced in bf16 through that tree, with `accum`
// micro-steps per step; null: the exact mean gradient of the whole batch in float.
ReferenceResult trainReference(const Spec& spec, const hsdp::AdamConfig& adam, int steps,
                               int global_batch, float clip_norm = 0.0f, bool bf16_params = false,
                               const examples::GradReduction* bf16_grads = nullptr, int accum = 1,
                               const Membership* membership = nullptr);

// Semi-synchronous replicas (hsdp::ReplicaSyncPolicy, docs/semi_sync.md): every replica trains
// its own copy on its ranks' slices of each step's global batch (replica_ranks[r]: the world
// ranks of replica r, of `world` ranks; rank q's slice of micro-batch k is as in train_mlp), with
// its own Adam and its own clipping; after inner step t the layers whose fragment is due sync
// (examples::OuterReference). bf16_params: forward and backward see the parameters rounded to
// bf16. Returns each replica's parameters, and the outer state.
struct ReplicaReferenceResult {
  std::vector<std::vector<std::vector<float>>> params;  // [replica][layer]
  examples::OuterReference outer;
};
ReplicaReferenceResult trainReplicaReference(const Spec& spec, const hsdp::AdamConfig& adam,
                                             int steps, int global_batch, float clip_norm,
                                             int accum, int world,
                                             const std::vector<std::vector<int>>& replica_ranks,
                                             const hsdp::ReplicaSyncPolicy& policy,
                                             bool bf16_params = false);

}  // namespace mlp
