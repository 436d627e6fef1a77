// hwloc part of NodeTopology: loading (live or XML), extracting NUMA nodes, GPUs and NICs, the PCI
// path between devices, and rails (the binding plan is binding.cc). Depends only on hwloc,
// topology_xml.cc and status.h so that the fuzz target can compile it alone.
#include "topology/node_topology.h"

#include <hwloc.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <tuple>

#include "core/host.h"
#include "topology/hwloc_handles.h"
#include "topology/topology_xml.h"

namespace hsdp {

namespace hwloc_detail {

StatusOr<TopologyPtr> newTopology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0)
    return internalError("hwloc_topology_init failed: ", std::strerror(errno));
  TopologyPtr t(raw);
  // Keep every PCI device and bridge: the PCI path between a GPU and a NIC goes through bridges
  // that hwloc's default filter would fold away.
  hwloc_topology_set_io_types_filter(t.get(), HWLOC_TYPE_FILTER_KEEP_ALL);
  // Not hwloc's OpenCL and GL plugins: hsdp reads GPUs through NVML and NCCL's XML, the OpenCL
  // one initialises every installed ICD (slow, and on a CPU-only host it lists CPU "devices"),
  // and the GL one asks an X server. Their allocations are also freed only with the plugin.
  for (const char* name : {"opencl", "gl"})
    hwloc_topology_set_components(t.get(), HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, name);
  return t;
}

std::string listString(hwloc_const_bitmap_t set) {
  if (set == nullptr || hwloc_bitmap_iszero(set)) return "";
  char* s = nullptr;
  if (hwloc_bitmap_list_asprintf(&s, set) < 0 || s == nullptr) return "";
  std::string out(s);
  std::free(s);
  return out;
}

}  // namespace hwloc_detail

namespace {

using hwloc_detail::listString;
using hwloc_detail::newTopology;
using hwloc_detail::TopologyPtr;

// The name of the first element of an XML document, "" if there is none. Used to tell an XML of
// the wrong kind (an NCCL dump given as hwloc XML, or the other way) from a broken one.
std::string rootElement(std::string_view xml) {
  size_t i = 0;
  while (i < xml.size()) {
    i = xml.find('<', i);
    if (i == std::string_view::npos || i + 1 >= xml.size()) return "";
    char c = xml[i + 1];
    if (c == '?' || c == '!') {  // declaration, DOCTYPE or comment
      size_t end = xml.substr(i, 4) == "<!--" ? xml.find("-->", i) : xml.find('>', i);
      if (end == std::string_view::npos) return "";
      i = end + 1;
      continue;
    }
    size_t j = i + 1;
    while (j < xml.size() && (std::isalnum(static_cast<unsigned char>(xml[j])) || xml[j] == '_' ||
                              xml[j] == '-' || xml[j] == ':'))
      ++j;
    return std::string(xml.substr(i + 1, j - i - 1));
  }
  return "";
}

bool isNvidiaGpu(hwloc_obj_t o) {
  return o->type == HWLOC_OBJ_PCI_DEVICE && o->attr->pcidev.vendor_id == 0x10de &&
         (o->attr->pcidev.class_id >> 8) == 0x03;  // display controller: VGA 0300, 3D 0302
}

PciAddress addressOf(hwloc_obj_t pci) {
  return {pci->attr->pcidev.domain, pci->attr->pcidev.bus, pci->attr->pcidev.dev,
          pci->attr->pcidev.func};
}

bool pciLess(const PciAddress& a, const PciAddress& b) {
  return std::tie(a.domain, a.bus, a.device, a.function) <
         std::tie(b.domain, b.bus, b.device, b.function);
}

int numaOf(hwloc_topology_t t, hwloc_obj_t io) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, io);
  if (anc == nullptr || anc->nodeset == nullptr) return -1;
  return hwloc_bitmap_first(anc->nodeset);
}

std::string cpusetOf(hwloc_topology_t t, hwloc_obj_t io) {
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, io);
  return anc ? listString(anc->cpuset) : "";
}

bool isHostBridge(hwloc_obj_t o) {
  return o->type == HWLOC_OBJ_BRIDGE && o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST;
}

// hwloc_get_common_ancestor_obj() is for normal objects only (I/O objects have virtual depths),
// so the common ancestor of two PCI devices is found by walking parents: both walks are brought
// to the same distance from the root, then go up together (O(depth) per pair; a host may have
// 256 GPUs x 4096 NICs of them).
int distanceFromRoot(hwloc_obj_t o) {
  int n = 0;
  for (; o; o = o->parent) ++n;
  return n;
}

