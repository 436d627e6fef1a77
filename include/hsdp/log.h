// NCCL_DEBUG-style logging. HSDP_DEBUG=WARN|INFO|TRACE picks the level (default WARN);
// HSDP_DEBUG_SUBSYS=INIT,MESH,COLL,SHARD,OPTIM,OFFLOAD,TOPO (or ALL, the default; a leading ^
// excludes) picks subsystems. Lines go to stderr as "host:pid [rank] hsdp LEVEL SUBSYS message".
#pragma once

#include <string>

#include "hsdp/status.h"

namespace hsdp::log {

enum class Level { kNone = 0, kWarn = 1, kInfo = 2, kTrace = 3 };

enum Subsys : unsigned {
  kInit = 1u << 0,
  kMesh = 1u << 1,
  kColl = 1u << 2,
  kShard = 1u << 3,
  kOptim = 1u << 4,
  kOffload = 1u << 5,
  kTopo = 1u << 6,
  kAll = ~0u,
};

// Set once the transport knows this process's world rank; until then lines show [-].
void setRank(int rank);
bool enabled(Level level, Subsys subsys);
void write(Level level, Subsys subsys, const std::string& message);
// HSDP_DEBUG and HSDP_DEBUG_SUBSYS as the environment gives them: an unknown level, an empty or
// unknown subsystem in the list is an error naming the variable and the value (the session calls
// it at start; logging itself never fails and falls back to WARN / ALL).
[[nodiscard]] Status checkSettings();

}  // namespace hsdp::log

#define HSDP_LOG(level, subsys, ...)                                          \
  do {                                                                        \
    if (::hsdp::log::enabled(::hsdp::log::Level::level, ::hsdp::log::subsys)) \
      ::hsdp::log::write(::hsdp::log::Level::level, ::hsdp::log::subsys,      \
                         ::hsdp::strCat(__VA_ARGS__));                        \
  } while (0)
#define HSDP_WARN(subsys, ...) HSDP_LOG(kWarn, subsys, __VA_ARGS__)
#define HSDP_INFO(subsys, ...) HSDP_LOG(kInfo, subsys, __VA_ARGS__)
#define HSDP_TRACE(subsys, ...) HSDP_LOG(kTrace, subsys, __VA_ARGS__)
