// The topology report (hsdp/topology_report.h): hsdp-topo's view of hosts, ranks and the mesh,
// as data. Layer 3: it resolves the mesh shape (hsdp/mesh.h) over the topology module's view.
#include "engine/topology_report.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace hsdp::engine {

using json = nlohmann::json;

std::string linkCell(const NodeTopology& t, int i, int j) {
  if (i == j) return "X";
  int nv = t.nvlinks(i, j);
  return nv > 0 ? strCat("NV", nv) : pciPathName(t.gpu_gpu_path[i][j]);
}

namespace {

json hostJson(const NodeTopology& t) {
  json h = {{"host", t.host},
            {"source", t.source},
            {"arch", t.arch},
            {"packages", t.packages},
            {"cores", t.cores},
            {"pus", t.pus},
            {"nvlink_source", t.links.source},
            {"nvlink_note", t.links_note},
            {"nvlink_all_to_all", t.nvlinkAllToAll()},
            {"fabric_domain", t.fabricDomain()}};
  for (const auto& n : t.numa_nodes)
    h["numa"].push_back({{"os_index", n.os_index},
                         {"package", n.package},
                         {"cpus", n.cpuset},
                         {"cores", n.core_cpusets.size()},
                         {"memory_bytes", n.memory_bytes}});
  for (const auto& g : t.gpus) {
    json links = json::array(), paths = json::array(), nics = json::array();
    for (const auto& o : t.gpus) links.push_back(linkCell(t, g.index, o.index));
    for (const auto& n : t.nics) nics.push_back(pciPathName(t.gpu_nic_path[g.index][n.index]));
    int rail = t.nic_of_gpu[g.index];
    h["gpus"].push_back({{"index", g.index},
                         {"pci", g.pci.toString()},
                         {"name", g.name},
                         {"numa", g.numa},
                         {"cpus", g.cpuset},
                         {"links", links},
                         {"nic_paths", nics},
                         {"rail", rail < 0 ? "" : t.nics[rail].name}});
  }
  for (const auto& n : t.nics)
    h["nics"].push_back({{"index", n.index},
                         {"name", n.name},
                         {"netdev", n.netdev},
                         {"kind", nicKindName(n.kind)},
                         {"pci", n.pci.toString()},
                         {"numa", n.numa}});
  return h;
}

json viewJson(const RankView& v) {
  return {{"rank", v.world_rank},
          {"host", v.host},
          {"local_rank", v.local_rank},
          {"gpu", v.gpu},
          {"gpu_pci", v.gpu_pci},
          {"nic", v.nic},
          {"fabric", v.fabric},
          {"bind",
           {{"mode", bindModeName(v.bind.mode)},
            {"numa", v.bind.numa},
            {"cpus", v.bind.cpuset},
            {"launcher_cpus", v.bind.launcher_cpus},
            {"reason", v.bind.reason}}}};
}

}  // namespace

std::string topologyJson(const std::vector<NodeTopology>& hosts, const ClusterTopology& c,
                         const MeshSpec& spec) {
  auto shape = resolveMeshShape(c.layout, spec);
  json out;
  for (const auto& h : hosts) out["hosts"].push_back(hostJson(h));
  out["level"] = c.level;
  out["nodes"] = c.layout.node_names;
  out["ranks_per_node"] = c.layout.ranks_per_node;
  for (const auto& v : c.ranks) out["ranks"].push_back(viewJson(v));
  if (shape.ok())
    out["mesh"] = {{"world", shape->world_size},
                   {"nodes", shape->num_nodes},
                   {"ranks_per_node", shape->ranks_per_node},
                   {"intra_shard", shape->intra_shard},
                   {"inter_shard", shape->inter_shard},
                   {"shard_group", shape->shardGroupSize()},
                   {"replicas", shape->replicas()}};
  else
    out["mesh_error"] = shape.status().toString();
  // Names read from files that are not UTF-8 print as U+FFFD, never throw.
  return out.dump(1, ' ', false, json::error_handler_t::replace);
}

StatusOr<TopologyView> simulateTopology(const TopologyQuery& q) {
  TopologyView out;
  const size_t n = std::max<size_t>(q.hwloc_xml.size(), 1);
  if (!q.nvml.empty() && q.nvml.size() != n)
    return invalidArgument("--nvml given ", q.nvml.size(), " times for ", q.hwloc_xml.size(),
                           " --input files (one per input)");
  if (!q.nccl.empty() && q.nccl.size() != n)
    return invalidArgument("--nccl given ", q.nccl.size(), " times for ", q.hwloc_xml.size(),
                           " --input files (one per input)");
  if (q.ranks_per_host < 0 || q.intra_shard < 0 || q.inter_shard < 0)
    return invalidArgument("ranks per host ", q.ranks_per_host, ", intra_shard ", q.intra_shard,
                           " and inter_shard ", q.inter_shard, " must not be negative");
  for (size_t i = 0; i < n; ++i) {
    // Without recorded hosts: this machine, or what HSDP_TOPO_FILE & co. name.
    HSDP_ASSIGN_OR_RETURN(TopologySources env_src, topologySourcesFromEnv());
    TopologySources src = q.hwloc_xml.empty() ? env_src : TopologySources();
    if (!q.hwloc_xml.empty()) src.hwloc_xml = q.hwloc_xml[i];
    if (!q.nvml.empty()) src.nvml_snapshot = q.nvml[i];
    if (!q.nccl.empty()) src.nccl_xml = q.nccl[i];
    HSDP_ASSIGN_OR_RETURN(NodeTopology t, discoverNodeTopology(src));
    out.hosts.push_back(std::move(t));
  }
  HSDP_ASSIGN_OR_RETURN(BindMode mode, q.bind.empty() ? bindModeFromEnv() : parseBindMode(q.bind));
  std::vector<RankView> views;
  for (size_t h = 0; h < out.hosts.size(); ++h) {
    const NodeTopology& t = out.hosts[h];
    const int rph =
        q.ranks_per_host > 0 ? q.ranks_per_host : std::max<int>(1, static_cast<int>(t.gpus.size()));
    const int first = static_cast<int>(views.size());
    for (int l = 0; l < rph; ++l) {
      RankView v;
      v.world_rank = static_cast<int>(views.size());
      v.host = t.host.empty() ? strCat("host", h) : t.host;
      v.host_key = first;
      v.local_rank = l;
      v.local_size = rph;
      v.host_gpus = static_cast<int>(t.gpus.size());
      v.host_nics = static_cast<int>(t.nics.size());
      v.fabric = t.fabricDomain();
      v.bind = planBinding(t, l, rph, mode);
      v.gpu = v.bind.gpu;
      if (v.gpu >= 0) v.gpu_pci = t.gpus[v.gpu].pci.toString();
      if (v.bind.nic >= 0) v.nic = t.nics[v.bind.nic].name;
      views.push_back(std::move(v));
    }
  }
  HSDP_ASSIGN_OR_RETURN(out.cluster, buildClusterTopology(std::move(views)));
  return out;
}

}  // namespace hsdp::engine

namespace hsdp {

StatusOr<std::string> topologyReportJson(const TopologyQuery& query) {
  HSDP_ASSIGN_OR_RETURN(engine::TopologyView v, engine::simulateTopology(query));
  MeshSpec spec;
  spec.intra_shard = query.intra_shard;
  spec.inter_shard = query.inter_shard;
  return engine::topologyJson(v.hosts, v.cluster, spec);
}

}  // namespace hsdp
