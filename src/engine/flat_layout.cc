#include "hsdp/flat_layout.h"

#include <algorithm>
#include <set>

namespace hsdp {

size_t ParamSpec::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

StatusOr<FlatLayout> FlatLayout::create(std::vector<ParamSpec> params, int shards) {
  if (shards <= 0) return invalidArgument("shard count ", shards, " must be positive");
  if (params.empty()) return invalidArgument("a unit needs at least one parameter");
  std::set<std::string> names;
  FlatLayout l;
  for (const ParamSpec& p : params) {
    if (p.name.empty()) return invalidArgument("a parameter has an empty name");
    if (!names.insert(p.name).second) return invalidArgument("duplicate parameter '", p.name, "'");
    if (p.shape.empty()) return invalidArgument("parameter '", p.name, "' has no dimensions");
    for (int64_t d : p.shape)
      if (d <= 0) return invalidArgument("parameter '", p.name, "' has non-positive dimension ", d);
    l.offsets_.push_back(l.numel_);
    l.numel_ += p.numel();
  }
  l.params_ = std::move(params);
  l.shards_ = shards;
  l.shard_numel_ = (l.numel_ + shards - 1) / shards;
  return l;
}

StatusOr<size_t> FlatLayout::indexOf(std::string_view name) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return i;
  return notFound("no parameter named '", name, "'");
}

std::pair<size_t, size_t> FlatLayout::shardRange(int k) const {
  size_t begin = std::min(numel_, static_cast<size_t>(k) * shard_numel_);
  size_t end = std::min(numel_, begin + shard_numel_);
  return {begin, end};
}

}  // namespace hsdp
