// Internal to the engine and hsdp-topo: the pieces of the topology report (hsdp/topology_report.h)
// that hsdp-topo's text output shares with the JSON.
#pragma once

#include <string>
#include <vector>

#include "hsdp/mesh.h"
#include "hsdp/topology_report.h"
#include "topology/cluster_topology.h"
#include "topology/node_topology.h"

namespace hsdp::engine {

struct TopologyView {
  std::vector<NodeTopology> hosts;
  ClusterTopology cluster;
};

// The hosts of `query` with simulated ranks and their cluster view (hsdp-topo without mpirun).
StatusOr<TopologyView> simulateTopology(const TopologyQuery& query);

// A cell of the `nvidia-smi topo -m` style matrix: "X", "NV<n>", or the PCI path's name.
std::string linkCell(const NodeTopology& t, int i, int j);

// The JSON report of `hosts` and `cluster` with the mesh for `spec` (or "mesh_error").
std::string topologyJson(const std::vector<NodeTopology>& hosts, const ClusterTopology& cluster,
                         const MeshSpec& spec);

}  // namespace hsdp::engine
