#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "hsdp/env.h"
#include "hsdp/log.h"
#include "hsdp/topology.h"

namespace hsdp {
namespace {

std::string localHostName() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace

StatusOr<NodeLayout> virtualNodeLayout(int world_size, int ranks_per_node,
                                       const std::string& host) {
  if (ranks_per_node <= 0)
    return invalidArgument("HSDP_RANKS_PER_NODE=", ranks_per_node, " must be positive");
  if (ranks_per_node > world_size)
    return invalidArgument("HSDP_RANKS_PER_NODE=", ranks_per_node, " exceeds the world size ",
                           world_size);
  if (world_size % ranks_per_node != 0)
    return invalidArgument("HSDP_RANKS_PER_NODE=", ranks_per_node,
                           " does not divide the world size ", world_size);
  NodeLayout l;
  l.world_size = world_size;
  l.ranks_per_node = ranks_per_node;
  l.num_nodes = world_size / ranks_per_node;
  l.virtual_nodes = true;
  for (int r = 0; r < world_size; ++r) {
    l.node_of_rank.push_back(r / ranks_per_node);
    l.local_rank_of_rank.push_back(r % ranks_per_node);
  }
  for (int n = 0; n < l.num_nodes; ++n) l.node_names.push_back(strCat(host, "/v", n));
  return l;
}

StatusOr<NodeLayout> nodeLayoutFromKeys(const std::vector<int>& key_of_rank,
                                        const std::vector<std::string>& host_of_rank) {
  const int world = static_cast<int>(key_of_rank.size());
  if (world == 0) return invalidArgument("node grouping of an empty world");
  // Node index = rank of the node's key among all keys, so node 0 holds world rank 0's node.
  std::map<int, int> first_rank_of_key;
  for (int r = 0; r < world; ++r) first_rank_of_key.emplace(key_of_rank[r], r);
  std::vector<std::pair<int, int>> order;  // (lowest world rank, key)
  for (auto [key, r] : first_rank_of_key) order.push_back({r, key});
  std::sort(order.begin(), order.end());
  std::map<int, int> node_of_key;
  for (size_t i = 0; i < order.size(); ++i) node_of_key[order[i].second] = static_cast<int>(i);

  NodeLayout l;
  l.world_size = world;
  l.num_nodes = static_cast<int>(order.size());
  std::vector<int> count(l.num_nodes, 0);
  for (int r = 0; r < world; ++r) {
    int node = node_of_key[key_of_rank[r]];
    l.node_of_rank.push_back(node);
    l.local_rank_of_rank.push_back(count[node]++);
  }
  for (auto [r, key] : order)
    l.node_names.push_back(r < static_cast<int>(host_of_rank.size()) ? host_of_rank[r] : "?");
  if (std::any_of(count.begin(), count.end(), [&](int c) { return c != count[0]; })) {
    std::string detail;
    for (int n = 0; n < l.num_nodes; ++n)
      detail += strCat(n ? ", " : "", l.node_names[n], "=", count[n]);
    return invalidArgument("unequal ranks per node (", detail,
                           "); hsdp needs the same rank count on every node");
  }
  l.ranks_per_node = count[0];
  return l;
}

StatusOr<NodeLayout> groupRanksIntoNodes(Comm& world) {
  HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> rpn, env::getInt("HSDP_RANKS_PER_NODE"));
  if (rpn.has_value()) {
    HSDP_ASSIGN_OR_RETURN(NodeLayout l,
                          virtualNodeLayout(world.size(), static_cast<int>(*rpn), localHostName()));
    HSDP_INFO(kTopo, "virtual nodes: ", l.num_nodes, " x ", l.ranks_per_node,
              " ranks (HSDP_RANKS_PER_NODE)");
    return l;
  }
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> host, world.splitByHost());
  // The host's key is the world rank of its local rank 0.
  int key = world.rank();
  HSDP_RETURN_IF_ERROR(host->broadcast(&key, 1, DType::kInt32, 0));
  std::vector<int> keys(world.size());
  HSDP_RETURN_IF_ERROR(world.allGather(&key, keys.data(), 1, DType::kInt32));
  constexpr size_t kNameLen = 64;
  std::vector<char> names(kNameLen * world.size(), 0);
  std::string me = localHostName();
  std::vector<char> mine(kNameLen, 0);
  std::memcpy(mine.data(), me.data(), std::min(me.size(), kNameLen - 1));
  HSDP_RETURN_IF_ERROR(world.allGather(mine.data(), names.data(), kNameLen, DType::kUInt8));
  std::vector<std::string> hosts;
  for (int r = 0; r < world.size(); ++r) hosts.emplace_back(&names[r * kNameLen]);
  HSDP_ASSIGN_OR_RETURN(NodeLayout l, nodeLayoutFromKeys(keys, hosts));
  HSDP_INFO(kTopo, "hosts: ", l.num_nodes, " x ", l.ranks_per_node, " ranks (shared memory)");
  return l;
}

}  // namespace hsdp
