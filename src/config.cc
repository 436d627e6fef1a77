#include "hsdp/config.h"

namespace hsdp {

StatusOr<ShardMode> parseShardMode(std::string_view name) {
  if (name == "none") return ShardMode::kNone;
  if (name == "zero3") return ShardMode::kZero3;
  return invalidArgument("unknown mode '", name, "' (expected none or zero3)");
}

const char* shardModeName(ShardMode mode) { return mode == ShardMode::kNone ? "none" : "zero3"; }

}  // namespace hsdp
