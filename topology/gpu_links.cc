// The NVLink graph and fabric clique of a host's GPUs, from three sources: hsdp's NVML snapshot
// (JSON), NCCL's topology XML, and live NVML through dlopen. Live NVML is first written as a
// snapshot and then read by the same parser, so recorded and live runs share one code path.
#include <dlfcn.h>
#include <libxml/parser.h>
#include <libxml/tree.h>

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/json.h"
#include "topology/node_topology.h"
#include "topology/nvml_abi.h"
#include "topology/topology_xml.h"

namespace hsdp {
namespace {

using json = nlohmann::json;

int gpuByAddress(const NodeTopology& topo, const PciAddress& a) {
  for (const GpuDevice& g : topo.gpus)
    if (g.pci == a) return g.index;
  return -1;
}

GpuLinks emptyLinks(const NodeTopology& topo, std::string source) {
  GpuLinks l;
  const size_t G = topo.gpus.size();
  l.source = std::move(source);
  l.direct.assign(G, std::vector<int>(G, 0));
  l.to_switch.assign(G, 0);
  l.fabric.assign(G, GpuFabric());
  return l;
}

// ---- NCCL XML through libxml2 -----------------------------------------------------------------

using topo_xml::XmlDocPtr;

std::string attr(xmlNode* n, const char* name) {
  xmlChar* v = xmlGetProp(n, reinterpret_cast<const xmlChar*>(name));
  if (v == nullptr) return "";
  std::string s(reinterpret_cast<char*>(v));
  xmlFree(v);
  return s;
}

bool named(xmlNode* n, const char* name) {
  return n->type == XML_ELEMENT_NODE &&
         std::strcmp(reinterpret_cast<const char*>(n->name), name) == 0;
}

struct NcclGpu {
  std::string busid;
  struct Link {
    std::string target, tclass;
    int count;
  };
  std::vector<Link> links;
};

Status walkNccl(xmlNode* node, const std::string& parent_busid, std::vector<NcclGpu>* out,
                const std::string& source, int depth) {
  if (depth > 64) return invalidArgument(source, ": NCCL topology nested deeper than 64 levels");
  for (xmlNode* c = node->children; c; c = c->next) {
    if (c->type != XML_ELEMENT_NODE) continue;
    if (named(c, "gpu")) {
      if (parent_busid.empty())
        return invalidArgument(source, ": <gpu dev=\"", attr(c, "dev"),
                               "\"> is not inside a <pci busid=...> element");
      if (out->size() >= topo_xml::kMaxGpus)
        return invalidArgument(source, ": line ", c->line, ": more than ", topo_xml::kMaxGpus,
                               " <gpu> elements (the limit for one host)");
      NcclGpu g{parent_busid, {}};
      for (xmlNode* l = c->children; l; l = l->next) {
        if (!named(l, "nvlink")) continue;
        std::string count = attr(l, "count");
        char* end = nullptr;
        long n = std::strtol(count.c_str(), &end, 10);
        if (count.empty() || *end != '\0' || n < 0 || n > 64)
          return invalidArgument(source, ": <nvlink count=\"", count, "\"> of GPU ", parent_busid,
                                 " is not a link count");
        g.links.push_back({attr(l, "target"), attr(l, "tclass"), static_cast<int>(n)});
      }
      out->push_back(std::move(g));
      continue;
    }
    std::string busid = named(c, "pci") ? attr(c, "busid") : parent_busid;
    HSDP_RETURN_IF_ERROR(walkNccl(c, busid, out, source, depth + 1));
  }
  return okStatus();
}

}  // namespace

StatusOr<GpuLinks> gpuLinksFromNcclXml(const NodeTopology& topo, std::string_view xml,
                                       const std::string& source_name) {
  if (xml.empty()) return invalidArgument(source_name, ": empty NCCL topology XML");
  // hsdp's own parse (topology/topology_xml.h): no DTD, no entities, our error handlers.
  HSDP_ASSIGN_OR_RETURN(XmlDocPtr doc, topo_xml::parse(xml, source_name, "NCCL topology XML"));
  xmlNode* root = xmlDocGetRootElement(doc.get());
  if (root == nullptr) return invalidArgument(source_name, ": XML without a root element");
  if (!named(root, "system"))
    return invalidArgument(source_name, " is not an NCCL topology XML (root element <",
                           reinterpret_cast<const char*>(root->name), ">, expected <system>",
                           named(root, "topology") ? "; an hwloc XML goes to HSDP_TOPO_FILE" : "",
                           ")");
  std::vector<NcclGpu> gpus;
  HSDP_RETURN_IF_ERROR(walkNccl(root, "", &gpus, source_name, 0));
  GpuLinks l = emptyLinks(topo, "nccl xml " + source_name);
  std::vector<int> index;
  for (const NcclGpu& g : gpus) {
    HSDP_ASSIGN_OR_RETURN(PciAddress a, parsePciAddress(g.busid));
    int i = gpuByAddress(topo, a);
    if (i < 0)
      return invalidArgument(source_name, ": GPU ", g.busid, " is not a GPU of ", topo.source, " (",
                             topo.gpus.size(), " GPUs); a dump of another machine?");
    index.push_back(i);
  }
  if (index.size() != topo.gpus.size())
    return invalidArgument(source_name, " lists ", index.size(), " GPUs but ", topo.source, " has ",
                           topo.gpus.size());
  for (size_t k = 0; k < gpus.size(); ++k) {
    const int i = index[k];
    for (const NcclGpu::Link& link : gpus[k].links) {
      // NCCL's tclass is the PCI class of the far end: 0x068000 an NVSwitch, 0x0302xx/0x0300xx a
      // GPU. Anything else (a POWER CPU) is not a GPU-to-GPU path.
      if (link.tclass == "0x068000") {
        l.to_switch[i] += link.count;
      } else if (link.tclass.rfind("0x0302", 0) == 0 || link.tclass.rfind("0x0300", 0) == 0) {
        HSDP_ASSIGN_OR_RETURN(PciAddress t, parsePciAddress(link.target));
        int j = gpuByAddress(topo, t);
        if (j < 0 || j == i)
          return invalidArgument(source_name, ": NVLink of GPU ", gpus[k].busid, " targets ",
                                 link.target, ", not another GPU of this host");
        l.direct[i][j] += link.count;
      }
    }
  }
  return l;
}

// ---- NVML snapshot (JSON) ---------------------------------------------------------------------

StatusOr<GpuLinks> gpuLinksFromNvmlSnapshot(const NodeTopology& topo, std::string_view text,
                                            const std::string& source_name) {
  if (text.size() > topo_xml::kMaxFileBytes)
    return invalidArgument(source_name, " is ", text.size(), " bytes, over the limit of ",
                           topo_xml::kMaxFileBytes, " bytes for an NVML snapshot");
  HSDP_ASSIGN_OR_RETURN(
      json doc,
      hsdp::parseJson(text, source_name, {.hint = "malformed or truncated NVML snapshot"}));
  try {
    if (!doc.is_object() || doc.value("format", "") != "hsdp-nvml-snapshot")
      return invalidArgument(source_name,
                             " is not an hsdp NVML snapshot (expected \"format\": "
                             "\"hsdp-nvml-snapshot\"; write one with hsdp-topo --dump-nvml)");
    if (doc.value("version", 0) != 1)
      return invalidArgument(source_name, ": NVML snapshot version ", doc.value("version", 0),
                             " is not supported (1 is)");
    const json& gpus = doc.at("gpus");
    if (!gpus.is_array()) return invalidArgument(source_name, ": \"gpus\" is not an array");
    if (gpus.size() > topo_xml::kMaxGpus)
      return invalidArgument(source_name, " lists ", gpus.size(), " GPUs, over the limit of ",
                             topo_xml::kMaxGpus, " for one host");
    GpuLinks l = emptyLinks(topo, "nvml snapshot " + source_name);
    // First pass: map every listed GPU to hwloc's, so NVLink targets can name any of them.
    std::vector<int> index;
    for (const json& g : gpus) {
      std::string bus = g.at("bus_id").get<std::string>();
      auto a = parsePciAddress(bus);
      if (!a.ok())
        return invalidArgument(source_name, ": GPU bus_id '", bus, "' is not a PCI address");
      int i = gpuByAddress(topo, *a);
      if (i < 0)
        return invalidArgument(source_name, ": GPU ", bus, " is not a GPU of ", topo.source, " (",
                               topo.gpus.size(), " GPUs); a snapshot of another machine?");
      index.push_back(i);
    }
    if (index.size() != topo.gpus.size())
      return invalidArgument(source_name, " lists ", index.size(), " GPUs but ", topo.source,
                             " has ", topo.gpus.size());
    for (size_t k = 0; k < gpus.size(); ++k) {
      const json& g = gpus[k];
      const int i = index[k];
      if (g.contains("nvlinks")) {
        for (const json& link : g.at("nvlinks")) {
          std::string type = link.value("remote_type", "");
          if (type == "switch") {
            ++l.to_switch[i];
          } else if (type == "gpu") {
            std::string rb = link.at("remote_bus_id").get<std::string>();
            auto ra = parsePciAddress(rb);
            int j = ra.ok() ? gpuByAddress(topo, *ra) : -1;
            if (j < 0 || j == i)
              return invalidArgument(source_name, ": NVLink of GPU ",
                                     g.at("bus_id").get<std::string>(), " targets '", rb,
                                     "', not another GPU of this host");
            ++l.direct[i][j];
          } else if (type != "cpu" && type != "unknown") {
            return invalidArgument(source_name, ": NVLink remote_type '", type,
                                   "' is not gpu, switch, cpu or unknown");
          }
        }
      }
      if (g.contains("fabric")) {
        const json& f = g.at("fabric");
        GpuFabric& fab = l.fabric[i];
        fab.state = f.value("state", "unknown");
        fab.cluster_uuid = f.value("cluster_uuid", "");
        fab.clique_id = f.value("clique_id", 0u);
      }
    }
    return l;
  } catch (const json::exception& e) {
    return invalidArgument(source_name, ": malformed NVML snapshot: ", e.what());
  }
}

// ---- live NVML through dlopen -----------------------------------------------------------------
namespace {

// The NVML entry points hsdp uses, on the types of topology/nvml_abi.h.
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS

struct DlHandle {
  void* h = nullptr;
  ~DlHandle() {
    if (h) dlclose(h);
  }
};

struct Nvml {
  DlHandle lib;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*errorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*driverVersion)(char*, unsigned) = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*byIndex)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*pciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*linkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  nvmlReturn_t (*remotePci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*remoteType)(nvmlDevice_t, unsigned, int*) = nullptr;        // optional
  nvmlReturn_t (*fabricInfo)(nvmlDevice_t, nvmlGpuFabricInfo_t*) = nullptr;  // optional (H100+)

