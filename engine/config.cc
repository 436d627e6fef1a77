#include "hsdp/config.h"

namespace hsdp {

StatusOr<ShardMode> parseShardMode(std::string_view name) {
  if (name == "none") return ShardMode::kNone;
  if (name == "zero1") return ShardMode::kZero1;
  if (name == "zero2") return ShardMode::kZero2;
  if (name == "zero3") return ShardMode::kZero3;
  return invalidArgument("unknown mode '", name, "' (expected none, zero1, zero2 or zero3)");
}

const char* shardModeName(ShardMode mode) {
  switch (mode) {
    case ShardMode::kNone: return "none";
    case ShardMode::kZero1: return "zero1";
    case ShardMode::kZero2: return "zero2";
    case ShardMode::kZero3: return "zero3";
  }
  return "?";
}

StatusOr<Device> parseDevice(std::string_view name) {
  if (name == "cpu") return Device::kHost;
  if (name == "cuda") return Device::kCuda;
  return invalidArgument("unknown device '", name, "' (expected cpu or cuda)");
}

const char* deviceName(Device d) {
  switch (d) {
    case Device::kHost: return "cpu";
    case Device::kCuda: return "cuda";
  }
  return "?";
}

}  // namespace hsdp
