// What hsdp-topo prints, as a library call: the hosts hsdp sees (this machine, or recorded hwloc
// XML with NVML snapshots and NCCL topology XML), the ranks each would run with their binding, the
// cluster's node level and the two-level mesh for the given factors. No MPI: recorded hosts get
// simulated ranks, as `hsdp-topo --input ...` gives them. The Python binding's
// hsdp.topology.discover() and from_files() return this.
#pragma once

#include <string>
#include <vector>

#include "hsdp/status.h"

namespace hsdp {

struct TopologyQuery {
  // Recorded hosts, one entry each; empty: this machine (or what HSDP_TOPO_FILE,
  // HSDP_TOPO_NVML_FILE and HSDP_TOPO_NCCL_FILE name). nvml and nccl, when given, have one entry
  // per host (one for this machine).
  std::vector<std::string> hwloc_xml, nvml, nccl;
  int ranks_per_host = 0;  // 0: one per GPU, or 1 on a CPU-only host
  int intra_shard = 0;     // 0: all ranks of a node
  int inter_shard = 0;     // 0: 1
  std::string bind;        // auto | none | numa | core; "": HSDP_BIND, else auto
};

// hsdp-topo --json (without mpirun): {"hosts": [...], "level", "nodes", "ranks_per_node",
// "ranks": [...], "mesh": {...}} or, when the factors do not fit the nodes, "mesh_error" naming
// them instead of "mesh". Errors (a missing or malformed file, a bad bind mode, an nvml or nccl
// list of the wrong length) are InvalidArgument naming the file or value.
StatusOr<std::string> topologyReportJson(const TopologyQuery& query);

}  // namespace hsdp
