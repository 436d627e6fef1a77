// A unit's parameters flattened into one buffer, FSDP-style: parameters back to back in
// registration order, the total padded up to a multiple of the shard count so every rank owns an
// equal, contiguous shard. Shard k covers flat elements [k*shardNumel(), (k+1)*shardNumel()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hsdp/status.h"

namespace hsdp {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  // AdamW's decoupled weight decay (and Adam's L2 term) applies to this parameter. GPT-style
  // training decays matrices only: false for biases, norms and embeddings.
  bool weight_decay = true;
  size_t numel() const;
};

class FlatLayout {
 public:
  FlatLayout() = default;
  // Errors: no parameters, an empty or duplicate name, a non-positive dimension, shards <= 0.
  static StatusOr<FlatLayout> create(std::vector<ParamSpec> params, int shards);

  const std::vector<ParamSpec>& params() const { return params_; }
  size_t offset(size_t i) const { return offsets_[i]; }
  size_t numel() const { return numel_; }
  size_t paddedNumel() const { return shard_numel_ * shards_; }
  size_t shardNumel() const { return shard_numel_; }
  int shards() const { return shards_; }
  StatusOr<size_t> indexOf(std::string_view name) const;

  // Flat range [begin, end) of shard k, clipped to the unpadded elements (may be empty).
  std::pair<size_t, size_t> shardRange(int k) const;

 private:
  std::vector<ParamSpec> params_;
  std::vector<size_t> offsets_;
  size_t numel_ = 0;
  size_t shard_numel_ = 0;
  int shards_ = 1;
};

}  // namespace hsdp