PciPath classify(hwloc_topology_t t, hwloc_obj_t a, hwloc_obj_t b) {
  if (a == b) return PciPath::kSelf;
  hwloc_obj_t x = a, y = b;
  int dx = distanceFromRoot(x), dy = distanceFromRoot(y);
  for (; dx > dy; --dx) x = x->parent;
  for (; dy > dx; --dy) y = y->parent;
  while (x != y) {
    x = x->parent;
    y = y->parent;
  }
  hwloc_obj_t lca = x;
  if (lca == nullptr) return PciPath::kSys;
  if (lca->type == HWLOC_OBJ_BRIDGE) {
    if (isHostBridge(lca)) return PciPath::kPhb;
    // A PCIe switch is an upstream port with one downstream port per device: devices on the
    // ports of one switch have at most one bridge between them and the common ancestor.
    auto bridgesBelow = [&](hwloc_obj_t o) {
      int n = 0;
      for (o = o->parent; o && o != lca; o = o->parent) n += o->type == HWLOC_OBJ_BRIDGE;
      return n;
    };
    return bridgesBelow(a) <= 1 && bridgesBelow(b) <= 1 ? PciPath::kPix : PciPath::kPxb;
  }
  hwloc_obj_t na = hwloc_get_non_io_ancestor_obj(t, a);
  hwloc_obj_t nb = hwloc_get_non_io_ancestor_obj(t, b);
  if (na && nb && na->nodeset && nb->nodeset && hwloc_bitmap_isequal(na->nodeset, nb->nodeset))
    return PciPath::kNode;
  return PciPath::kSys;
}

// The PCI device an OS device hangs from, or nullptr (virtual interfaces).
hwloc_obj_t pciParent(hwloc_obj_t osdev) {
  return osdev->parent && osdev->parent->type == HWLOC_OBJ_PCI_DEVICE ? osdev->parent : nullptr;
}

