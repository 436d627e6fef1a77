// Engine configuration: sharding mode and optimizer.
#pragma once

#include <string_view>

#include "hsdp/optimizer.h"
#include "hsdp/status.h"

namespace hsdp {

enum class ShardMode {
  kNone,   // plain data parallel: parameters, gradients, optimizer state replicated
  kZero3,  // parameters, gradients, optimizer state sharded over the shard group
};

StatusOr<ShardMode> parseShardMode(std::string_view name);  // "none", "zero3"
const char* shardModeName(ShardMode mode);

struct EngineConfig {
  ShardMode mode = ShardMode::kZero3;
  AdamConfig adam;
};

}  // namespace hsdp