  std::string err(nvmlReturn_t r) const {
    return strCat(errorString ? errorString(r) : "unknown error", " (", r, ")");
  }
};

template <typename F>
bool bind(void* lib, const char* name, F* f) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  return *f != nullptr;
}

// Shuts NVML down on every return path once it was initialised.
struct NvmlSession {
  const Nvml* api;
  ~NvmlSession() { api->shutdown(); }
};

std::string uuidString(const unsigned char* u) {
  char buf[40];
  std::snprintf(buf, sizeof(buf),
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14],
                u[15]);
  return buf;
}

}  // namespace

StatusOr<std::string> dumpNvmlSnapshot(const std::string& library) {
  Nvml api;
  dlerror();
  api.lib.h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (api.lib.h == nullptr) {
    const char* e = dlerror();
    return notFound(library, " not loaded (no NVIDIA driver?): ", e ? e : "dlopen failed");
  }
  void* h = api.lib.h;
  if (!bind(h, "nvmlInit_v2", &api.init) || !bind(h, "nvmlShutdown", &api.shutdown) ||
      !bind(h, "nvmlErrorString", &api.errorString) ||
      !bind(h, "nvmlSystemGetDriverVersion", &api.driverVersion) ||
      !bind(h, "nvmlDeviceGetCount_v2", &api.count) ||
      !bind(h, "nvmlDeviceGetHandleByIndex_v2", &api.byIndex) ||
      !bind(h, "nvmlDeviceGetPciInfo_v3", &api.pciInfo) ||
      !bind(h, "nvmlDeviceGetName", &api.name) ||
      !bind(h, "nvmlDeviceGetNvLinkState", &api.linkState) ||
      !bind(h, "nvmlDeviceGetNvLinkRemotePciInfo_v2", &api.remotePci))
    return internalError(library,
                         " lacks an NVML entry point hsdp needs (driver too old?): ", dlerror());
  bind(h, "nvmlDeviceGetNvLinkRemoteDeviceType", &api.remoteType);
  bind(h, "nvmlDeviceGetGpuFabricInfo", &api.fabricInfo);

  if (nvmlReturn_t r = api.init(); r != kNvmlSuccess)
    return internalError(library, ": nvmlInit_v2 failed: ", api.err(r));
  NvmlSession session{&api};
  json snap = {{"format", "hsdp-nvml-snapshot"}, {"version", 1}, {"gpus", json::array()}};
  char driver[96] = {0};
  if (api.driverVersion(driver, sizeof(driver)) == kNvmlSuccess) snap["driver"] = driver;
  unsigned n = 0;
  if (nvmlReturn_t r = api.count(&n); r != kNvmlSuccess)
    return internalError(library, ": nvmlDeviceGetCount_v2 failed: ", api.err(r));
  std::vector<std::string> bus_ids;
  std::vector<nvmlDevice_t> devs(n);
  for (unsigned i = 0; i < n; ++i) {
    nvmlPciInfo_t pci{};
    if (nvmlReturn_t r = api.byIndex(i, &devs[i]); r != kNvmlSuccess)
      return internalError(library, ": nvmlDeviceGetHandleByIndex_v2(", i,
                           ") failed: ", api.err(r));
    if (nvmlReturn_t r = api.pciInfo(devs[i], &pci); r != kNvmlSuccess)
      return internalError(library, ": nvmlDeviceGetPciInfo_v3(GPU ", i, ") failed: ", api.err(r));
    pci.busId[sizeof(pci.busId) - 1] = '\0';
    bus_ids.push_back(pci.busId);
  }
  for (unsigned i = 0; i < n; ++i) {
    json g = {{"index", i}, {"bus_id", bus_ids[i]}, {"nvlinks", json::array()}};
    char name[96] = {0};
    if (api.name(devs[i], name, sizeof(name)) == kNvmlSuccess) g["name"] = name;
    for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
      int active = 0;
      // NOT_SUPPORTED / INVALID_ARGUMENT past the GPU's last link (or on PCIe-only GPUs).
      if (api.linkState(devs[i], link, &active) != kNvmlSuccess) break;
      if (!active) continue;
      nvmlPciInfo_t remote{};
      if (api.remotePci(devs[i], link, &remote) != kNvmlSuccess) continue;
      remote.busId[sizeof(remote.busId) - 1] = '\0';
      std::string type = "unknown";
      int t = -1;
      if (api.remoteType && api.remoteType(devs[i], link, &t) == kNvmlSuccess) {
        type = t == 0 ? "gpu" : t == 2 ? "switch" : t == 1 ? "cpu" : "unknown";
      } else {  // older drivers: a peer that is one of our GPUs is a GPU, anything else a switch
        auto ra = parsePciAddress(remote.busId);
        type = "switch";
        for (const std::string& b : bus_ids) {
          auto ba = parsePciAddress(b);
          if (ra.ok() && ba.ok() && *ra == *ba) type = "gpu";
        }
      }
      g["nvlinks"].push_back(
          {{"link", link}, {"remote_type", type}, {"remote_bus_id", remote.busId}});
    }
    json fabric = {{"state", "not_supported"}};
    nvmlGpuFabricInfo_t fi{};
    if (api.fabricInfo && api.fabricInfo(devs[i], &fi) == kNvmlSuccess) {
      static const char* kStates[] = {"not_supported", "not_started", "in_progress", "completed"};
      fabric["state"] = fi.state < 4 ? kStates[fi.state] : "unknown";
      if (fi.state == 3 && fi.status == kNvmlSuccess) {
        fabric["cluster_uuid"] = uuidString(fi.clusterUuid);
        fabric["clique_id"] = fi.cliqueId;
      } else if (fi.state == 3) {
        fabric["status"] = api.err(fi.status);
      }
    }
    g["fabric"] = fabric;
    snap["gpus"].push_back(g);
  }
  return snap.dump(1);
}

StatusOr<GpuLinks> gpuLinksFromNvml(const NodeTopology& topo, const std::string& library) {
  HSDP_ASSIGN_OR_RETURN(std::string snap, dumpNvmlSnapshot(library));
  HSDP_ASSIGN_OR_RETURN(GpuLinks l,
                        gpuLinksFromNvmlSnapshot(topo, snap, "live NVML (" + library + ")"));
  l.source = "nvml";
  return l;
}

}  // namespace hsdp