StatusOr<NodeTopology> extract(hwloc_topology_t t, const std::string& source) {
  NodeTopology n;
  n.source = source;
  hwloc_obj_t root = hwloc_get_root_obj(t);
  const char* host = hwloc_obj_get_info_by_name(root, "HostName");
  const char* arch = hwloc_obj_get_info_by_name(root, "Architecture");
  if (host) n.host = host;
  if (arch) n.arch = arch;
  n.packages = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PACKAGE);
  n.cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  n.pus = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU);
  if (n.pus <= 0) return invalidArgument(source, ": the topology has no processing units");
  if (n.cores <= 0) n.cores = n.pus;

  for (hwloc_obj_t numa = nullptr;
       (numa = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, numa)) != nullptr;) {
    NumaNode nn;
    nn.os_index = static_cast<int>(numa->os_index);
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t, HWLOC_OBJ_PACKAGE, numa);
    nn.package = pkg ? static_cast<int>(pkg->os_index) : -1;
    nn.cpuset = listString(numa->cpuset);
    nn.memory_bytes = numa->attr ? numa->attr->numanode.local_memory : 0;
    if (numa->cpuset) {
      for (hwloc_obj_t core = nullptr; (core = hwloc_get_next_obj_inside_cpuset_by_type(
                                            t, numa->cpuset, HWLOC_OBJ_CORE, core)) != nullptr;)
        nn.core_cpusets.push_back(listString(core->cpuset));
      if (nn.core_cpusets.empty())  // no Core level: one entry per PU
        for (hwloc_obj_t pu = nullptr; (pu = hwloc_get_next_obj_inside_cpuset_by_type(
                                            t, numa->cpuset, HWLOC_OBJ_PU, pu)) != nullptr;)
          nn.core_cpusets.push_back(listString(pu->cpuset));
    }
    // NUMA nodes without CPUs (GPU memory exposed as NUMA on Grace, CXL) are not binding targets.
    if (!nn.cpuset.empty()) n.numa_nodes.push_back(std::move(nn));
  }

  std::vector<hwloc_obj_t> gpu_objs, nic_objs;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_pcidev(t, o)) != nullptr;)
    if (isNvidiaGpu(o)) gpu_objs.push_back(o);
  std::sort(gpu_objs.begin(), gpu_objs.end(),
            [](hwloc_obj_t a, hwloc_obj_t b) { return pciLess(addressOf(a), addressOf(b)); });
  for (hwloc_obj_t o : gpu_objs) {
    GpuDevice g;
    g.index = static_cast<int>(n.gpus.size());
    g.pci = addressOf(o);
    g.device_id = o->attr->pcidev.device_id;
    char buf[32];
    std::snprintf(buf, sizeof(buf), "NVIDIA 10de:%04x", g.device_id);
    g.name = buf;
    g.numa = numaOf(t, o);
    g.cpuset = cpusetOf(t, o);
    n.gpus.push_back(std::move(g));
  }

  // NICs: an OpenFabrics OS device (an RDMA HCA, InfiniBand or RoCE) names the NIC; a network OS
  // device on the same PCI function is its netdev. Network devices on other PCI functions are
  // Ethernet NICs. Devices without a PCI parent (bonds, bridges, veth) are not NICs.
  struct Found {
    NicDevice nic;
    hwloc_obj_t pci;
  };
  std::vector<Found> found;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(t, o)) != nullptr;) {
    hwloc_obj_t pci = pciParent(o);
    if (pci == nullptr || o->name == nullptr) continue;
    auto it =
        std::find_if(found.begin(), found.end(), [&](const Found& f) { return f.pci == pci; });
    if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
      if (it == found.end()) {
        found.push_back({NicDevice(), pci});
        it = found.end() - 1;
      } else if (it->nic.kind == NicKind::kInfiniBand) {
        continue;  // second HCA name on one function: keep the first
      }
      if (!it->nic.name.empty() && it->nic.netdev.empty()) it->nic.netdev = it->nic.name;
      it->nic.name = o->name;
      // RoCE HCAs (Port1LinkLayer=Ethernet) are RDMA NICs too: they rank with InfiniBand.
      it->nic.kind = NicKind::kInfiniBand;
    } else if (o->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) {
      if (it == found.end()) {
        Found f{NicDevice(), pci};
        f.nic.name = o->name;
        f.nic.netdev = o->name;
        f.nic.kind = NicKind::kEthernet;
        found.push_back(std::move(f));
      } else if (it->nic.netdev.empty()) {
        it->nic.netdev = o->name;
      }
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    if (a.nic.kind != b.nic.kind) return a.nic.kind == NicKind::kInfiniBand;
    return pciLess(addressOf(a.pci), addressOf(b.pci));
  });
  for (Found& f : found) {
    f.nic.index = static_cast<int>(n.nics.size());
    f.nic.pci = addressOf(f.pci);
    f.nic.numa = numaOf(t, f.pci);
    f.nic.cpuset = cpusetOf(t, f.pci);
    n.nics.push_back(f.nic);
    nic_objs.push_back(f.pci);
  }

  const size_t G = gpu_objs.size(), N = nic_objs.size();
  n.gpu_gpu_path.assign(G, std::vector<PciPath>(G, PciPath::kSys));
  n.gpu_nic_path.assign(G, std::vector<PciPath>(N, PciPath::kSys));
  for (size_t i = 0; i < G; ++i) {
    for (size_t j = 0; j < G; ++j) n.gpu_gpu_path[i][j] = classify(t, gpu_objs[i], gpu_objs[j]);
    for (size_t j = 0; j < N; ++j) n.gpu_nic_path[i][j] = classify(t, gpu_objs[i], nic_objs[j]);
  }
  n.links.direct.assign(G, std::vector<int>(G, 0));
  n.links.to_switch.assign(G, 0);
  n.links.fabric.assign(G, GpuFabric());
  assignRails(&n);
  return n;
}

}  // namespace

std::string PciAddress::toString() const {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%04x:%02x:%02x.%x", domain, bus, device, function);
  return buf;
}

StatusOr<PciAddress> parsePciAddress(std::string_view text) {
  unsigned d = 0, b = 0, dev = 0, f = 0;
  int used = 0;
  std::string s(text);
  if (std::sscanf(s.c_str(), "%x:%x:%x.%x%n", &d, &b, &dev, &f, &used) != 4 ||
      used != static_cast<int>(s.size()) || b > 0xff || dev > 0x1f || f > 7)
    return invalidArgument("'", text, "' is not a PCI address (domain:bus:device.function)");
  return PciAddress{d, b, dev, f};
}

const char* pciPathName(PciPath path) {
  switch (path) {
    case PciPath::kSelf:
      return "X";
    case PciPath::kPix:
      return "PIX";
    case PciPath::kPxb:
      return "PXB";
    case PciPath::kPhb:
      return "PHB";
    case PciPath::kNode:
      return "NODE";
    case PciPath::kSys:
      return "SYS";
  }
  return "?";
}

const char* nicKindName(NicKind kind) {
  return kind == NicKind::kInfiniBand ? "InfiniBand" : "Ethernet";
}

int NodeTopology::nvlinks(int i, int j) const {
  if (i == j || i < 0 || j < 0 || i >= static_cast<int>(links.direct.size()) ||
      j >= static_cast<int>(links.direct.size()))
    return 0;
  int direct = links.direct[i][j];
  if (direct > 0) return direct;
  return std::min(links.to_switch[i], links.to_switch[j]);
}

