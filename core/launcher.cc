#include "core/launcher.h"

#include <cstdlib>

#include "hsdp/parse.h"

namespace hsdp::launcher {
namespace {

constexpr int64_t kMaxTasks = int64_t{1} << 24;

StatusOr<std::optional<Count>> perNodeList(const GetEnv& get, const char* list_name) {
  const char* list = get(list_name);
  if (list == nullptr) return std::optional<Count>();
  HSDP_ASSIGN_OR_RETURN(std::vector<int64_t> per_node, parseTasksPerNode(list, list_name));
  bool uniform = true;
  for (int64_t n : per_node) uniform = uniform && n == per_node.front();
  const char* node = get("SLURM_NODEID");
  if (node == nullptr) {
    if (!uniform) return std::optional<Count>();  // which entry is ours is unknown
    return std::optional<Count>(Count{per_node.front(), list_name});
  }
  StatusOr<int64_t> id = parseInt64(node, "SLURM_NODEID", 0, kMaxTasks);
  if (!id.ok()) return id.status();
  if (*id >= static_cast<int64_t>(per_node.size()))
    return invalidArgument("SLURM_NODEID=", *id, " is outside ", list_name, "='", list, "' (",
                           per_node.size(), " nodes)");
  return std::optional<Count>(
      Count{per_node[static_cast<size_t>(*id)],
            std::string(list_name) + "[SLURM_NODEID=" + std::to_string(*id) + "]"});
}

StatusOr<std::optional<Count>> single(const GetEnv& get, const char* name) {
  const char* v = get(name);
  if (v == nullptr) return std::optional<Count>();
  HSDP_ASSIGN_OR_RETURN(int64_t n, parseInt64(v, name, 1, kMaxTasks));
  return std::optional<Count>(Count{n, name});
}

}  // namespace

const char* processEnv(const char* name) { return std::getenv(name); }

StatusOr<std::vector<int64_t>> parseTasksPerNode(std::string_view text, std::string_view name) {
  auto bad = [&](std::string_view why) {
    return invalidArgument(name, "='", text,
                           "' is not a Slurm per-node task list such as "
                           "'4(x2),3' (",
                           why, ")");
  };
  std::vector<int64_t> out;
  if (text.empty()) return bad("empty");
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = text.find(',', pos);
    const std::string_view item =
        text.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    if (item.empty()) return bad("an empty entry");
    std::string_view count = item;
    int64_t repeat = 1;
    const size_t paren = item.find("(x");
    if (paren != std::string_view::npos) {
      if (item.back() != ')') return bad("'(x' without ')'");
      count = item.substr(0, paren);
      StatusOr<int64_t> r =
          parseInt64(item.substr(paren + 2, item.size() - paren - 3), "repeat", 1, kMaxTasks);
      if (!r.ok()) return bad("a bad repeat count");
      repeat = *r;
    }
    StatusOr<int64_t> c = parseInt64(count, "count", 0, kMaxTasks);
    if (!c.ok()) return bad("a bad task count");
    if (static_cast<int64_t>(out.size()) + repeat > kMaxTasks) return bad("too many nodes");
    out.insert(out.end(), static_cast<size_t>(repeat), *c);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return out;
}

StatusOr<std::optional<Count>> localSize(const GetEnv& get) {
  HSDP_ASSIGN_OR_RETURN(std::optional<Count> c, single(get, "OMPI_COMM_WORLD_LOCAL_SIZE"));
  if (c) return c;
  for (const char* list : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    HSDP_ASSIGN_OR_RETURN(c, perNodeList(get, list));
    if (c) return c;
  }
  return single(get, "SLURM_NTASKS_PER_NODE");
}

StatusOr<std::optional<Count>> slurmTasks(const GetEnv& get) {
  HSDP_ASSIGN_OR_RETURN(std::optional<Count> c, single(get, "SLURM_STEP_NUM_TASKS"));
  if (c) return c;
  return single(get, "SLURM_NTASKS");
}

StatusOr<std::optional<Count>> srunStepWithoutPmi(const GetEnv& get) {
  if (get("SLURM_STEP_ID") == nullptr) return std::optional<Count>();  // not a task of srun
  HSDP_ASSIGN_OR_RETURN(std::optional<Count> c, single(get, "SLURM_STEP_NUM_TASKS"));
  if (!c || c->value <= 1) return std::optional<Count>();
  for (const char* pmi : {"PMIX_RANK", "PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_SIZE"})
    if (get(pmi) != nullptr) return std::optional<Count>();
  return c;
}

}  // namespace hsdp::launcher
