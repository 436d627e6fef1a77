#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "core/host.h"
#include "hsdp/env.h"
#include "hsdp/log.h"
#include "hsdp/mesh_shape.h"
#include "hsdp/topology.h"
#include "topology/cluster_topology.h"

namespace hsdp {
namespace {}  // namespace

StatusOr<NodeLayout> virtualNodeLayout(int world_size, int ranks_per_node,
                                       const std::string& host) {
  HSDP_RETURN_IF_ERROR(checkConsecutiveNodes(world_size, ranks_per_node));
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
  HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> rpn, env::kRanksPerNode.get());
  // Fast path for one-machine runs: no discovery unless a recorded topology or a binding was
  // asked for (then discovery validates them and the virtual layout still wins).
  const bool topo_env = topologyEnvSet();
  if (rpn.has_value() && !topo_env) {
    HSDP_ASSIGN_OR_RETURN(NodeLayout l,
                          virtualNodeLayout(world.size(), static_cast<int>(*rpn), hostName()));
    HSDP_INFO(kTopo, "virtual nodes: ", l.num_nodes, " x ", l.ranks_per_node,
              " ranks (HSDP_RANKS_PER_NODE)");
    return l;
  }
  // The node level is the NVLink domain (a multi-host fabric clique) or the host; discovery also
  // binds this rank (HSDP_BIND). See cluster_topology.h.
  HSDP_ASSIGN_OR_RETURN(ClusterTopology c, discoverClusterTopology(world));
  NodeLayout l = std::move(c.layout);
  HSDP_INFO(kTopo, c.level == "host" ? "hosts: " : "NVLink domains: ", l.num_nodes, " x ",
            l.ranks_per_node, " ranks");
  return l;
}

}  // namespace hsdp
