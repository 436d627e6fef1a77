// What every example's single-process reference shares (train_mlp's Eigen MLP, train_gpt's
// GPT-2): its own Adam/AdamW on Eigen arrays (not hsdp's optimizer), the model of the engine's
// bf16 gradient reduction tree, global-norm clipping, the parity measure, and rank 0's verdict
// shared with the other ranks. Each model's reference (mlp/reference.h, gpt/reference.h) trains
// on these; hsdp's sharded runs must reproduce its parameters.
#pragma once

#include <Eigen/Dense>
#include <string>
#include <vector>

#include "hsdp/mesh.h"
#include "hsdp/optimizer.h"
#include "hsdp/transport.h"

namespace examples {

// How the engine averages the data-parallel ranks' gradients when the reduce dtype is bf16: its
// reduction tree. Every rank's gradient (its slice of each micro-batch, averaged over the
// micro-steps in float) is rounded to bf16 first; then each level in turn: within every group, the
// members' values are summed in float in the listed order, multiplied by float(1/size), optionally
// rounded to bf16, and every member holds the result. The hierarchical reduce-scatter is two bf16
// levels (the intra-node groups, then the inter-node groups); the flat one is one bf16 level (the
// shard groups); the replica all-reduce is a float level (docs/design.md, "bf16 gradients").
struct GradReduction {
  int ranks = 1;  // rank q trains on samples [k*micro + q*micro/ranks, ...) of micro-batch k
  struct Level {
    std::vector<std::vector<int>> groups;  // a partition of 0..ranks-1, each in summation order
    bool bf16 = true;                      // round each group's mean to bf16
  };
  std::vector<Level> levels;
};

// The tree of a mesh (hsdp::meshCoords gives every rank's place): with `hierarchical`, the
// intra-node groups (one node's intra_group, by intra_idx) then the inter-node groups (one
// inter_group's ranks of equal local rank, by inter_idx); without, the shard groups (by shard
// index); then, with replicas, the owners of each shard in float.
GradReduction meshGradReduction(const hsdp::NodeLayout& layout, const hsdp::MeshShape& shape,
                                bool hierarchical);

// Adam/AdamW as in torch.optim, on Eigen arrays: one per tensor (its moments), cfg.lr and
// cfg.weight_decay as the step should use them (a schedule sets lr before each step).
struct EigenAdam {
  hsdp::AdamConfig cfg;
  Eigen::ArrayXf m, v;
  void step(Eigen::Map<Eigen::ArrayXf> p, const Eigen::ArrayXf& grad, int t);
};

// The bf16 tree on per-rank gradients: (*val)[q][t] is rank q's gradient of tensor t, already
// rounded to bf16 by the caller; level by level, every group's members hold the group's float sum
// in member order times float(1/size), rounded to bf16 on the bf16 levels.
void applyGradReduction(const GradReduction& tree,
                        std::vector<std::vector<std::vector<float>>>* val);

// Semi-synchronous replicas' outer step on whole tensors, as the engine takes it on shards
// (docs/semi_sync.md): (*replicas)[r][t] is replica r's tensor t; the tensors in `due` sync.
// local_sgd (`diloco` false): every replica holds the float mean over the replicas (summed in
// replica order, divided by their count). diloco: g = that mean of (anchor - p_r); m = mu*m + g;
// p = anchor - lr*(g + mu*m) for every replica; anchor = p. `anchor` and `momentum` are per tensor.
// Streaming DiLoCo's delay tau: start() takes that mean (of anchor - p_r, or of p_r) into
// `pending` after step t, land() applies it after step t + tau to every replica (alpha = 0: the
// tensor takes the synced value) as sync() does at once.
struct OuterReference {
  bool diloco = false;
  float lr = 0.7f, mu = 0.9f;
  std::vector<std::vector<float>> anchor, momentum, pending;
  void sync(const std::vector<int>& due, std::vector<std::vector<std::vector<float>>>* replicas);
  void start(const std::vector<int>& due, const std::vector<std::vector<std::vector<float>>>& reps);
  void land(const std::vector<int>& due, std::vector<std::vector<std::vector<float>>>* replicas);
};

// torch.nn.utils.clip_grad_norm_: when the global L2 norm (in double) exceeds clip_norm, every
// gradient is scaled by clip_norm / (norm + 1e-6).
void clipGradients(float clip_norm, std::vector<std::vector<float>>* grads);

// max over layers of max|a - b| / max|b|: the error relative to each tensor's scale. Infinite
// when any value of either is NaN or infinite (a parity check must not pass on NaN: every
// comparison with NaN is false, so max() would skip it), or when the shapes differ.
// The first NaN or infinite value of `run` or `ref`, as "<name of tensor t> element i is nan in
// the sharded run" (names[t], or "tensor t"); "" when every value is finite.
std::string firstNonFinite(const std::vector<std::vector<float>>& run,
                           const std::vector<std::vector<float>>& ref,
                           const std::vector<std::string>& names = {});
double maxRelativeError(const std::vector<std::vector<float>>& a,
                        const std::vector<std::vector<float>>& b);

// Rank 0's verdict {max_rel_err, pass} to every rank (the others pass zeros: the values are
// summed), after rank 0 trained the reference. The others wait asleep and untimed
// (hsdp::watchdog::waitForPeerWork): a reference that takes longer than HSDP_TIMEOUT_S is healthy
// local work, not a hang, and the cores are rank 0's meanwhile.
[[nodiscard]] hsdp::Status shareVerdict(hsdp::Comm& world, float verdict[2]);

}  // namespace examples
