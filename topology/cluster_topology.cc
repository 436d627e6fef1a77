// Environment-driven discovery of this host, the gathered cluster view, and the node level of
// the mesh (NVLink domain, host, or virtual nodes).
#include "topology/cluster_topology.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/host.h"
#include "core/json.h"
#include "hsdp/env.h"
#include "hsdp/files.h"
#include "hsdp/log.h"
#include "topology/topology_xml.h"

namespace hsdp {

// Every topology input (HSDP_TOPO_FILE, HSDP_TOPO_NVML_FILE, HSDP_TOPO_NCCL_FILE, hsdp-topo's
// --input/--nvml/--nccl) goes through the file layer: a FIFO, device or directory is an error
// naming the path (opened with O_NONBLOCK, never a hang), and so is a file over
// topo_xml::kMaxFileBytes (8 MiB; a DGX H100's hwloc XML is 73 KB).
StatusOr<std::string> readTopologyFile(const std::string& path, const std::string& what) {
  HSDP_ASSIGN_OR_RETURN(std::string text, files::readBounded(path, topo_xml::kMaxFileBytes, what));
  if (text.empty()) return invalidArgument(what, " '", path, "' is empty");
  return text;
}

namespace {
using env::StringParam;
const StringParam kTopoFile{
    "HSDP_TOPO_FILE", StringParam::Kind::kString, "",
    "Recorded hwloc v2 XML (lstopo --of xml) used instead of discovering this machine."};
const StringParam kTopoNvmlFile{
    "HSDP_TOPO_NVML_FILE", StringParam::Kind::kString, "",
    "Recorded NVML snapshot (hsdp-topo --dump-nvml) for the NVLink graph and fabric clique."};
const StringParam kTopoNcclFile{
    "HSDP_TOPO_NCCL_FILE", StringParam::Kind::kString, "",
    "NCCL topology XML (written for NCCL_TOPO_DUMP_FILE), a second source of NVLink links."};
const StringParam kBind{
    "HSDP_BIND", StringParam::Kind::kEnum, "auto",
    "Bind each rank to the NUMA node nearest its GPU (or NIC on CPU-only hosts): auto (numa "
    "when the host has several NUMA nodes and is not oversubscribed), none, numa, core. A "
    "binding the launcher gave (srun --cpu-bind, mpirun --bind-to, taskset) is never widened: "
    "auto keeps it, numa and core bind within it."};
}  // namespace

StatusOr<TopologySources> topologySourcesFromEnv() {
  TopologySources s;
  s.hwloc_xml = kTopoFile.get();
  s.nvml_snapshot = kTopoNvmlFile.get();
  s.nccl_xml = kTopoNcclFile.get();
  return s;
}

StatusOr<BindMode> bindModeFromEnv() { return parseBindMode(kBind.get()); }

bool topologyEnvSet() {
  return kTopoFile.isSet() || kTopoNvmlFile.isSet() || kTopoNcclFile.isSet() || kBind.isSet();
}

StatusOr<NodeTopology> discoverNodeTopology(const TopologySources& src) {
  NodeTopology topo;
  if (src.hwloc_xml.empty()) {
    HSDP_ASSIGN_OR_RETURN(topo, nodeTopologyFromLiveMachine());
  } else {
    HSDP_ASSIGN_OR_RETURN(std::string xml, readTopologyFile(src.hwloc_xml, "hwloc topology XML"));
    HSDP_ASSIGN_OR_RETURN(topo, nodeTopologyFromHwlocXml(xml, src.hwloc_xml));
  }
  if (!src.nvml_snapshot.empty()) {
    HSDP_ASSIGN_OR_RETURN(std::string text, readTopologyFile(src.nvml_snapshot, "NVML snapshot"));
    HSDP_ASSIGN_OR_RETURN(topo.links, gpuLinksFromNvmlSnapshot(topo, text, src.nvml_snapshot));
  } else if (!src.nccl_xml.empty()) {
    HSDP_ASSIGN_OR_RETURN(std::string text, readTopologyFile(src.nccl_xml, "NCCL topology XML"));
    HSDP_ASSIGN_OR_RETURN(topo.links, gpuLinksFromNcclXml(topo, text, src.nccl_xml));
  } else if (!src.hwloc_xml.empty()) {
    topo.links_note = "recorded hwloc topology without an NVML snapshot or NCCL XML";
  } else if (topo.gpus.empty()) {
    topo.links_note = "no NVIDIA GPU";
  } else {
    // A GPU host whose driver is missing or broken still runs (on the host level); say why.
    auto links = gpuLinksFromNvml(topo, src.nvml_library);
    if (links.ok()) {
      topo.links = std::move(*links);
    } else {
      topo.links_note = links.status().message();
      HSDP_WARN(kTopo, "no NVLink information, the host is the NVLink domain: ", topo.links_note);
    }
  }
  // Sanity: the link graph is indexed like the GPUs.
  if (!topo.links.source.empty() && topo.links.direct.size() != topo.gpus.size())
    return internalError("NVLink graph of ", topo.links.direct.size(), " GPUs for ",
                         topo.gpus.size());
  return topo;
}

// ---- rank views -------------------------------------------------------------------------------

using json = nlohmann::json;

namespace {

// One field of a wire form: where it goes (a JSON pointer) and the member.
template <class T>
struct Field {
  const char* at;
  T& value;
};
// Written out: clang before 17 deduces no aggregate's template arguments (C++20's P1816).
template <class T>
Field(const char*, T&) -> Field<T>;

// The wire form of a rank view, one table for both directions: f(pointer, member) for each field
// (the binding is the object "bind"). BindMode travels as its integer (nlohmann's enum
// conversion). The binding's launcher_cpus is not in it: older views lack it, so it is read with
// a default.
template <class View, class F>
void forEachRankViewField(View& v, F&& f) {
  auto each = [&f](auto... fields) { (f(json::json_pointer(fields.at), fields.value), ...); };
  each(Field{"/r", v.world_rank}, Field{"/host", v.host}, Field{"/hk", v.host_key},
       Field{"/lr", v.local_rank}, Field{"/ls", v.local_size}, Field{"/ng", v.host_gpus},
       Field{"/nn", v.host_nics}, Field{"/gpu", v.gpu}, Field{"/pci", v.gpu_pci},
       Field{"/nic", v.nic}, Field{"/fab", v.fabric}, Field{"/err", v.error},
       Field{"/bind/req", v.bind.requested}, Field{"/bind/mode", v.bind.mode},
       Field{"/bind/gpu", v.bind.gpu}, Field{"/bind/nic", v.bind.nic},
       Field{"/bind/numa", v.bind.numa}, Field{"/bind/cpus", v.bind.cpuset},
       Field{"/bind/why", v.bind.reason});
}

}  // namespace

std::string serializeRankView(const RankView& v) {
  json j = json::object();
  forEachRankViewField(v, [&](const json::json_pointer& at, const auto& field) { j[at] = field; });
  j["bind"]["launcher"] = v.bind.launcher_cpus;
  return j.dump();
}

StatusOr<RankView> parseRankView(std::string_view text) {
  StatusOr<json> parsed = hsdp::parseJson(text, "rank view");
  if (!parsed.ok()) return invalidArgument("malformed rank view: ", parsed.status().message());
  json j = std::move(*parsed);
  if (!j.is_object()) return invalidArgument("malformed rank view");
  try {
    RankView v;
    forEachRankViewField(
        v, [&](const json::json_pointer& at, auto& field) { j.at(at).get_to(field); });
    v.bind.launcher_cpus = j.at("bind").value("launcher", "");
    return v;
  } catch (const json::exception& e) {
    return invalidArgument("malformed rank view: ", e.what());
  }
}

StatusOr<std::vector<RankView>> gatherRankViews(Comm& world, const RankView& mine) {
  // Two all-gathers: the lengths, then every view padded to the longest.
  const std::string text = serializeRankView(mine);
  int len = static_cast<int>(text.size());
  std::vector<int> lens(world.size());
  HSDP_RETURN_IF_ERROR(world.allGather(&len, lens.data(), 1, DType::kInt32));
  const size_t width = static_cast<size_t>(*std::max_element(lens.begin(), lens.end()));
  std::vector<char> send(width, 0), all(width * world.size(), 0);
  std::memcpy(send.data(), text.data(), text.size());
  HSDP_RETURN_IF_ERROR(world.allGather(send.data(), all.data(), width, DType::kUInt8));
  std::vector<RankView> views;
  for (int r = 0; r < world.size(); ++r) {
    HSDP_ASSIGN_OR_RETURN(RankView v, parseRankView(std::string_view(&all[r * width], lens[r])));
    views.push_back(std::move(v));
  }
  return views;
}

// ---- the cluster view -------------------------------------------------------------------------

std::string ClusterTopology::describe() const {
  std::string out;
  for (int n = 0; n < layout.num_nodes; ++n) {
    std::set<int> hosts;
    for (const RankView& v : ranks)
      if (layout.node_of_rank[v.world_rank] == n) hosts.insert(v.host_key);
    out += strCat(n ? "\n" : "", "node ", n, " = ", layout.node_names[n], " (", hosts.size(),
                  hosts.size() == 1 ? " host, " : " hosts, ", layout.ranks_per_node, " ranks)");
  }
  return out;
}

StatusOr<ClusterTopology> buildClusterTopology(std::vector<RankView> views) {
  if (views.empty()) return invalidArgument("cluster topology of an empty world");
  std::string errors;
  std::set<std::string> seen;
  for (size_t r = 0; r < views.size(); ++r) {
    if (views[r].world_rank != static_cast<int>(r))
      return internalError("rank view ", r, " claims world rank ", views[r].world_rank);
    if (!views[r].error.empty() && seen.insert(views[r].error).second)
      errors += strCat(errors.empty() ? "" : "; ", "rank ", r, " (", views[r].host,
                       "): ", views[r].error);
  }
  if (!errors.empty()) return invalidArgument("topology discovery failed: ", errors);

  // Every rank of one host must report the same clique, or the host would straddle two nodes.
  std::map<int, const RankView*> first_of_host;
  for (const RankView& v : views) {
    auto [it, fresh] = first_of_host.emplace(v.host_key, &v);
    if (!fresh && it->second->fabric != v.fabric)
      return invalidArgument("host ", v.host, ": rank ", it->second->world_rank,
                             " is in NVLink clique '", it->second->fabric, "' but rank ",
                             v.world_rank, " in '", v.fabric, "'");
  }
  // Domain key: the clique when there is one, else the host. Keys become small integers in
  // first-seen order; nodeLayoutFromKeys numbers nodes by their lowest world rank anyway.
  std::map<std::string, int> key_of_domain;
  std::vector<int> keys;
  std::vector<std::string> names;
  bool any_fabric = false;
  for (const RankView& v : views) {
    std::string domain = v.fabric.empty() ? strCat("host#", v.host_key) : "nvl:" + v.fabric;
    any_fabric |= !v.fabric.empty();
    key_of_domain.emplace(domain, static_cast<int>(key_of_domain.size()));
    keys.push_back(key_of_domain[domain]);
    if (v.fabric.empty()) {
      names.push_back(v.host);
    } else {  // "nvl:5e1e3a1c/32766": the uuid's first group is enough to tell cliques apart
      size_t slash = v.fabric.find('/');
      names.push_back(
          strCat("nvl:", v.fabric.substr(0, std::min<size_t>(8, slash)),
                 v.fabric.substr(slash == std::string::npos ? v.fabric.size() : slash)));
    }
  }
  ClusterTopology c;
  c.level = any_fabric ? "nvlink-domain" : "host";
  auto layout = nodeLayoutFromKeys(keys, names);
  if (!layout.ok()) return layout.status().withContext(any_fabric ? "NVLink domains" : "hosts");
  c.layout = std::move(*layout);
  c.num_hosts = static_cast<int>(first_of_host.size());
  c.ranks = std::move(views);
  return c;
}

StatusOr<ClusterTopology> discoverClusterTopology(Comm& world, const ClusterOptions& options,
                                                  NodeTopology* local) {
  // Host grouping first: a collective every rank reaches whatever its environment says.
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> host, world.splitByHost());
  int key = world.rank();
  HSDP_RETURN_IF_ERROR(host->broadcast(&key, 1, DType::kInt32, 0));

