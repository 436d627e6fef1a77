// Internal to elastic/quorum*.cc: the JSON values the quorum keeps in etcd.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/json.h"
#include "elastic/etcd_client.h"
#include "hsdp/files.h"
#include "hsdp/status.h"

namespace hsdp::elastic::quorum_detail {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

inline StatusOr<json> parseValue(const KeyValue& kv) {
  StatusOr<json> j = hsdp::parseJson(kv.value, strCat("etcd key '", files::quote(kv.key), "'"));
  if (!j.ok() || !j->is_object())
    return internalError("etcd key '", files::quote(kv.key), "' holds '",
                         files::quote(kv.value, 100), "', not the JSON object hsdp writes there",
                         j.ok() ? std::string() : " (" + j.status().message() + ")");
  return std::move(*j);
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
