// The GPT-2 model of train_gpt: its configuration and presets, its units (what each registers
// with the engine, under GPT-2's tensor names), its initial values, and Model: the forward and
// backward of one unit at a time on the caller's parameter buffers, with the activations each
// block keeps for backward.
//
// Units, in registration order: "wte" (token embedding, weight [V, d]), "wpe" (position
// embedding, weight [context, d]), "h.0" ... "h.{L-1}" (one transformer block each: ln_1,
// attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj), "ln_f". unit + "." + param is the GPT-2
// tensor name (h.3.attn.c_attn.weight). The LM head is tied to wte: wte appears twice in the unit
// order, first as the embedding, last as the head (unitOrder). The engine's schedule
// (hsdp/schedule.h) gathers wte for each use and, in backward, reduces its gradient once, after
// its last use: the head's gradient (backward's first position) and the embedding's (backward's
// last) add into the same gradient buffer before the one reduceGrad.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpt/layers.h"
#include "hsdp/flat_layout.h"
#include "hsdp/status.h"

namespace gpt {

struct Config {
  int layers = 4;
  int d_model = 128;
  int heads = 4;
  int context = 64;  // longest sequence (wpe rows); training sequences are this long
  int vocab = 256;   // byte-level tokens
  uint64_t seed = 1234;
  size_t paramCount() const;
  // Parameters in matrix products (every block's four weights and the tied wte as the head):
  // the N of "6 N FLOPs per token".
  size_t matmulParamCount() const;
};

// "tiny" (4 layers, d 128, 4 heads, context 64: tests) or "small" (6 layers, d 384, 6 heads,
// context 128: the demo, 10.8 M parameters); InvalidArgument naming anything else.
hsdp::StatusOr<Config> preset(const std::string& name);
// d_model divisible by heads, everything positive, context >= 2.
hsdp::Status validate(const Config& cfg);

enum class UnitKind { kTokenEmbedding, kPositionEmbedding, kBlock, kFinalNorm };

struct UnitInfo {
  std::string name;  // "wte", "wpe", "h.<l>", "ln_f"
  UnitKind kind;
  int layer = -1;                       // blocks only
  std::vector<hsdp::ParamSpec> params;  // GPT-2 names and shapes; decay on matrices only
};

// The units in registration order: wte, wpe, h.0..h.{L-1}, ln_f (index 2 + l is block l).
std::vector<UnitInfo> units(const Config& cfg);
constexpr int kWte = 0, kWpe = 1;
inline int blockUnit(int layer) { return 2 + layer; }
inline int finalNormUnit(const Config& cfg) { return 2 + cfg.layers; }
// Forward order of the units: wte, wpe, h.0, ..., h.{L-1}, ln_f, wte (the tied head).
std::vector<int> unitOrder(const Config& cfg);

// The unit's deterministic initial values in its flat layout (parameters back to back in
// registration order), GPT-2's scheme: weights N(0, 0.02), residual projections (c_proj)
// N(0, 0.02 / sqrt(2 L)), wpe N(0, 0.01), biases 0, norms 1 and 0. The same on every rank.
std::vector<float> initUnit(const Config& cfg, int unit);

// Forward and backward of the model one position of unitOrder() at a time. The caller passes the
// unit's parameters (and for backward its gradient buffers) as one pointer per ParamSpec of the
// unit, in registration order; gradients are ADDED. Activations live here between forward and
// backward, allocated on the first batch and reused while the batch shape stays the same.
class Model {
 public:
  // checkpoint: keep only each block's input in forward and recompute the block's forward in
  // backward (activation checkpointing per block).
  Model(const Config& cfg, bool checkpoint);

  // The next forward's batch: B sequences of T <= context tokens (B*T each, sequence-major);
  // targets may be null (forward only: no loss). grad_scale multiplies the loss gradient
  // (1/accum for gradient accumulation). The arrays must outlive the forward and backward.
  void setBatch(int B, int T, const int32_t* tokens, const int32_t* targets,
                float grad_scale = 1.0f);

  // Position pos of unitOrder(): the embedding, a block, the final norm, or the head (the last
  // position: logits, and with targets the loss and its gradient).
  void forward(int pos, std::span<const float* const> params);
  // Position pos in reverse (call from the last position down to 0).
  void backward(int pos, std::span<const float* const> params, std::span<float* const> grads);

  float loss() const { return loss_; }
  const Matrix& logits() const { return logits_; }  // V x B*T after the head's forward
  const Config& config() const { return cfg_; }
  size_t activationBytes() const;  // bytes the activations and backward scratch hold now

 private:
  struct BlockCache {
    Matrix ln1, qkv, probs, atty, x2, ln2, fch, fcg;
    Vector mean1, rstd1, mean2, rstd2;
  };
  void blockForward(int l, std::span<const float* const> p);
  void blockBackward(int l, std::span<const float* const> p, std::span<float* const> g);
  BlockCache& cache(int l) { return checkpoint_ ? caches_[0] : caches_[l]; }

  Config cfg_;
  bool checkpoint_;
  int B_ = 0, T_ = 0;
  const int32_t* tokens_ = nullptr;
  const int32_t* targets_ = nullptr;
  float grad_scale_ = 1.0f;
  std::vector<Matrix> xs_;  // xs_[l]: block l's input (xs_[L]: the last block's output)
  std::vector<BlockCache> caches_;
  Matrix xf_;  // ln_f output
  Vector meanf_, rstdf_;
  Matrix logits_, dlogits_;
  float loss_ = 0.0f;
  // Backward: the residual stream's gradient and the block's scratch.
  Matrix dx_, dbig_, dqkv_, dsmall_, dattn_, dscores_;
};

}  // namespace gpt