  // Local failures are carried in the view, so that every rank reaches the gather and every
  // rank returns the same error instead of some hanging in it.
  RankView mine;
  mine.world_rank = world.rank();
  mine.host_key = key;
  mine.local_rank = host->rank();
  mine.local_size = host->size();
  mine.host = hostName();
  NodeTopology topo;
  auto fill = [&]() -> Status {
    HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> rpn, env::kRanksPerNode.get());
    (void)rpn;
    HSDP_ASSIGN_OR_RETURN(BindMode mode, bindModeFromEnv());
    HSDP_ASSIGN_OR_RETURN(TopologySources src, topologySourcesFromEnv());
    HSDP_ASSIGN_OR_RETURN(topo, discoverNodeTopology(src));
    // A recorded topology names its own host; the key stays this rank's real host.
    if (!src.hwloc_xml.empty() && !topo.host.empty()) mine.host = topo.host;
    mine.host_gpus = static_cast<int>(topo.gpus.size());
    mine.host_nics = static_cast<int>(topo.nics.size());
    mine.fabric = topo.fabricDomain();
    mine.bind = planBinding(topo, mine.local_rank, mine.local_size, mode);
    if (topo.source == "live" && mode != BindMode::kNone) {
      // Never widen a binding the launcher chose (srun --cpu-bind, mpirun --bind-to, taskset).
      StatusOr<CpuBinding> cur = readCpuBinding();
      if (cur.ok()) {
        mine.bind = respectLauncherBinding(std::move(mine.bind), cur->launcherCpus());
      } else {
        mine.bind.mode = BindMode::kNone;
        mine.bind.cpuset.clear();
        mine.bind.reason = strCat("this process's CPU binding could not be read (",
                                  cur.status().message(), "); left as it is");
      }
    }
    mine.gpu = mine.bind.gpu;
    if (mine.gpu >= 0) mine.gpu_pci = topo.gpus[mine.gpu].pci.toString();
    if (mine.bind.nic >= 0) mine.nic = topo.nics[mine.bind.nic].name;
    return okStatus();
  };
  if (Status s = fill(); !s.ok()) mine.error = s.toString();
  HSDP_ASSIGN_OR_RETURN(std::vector<RankView> views, gatherRankViews(world, mine));

  // Same views on every rank, so the same outcome on every rank from here on.
  HSDP_ASSIGN_OR_RETURN(ClusterTopology c, buildClusterTopology(views));
  auto rpn = env::kRanksPerNode.get();  // validated in fill()
  if (rpn.ok() && rpn->has_value()) {
    HSDP_ASSIGN_OR_RETURN(c.layout,
                          virtualNodeLayout(world.size(), static_cast<int>(**rpn), mine.host));
    c.level = "virtual";
  } else if (options.apply_binding) {
    // A binding failure is local and not fatal (the job still runs, only slower); it must not
    // turn into an error on one rank while the others go on to build the mesh.
    if (Status s = applyBinding(topo, mine.bind); !s.ok())
      HSDP_WARN(kTopo, "binding not applied: ", s.message());
    else
      HSDP_INFO(kTopo, "rank ", world.rank(), " on ", mine.host, ": ", mine.bind.describe());
  }
  HSDP_INFO(kTopo, c.level, " level: ", c.layout.num_nodes, " nodes x ", c.layout.ranks_per_node,
            " ranks over ", c.num_hosts, " hosts");
  if (local) *local = std::move(topo);
  return c;
}

}  // namespace hsdp