bool NodeTopology::nvlinkAllToAll() const {
  const int g = static_cast<int>(gpus.size());
  if (g < 2 || links.source.empty()) return false;
  for (int i = 0; i < g; ++i)
    for (int j = 0; j < g; ++j)
      if (i != j && nvlinks(i, j) == 0) return false;
  return true;
}

std::string NodeTopology::fabricDomain() const {
  if (gpus.empty() || links.fabric.size() != gpus.size()) return "";
  const GpuFabric& f0 = links.fabric[0];
  for (const GpuFabric& f : links.fabric)
    if (!f.member() || f.cluster_uuid != f0.cluster_uuid || f.clique_id != f0.clique_id) return "";
  return strCat(f0.cluster_uuid, "/", f0.clique_id);
}

int NodeTopology::numaSlot(int os_index) const {
  for (size_t i = 0; i < numa_nodes.size(); ++i)
    if (numa_nodes[i].os_index == os_index) return static_cast<int>(i);
  return -1;
}

void assignRails(NodeTopology* topo) {
  const int G = static_cast<int>(topo->gpus.size());
  topo->nic_of_gpu.assign(G, -1);
  // Rails use the RDMA NICs when there are any: an Ethernet port next to a GPU is not a rail.
  std::vector<int> candidates;
  for (const NicDevice& nic : topo->nics)
    if (nic.kind == NicKind::kInfiniBand) candidates.push_back(nic.index);
  if (candidates.empty())
    for (const NicDevice& nic : topo->nics) candidates.push_back(nic.index);
  std::vector<int> load(topo->nics.size(), 0);
  for (int g = 0; g < G; ++g) {
    int best = -1;
    for (int c : candidates) {
      auto key = [&](int n) { return std::tuple(topo->gpu_nic_path[g][n], load[n], n); };
      if (best < 0 || key(c) < key(best)) best = c;
    }
    topo->nic_of_gpu[g] = best;
    if (best >= 0) ++load[best];
  }
}

StatusOr<NodeTopology> nodeTopologyFromHwlocXml(std::string_view xml,
                                                const std::string& source_name) {
  if (xml.empty()) return invalidArgument(source_name, ": empty hwloc XML");
  // A quick look at the root for the common mistakes (the full check is the parse below, which
  // also reads documents this look cannot, e.g. UTF-16 ones).
  std::string root = rootElement(xml);
  if (root == "system")
    return invalidArgument(source_name,
                           " is an NCCL topology XML (root element <system>), not an hwloc "
                           "topology; pass it as HSDP_TOPO_NCCL_FILE / --nccl");
  if (!root.empty() && root != "topology")
    return invalidArgument(source_name, " is not an hwloc topology XML (root element <", root,
                           ">, expected <topology>)");
  // hwloc is given hsdp's re-serialization of the checked document, never the file itself: no
  // DTD (hwloc 2.9's libxml2 importer dereferences a DOCTYPE's missing SystemID), no encoding
  // declaration, no malformed bitmap (hwloc_bitmap_sscanf asserts), no object hwloc cannot hold.
  HSDP_ASSIGN_OR_RETURN(std::string canonical, topo_xml::canonicalHwlocXml(xml, source_name));
  // hwloc's libxml2 plugin (used when HWLOC_LIBXML_IMPORT is not 0) points libxml2's generic
  // error handler into itself and is unloaded with the last topology: the scope outlives the
  // topology and puts the previous handlers back. hsdp-topo also sets HWLOC_LIBXML_IMPORT=0:
  // hwloc's minimal parser, which the canonical form is written for.
  topo_xml::ErrorHandlerScope handlers;
  HSDP_ASSIGN_OR_RETURN(TopologyPtr t, newTopology());
  // hwloc wants the terminating NUL counted in the size.
  if (hwloc_topology_set_xmlbuffer(t.get(), canonical.c_str(),
                                   static_cast<int>(canonical.size() + 1)) != 0)
    return invalidArgument(source_name,
                           ": hwloc cannot parse this XML (malformed or truncated "
                           "hwloc v2 topology): ",
                           std::strerror(errno));
  if (hwloc_topology_load(t.get()) != 0)
    return invalidArgument(source_name,
                           ": hwloc failed to load the XML (malformed or truncated "
                           "hwloc v2 topology): ",
                           std::strerror(errno));
  return extract(t.get(), source_name);
}

StatusOr<NodeTopology> nodeTopologyFromLiveMachine() {
  HSDP_ASSIGN_OR_RETURN(TopologyPtr t, newTopology());
  if (hwloc_topology_load(t.get()) != 0)
    return internalError("hwloc failed to load this machine's topology: ", std::strerror(errno));
  HSDP_ASSIGN_OR_RETURN(NodeTopology n, extract(t.get(), "live"));
  if (n.host.empty()) n.host = hostName();
  return n;
}
}  // namespace hsdp
