#include "hsdp/env.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace hsdp::env {

const std::vector<Param>& registry() {
  static const std::vector<Param> params = {
      {"HSDP_DEBUG", "enum", "WARN", "Log level: NONE, WARN, INFO or TRACE (to stderr)."},
      {"HSDP_DEBUG_SUBSYS", "string", "ALL",
       "Comma-separated log subsystems: INIT, MESH, COLL, SHARD, OPTIM, OFFLOAD, TOPO, ALL; a "
       "leading ^ excludes the listed ones."},
      {"HSDP_RANKS_PER_NODE", "int", "",
       "Virtual nodes for one-machine runs: group consecutive world ranks into nodes of this "
       "many ranks instead of grouping by shared-memory host. Must divide the world size."},
      {"HSDP_HIER", "bool", "1",
       "Run the engine's all-gather and reduce-scatter as hierarchical schedules (inter then "
       "intra, intra then inter). 0 uses one flat collective over the shard group."},
      {"HSDP_MALLOC_TUNE", "bool", "1",
       "Keep freed heap memory mapped (glibc mallopt) so the MPI library's per-call temporary "
       "buffers reuse pre-faulted pages instead of faulting in fresh ones each call."},
      {"HSDP_TRANSPORT_INTRA", "enum", "mpi",
       "Transport of the intra-node level (intra-shard group): mpi."},
      {"HSDP_TRANSPORT_INTER", "enum", "mpi",
       "Transport of the inter-node level (inter-shard and replica groups): mpi."},
  };
  return params;
}

namespace {
const Param* find(const char* name) {
  for (const Param& p : registry())
    if (std::strcmp(p.name, name) == 0) return &p;
  return nullptr;
}
}  // namespace

std::string getString(const char* name) {
  if (find(name) == nullptr) return "";  // unregistered: behave as unset (tests catch this)
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

StatusOr<std::optional<int64_t>> getInt(const char* name, int64_t min) {
  if (find(name) == nullptr) return notFound("environment parameter ", name, " is not registered");
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::optional<int64_t>();
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0')
    return invalidArgument(name, "='", v, "' is not an integer");
  if (x < min) return invalidArgument(name, "=", x, " must be >= ", min);
  return std::optional<int64_t>(x);
}

StatusOr<bool> getBool(const char* name) {
  const Param* p = find(name);
  if (p == nullptr) return notFound("environment parameter ", name, " is not registered");
  const char* raw = std::getenv(name);
  std::string v = raw && *raw ? raw : p->default_value;
  std::string lower = v;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") return true;
  if (lower == "0" || lower == "false" || lower == "off" || lower == "no") return false;
  return invalidArgument(name, "='", v, "' is not a boolean (1/0, true/false, on/off, yes/no)");
}

}  // namespace hsdp::env
