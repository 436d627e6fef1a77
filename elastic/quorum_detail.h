// Internal to elastic/quorum*.cc: the JSON values the quorum keeps in etcd.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "elastic/etcd_client.h"
#include "hsdp/status.h"

namespace hsdp::elastic::quorum_detail {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

inline StatusOr<json> parseValue(const KeyValue& kv) {
  json j = json::parse(kv.value, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return internalError("etcd key '", kv.key, "' holds '", kv.value.substr(0, 100),
                         "', not the JSON object hsdp writes there");
  return j;
}

// A member key's value.
inline std::string memberValue(const std::string& fingerprint, const std::string& address,
                               int64_t ready_step) {
  return json{{"fingerprint", fingerprint}, {"address", address}, {"ready_step", ready_step}}
      .dump();
}

inline int64_t msLeft(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

}  // namespace hsdp::elastic::quorum_detail
