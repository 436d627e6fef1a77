// Which world ranks share a node. The skeleton groups by shared-memory host
// (MPI_COMM_TYPE_SHARED through Comm::splitByHost) or, for one-machine runs, by the virtual-node
// override HSDP_RANKS_PER_NODE=k (consecutive world ranks form nodes of k). Topology knows
// nothing of sharding: the Mesh turns a NodeLayout plus the user's factors into groups.
#pragma once

#include <string>
#include <vector>

#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace hsdp {

struct NodeLayout {
  int world_size = 0;
  int num_nodes = 0;
  int ranks_per_node = 0;
  bool virtual_nodes = false;           // built from HSDP_RANKS_PER_NODE
  std::vector<int> node_of_rank;        // world rank -> node index (0..num_nodes-1)
  std::vector<int> local_rank_of_rank;  // world rank -> rank within its node
  std::vector<std::string> node_names;  // host name of each node ("host/v1" for virtual nodes)
};

// Consecutive ranks in nodes of `ranks_per_node`. Errors name the values when the count is not
// positive, exceeds the world, or does not divide it.
StatusOr<NodeLayout> virtualNodeLayout(int world_size, int ranks_per_node,
                                       const std::string& host = "localhost");

// From each world rank's node key (any id shared exactly by the ranks of one node, e.g. the
// lowest world rank on the host). Nodes are numbered by their lowest world rank; unequal ranks
// per node is an error listing every node and its count.
StatusOr<NodeLayout> nodeLayoutFromKeys(const std::vector<int>& key_of_rank,
                                        const std::vector<std::string>& host_of_rank);

// Collective over `world`: honours HSDP_RANKS_PER_NODE, else groups by shared-memory host.
StatusOr<NodeLayout> groupRanksIntoNodes(Comm& world);

}  // namespace hsdp
