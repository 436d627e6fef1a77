// The cluster view: every rank's view of its host, gathered over the world, and the node level of
// the mesh chosen from it. The intra (node) level is the NVLink domain: a multi-node NVLink fabric
// clique where NVML reports one (GB200 NVL72: one domain of many hosts), else the host. The
// virtual-node override HSDP_RANKS_PER_NODE wins when set.
#pragma once

#include <string>
#include <vector>

#include "hsdp/status.h"
#include "hsdp/topology.h"
#include "hsdp/transport.h"
#include "topology/node_topology.h"

namespace hsdp {

// What one rank knows about itself. Serialized and all-gathered by gatherRankViews.
struct RankView {
  int world_rank = 0;
  std::string host;
  int host_key = 0;    // same for exactly the ranks of one host (world rank of its local rank 0)
  int local_rank = 0;  // rank among the ranks of its host
  int local_size = 1;
  int host_gpus = 0;
  int host_nics = 0;
  int gpu = -1;  // index on its host, -1 on CPU-only hosts
  std::string gpu_pci;
  std::string nic;     // the rail, e.g. "mlx5_3"; "" when none
  std::string fabric;  // NVLink fabric clique "uuid/clique", "" when none
  BindPlan bind;
  std::string error;  // non-empty: this rank's discovery failed (every rank then fails)
};

struct ClusterTopology {
  NodeLayout layout;            // what the Mesh consumes: nodes = NVLink domains
  std::string level;            // "nvlink-domain", "host" or "virtual"
  std::vector<RankView> ranks;  // by world rank
  int num_hosts = 0;
  // One line per node: "node 0 = nvl:5e1e3a1c/32766 (4 hosts, 16 ranks)".
  std::string describe() const;
};

// Pure: groups the gathered views. Ranks with a fabric clique form one node per clique; others one
// node per host. Errors (naming ranks, hosts, domains and counts): any rank's discovery error; a
// host whose ranks report different cliques; unequal ranks per node.
StatusOr<ClusterTopology> buildClusterTopology(std::vector<RankView> views);

// Collective: all-gathers `mine` (whatever its length) and returns every rank's view in rank order.
StatusOr<std::vector<RankView>> gatherRankViews(Comm& world, const RankView& mine);

std::string serializeRankView(const RankView& v);
StatusOr<RankView> parseRankView(std::string_view text);

struct ClusterOptions {
  bool apply_binding = true;  // bind this process per HSDP_BIND (live topologies only)
};

// Collective over `world`: discovers this host (topologySourcesFromEnv), gathers every rank's
// view and builds the cluster view; with HSDP_RANKS_PER_NODE set the layout is virtual. Every
// rank returns the same error when any rank's discovery or HSDP_* value is bad (no hang).
// `local` (optional) receives this rank's NodeTopology.
StatusOr<ClusterTopology> discoverClusterTopology(Comm& world, const ClusterOptions& options = {},
                                                  NodeTopology* local = nullptr);

}  // namespace hsdp
