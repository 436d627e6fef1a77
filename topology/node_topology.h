// What one host looks like: NUMA nodes, cores, NVIDIA GPUs, network devices, the PCI path
// between every pair of them (in the vocabulary of `nvidia-smi topo -m`), the NVLink graph and
// the multi-node NVLink fabric clique of the GPUs, the NIC each GPU should use (its rail), and
// where a rank should be bound.
//
// Sources, all optional except the first:
//   - hwloc: the live machine, or a recorded hwloc v2 XML (HSDP_TOPO_FILE, `hsdp-topo --input`).
//   - NVML, loaded at run time with dlopen("libnvidia-ml.so.1") so that hsdp builds and runs where
//     no driver exists; or a recorded NVML snapshot (HSDP_TOPO_NVML_FILE, JSON written by
//     `hsdp-topo --dump-nvml`).
//   - NCCL's own topology XML (the file NCCL writes for NCCL_TOPO_DUMP_FILE;
//     HSDP_TOPO_NCCL_FILE), a second source for the NVLink graph.
// Topology knows nothing of sharding; cluster_topology.h turns per-host views into the node level
// of the mesh.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hsdp/status.h"

namespace hsdp {

// A PCI address, domain:bus:device.function. NVML writes 8 hex digits of domain, hwloc and NCCL 4;
// both parse to the same value.
struct PciAddress {
  uint32_t domain = 0, bus = 0, device = 0, function = 0;
  std::string toString() const;  // "0000:18:00.0"
  bool operator==(const PciAddress&) const = default;
};
StatusOr<PciAddress> parsePciAddress(std::string_view text);

// How two devices reach each other, best first (the legend of `nvidia-smi topo -m`):
//   kPix  through at most one PCIe switch          kPxb  through several PCIe switches
//   kPhb  through a PCIe host bridge (CPU)          kNode across host bridges of one NUMA node
//   kSys  across the SMP interconnect (sockets / NUMA nodes)
// kSelf is a device with itself.
enum class PciPath { kSelf = 0, kPix, kPxb, kPhb, kNode, kSys };
const char* pciPathName(PciPath path);  // "X", "PIX", "PXB", "PHB", "NODE", "SYS"

enum class NicKind { kInfiniBand, kEthernet };
const char* nicKindName(NicKind kind);  // "InfiniBand", "Ethernet"

struct NumaNode {
  int os_index = -1;
  int package = -1;                       // os index of the package (socket), -1 if none
  std::string cpuset;                     // hwloc list syntax, e.g. "0-55,112-167"
  std::vector<std::string> core_cpusets;  // one per core, list syntax
  uint64_t memory_bytes = 0;
};

struct GpuDevice {
  int index = 0;  // 0..gpus-1, in PCI order (what CUDA_DEVICE_ORDER=PCI_BUS_ID uses)
  PciAddress pci;
  uint16_t device_id = 0;  // PCI device id, e.g. 0x2330 (H100 SXM5)
  std::string name;        // from NVML when known, else "NVIDIA 10de:2330"
  int numa = -1;           // os index of the nearest NUMA node
  std::string cpuset;      // CPUs local to the GPU, list syntax
};

struct NicDevice {
  int index = 0;
  std::string name;    // the HCA ("mlx5_0") for InfiniBand/RoCE, else the netdev ("eno1")
  std::string netdev;  // the Linux network interface, when hwloc reports one
  NicKind kind = NicKind::kEthernet;
  PciAddress pci;
  int numa = -1;
  std::string cpuset;
};

// The multi-node NVLink fabric membership of a GPU (NVML's nvmlGpuFabricInfo_t). GPUs that share
// cluster_uuid and clique_id with a completed registration are one NVLink domain, even across
// hosts (GB200 NVL72: 72 GPUs in 18 trays).
struct GpuFabric {
  std::string state = "unknown";  // "not_supported", "not_started", "in_progress", "completed"
  std::string cluster_uuid;
  uint32_t clique_id = 0;
  bool member() const { return state == "completed" && !cluster_uuid.empty(); }
};

// The NVLink graph of one host as NVML or NCCL report it, indexed like NodeTopology::gpus.
struct GpuLinks {
  std::string source;                    // "nvml", "nvml snapshot FILE", "nccl xml FILE"
  std::vector<std::vector<int>> direct;  // [i][j]: NVLinks from GPU i straight to GPU j
  std::vector<int> to_switch;            // [i]: NVLinks from GPU i to an NVSwitch
  std::vector<GpuFabric> fabric;         // [i]
};

struct NodeTopology {
  std::string host;
  std::string source;  // "live" or the XML file
  std::string arch;
  int packages = 0, cores = 0, pus = 0;
  std::vector<NumaNode> numa_nodes;
  std::vector<GpuDevice> gpus;
  std::vector<NicDevice> nics;  // InfiniBand HCAs first, then Ethernet; each in PCI order
  std::vector<std::vector<PciPath>> gpu_gpu_path;  // [i][j]
  std::vector<std::vector<PciPath>> gpu_nic_path;  // [gpu][nic]

  // NVLink graph. Empty `links.source` means no NVLink information (no NVML, no snapshot).
  GpuLinks links;
  std::string links_note;  // why there is none, e.g. "libnvidia-ml.so.1 not loaded: ..."

  // The rail of every GPU: the index of its nearest NIC by PCI path (InfiniBand preferred over
  // Ethernet), ties spread over the GPUs so that two GPUs of one PCIe switch take its two NICs.
  std::vector<int> nic_of_gpu;

  // NVLinks between GPUs i and j: direct links, or, when both reach NVSwitches, the smaller of
  // their switch link counts (what `nvidia-smi topo -m` prints as NV<n>). 0 = no NVLink.
  int nvlinks(int i, int j) const;
  // True when every GPU reaches every other over NVLink (an NVSwitch, or a full mesh).
  bool nvlinkAllToAll() const;
  // "uuid/clique" when every GPU of the host is a member of the same NVLink fabric clique;
  // "" otherwise (the NVLink domain is then the host).
  std::string fabricDomain() const;
  // The os index of NUMA node `os_index` in numa_nodes, or -1.
  int numaSlot(int os_index) const;
};

// Where the topology comes from. Empty strings mean: the live machine for hwloc, live NVML
// (dlopen) for the links when hwloc is live, no NCCL XML.
struct TopologySources {
  std::string hwloc_xml;                           // HSDP_TOPO_FILE
  std::string nvml_snapshot;                       // HSDP_TOPO_NVML_FILE
  std::string nccl_xml;                            // HSDP_TOPO_NCCL_FILE
  std::string nvml_library = "libnvidia-ml.so.1";  // dlopen name; tests point it at a fake
};
StatusOr<TopologySources> topologySourcesFromEnv();

// hwloc part only, from an XML document in memory (`source_name` names it in errors) or from the
// live machine. Errors name the file/source and what is wrong with it.
StatusOr<NodeTopology> nodeTopologyFromHwlocXml(std::string_view xml,
                                                const std::string& source_name);
StatusOr<NodeTopology> nodeTopologyFromLiveMachine();

// Reads a file whole; errors name the path (missing, unreadable, empty).
StatusOr<std::string> readTopologyFile(const std::string& path, const std::string& what);

// NVLink graph readers. GPUs are matched to `topo.gpus` by PCI address; a snapshot naming a GPU
// hwloc does not have is an error naming the address.
StatusOr<GpuLinks> gpuLinksFromNvmlSnapshot(const NodeTopology& topo, std::string_view json,
                                            const std::string& source_name);
StatusOr<GpuLinks> gpuLinksFromNcclXml(const NodeTopology& topo, std::string_view xml,
                                       const std::string& source_name);
// Live NVML through dlopen(`library`). NotFound when the library cannot be loaded (no driver);
// Internal with NVML's own error string when a call fails.
StatusOr<GpuLinks> gpuLinksFromNvml(const NodeTopology& topo, const std::string& library);
// The live NVML view serialized as a snapshot (for `hsdp-topo --dump-nvml`).
StatusOr<std::string> dumpNvmlSnapshot(const std::string& library);

// Fills gpu_gpu_path-independent derived data: nic_of_gpu, GPU names. Called by discover*.
void assignRails(NodeTopology* topo);

// Everything together: hwloc (live or file) + links (snapshot, NCCL XML, or live NVML when hwloc
// is live) + rails. A missing NVML library on the live machine is not an error: links_note says
// why there is no NVLink information and the host is the NVLink domain.
StatusOr<NodeTopology> discoverNodeTopology(const TopologySources& sources);

// ---- binding ----------------------------------------------------------------------------------

// HSDP_BIND: auto (numa where it helps, see planBinding), none, numa (the NUMA node nearest the
// rank's GPU, or its NIC on CPU-only hosts), core (one core of that NUMA node per rank). A binding
// the launcher already gave the process is never widened (see respectLauncherBinding).
enum class BindMode { kAuto, kNone, kNuma, kCore };
StatusOr<BindMode> parseBindMode(std::string_view text);
StatusOr<BindMode> bindModeFromEnv();  // parseBindMode of HSDP_BIND (unset: auto)
const char* bindModeName(BindMode mode);
// Whether any of HSDP_TOPO_FILE, HSDP_TOPO_NVML_FILE, HSDP_TOPO_NCCL_FILE or HSDP_BIND is set.
bool topologyEnvSet();

struct BindPlan {
  BindMode requested = BindMode::kAuto;
  BindMode mode = BindMode::kNone;  // what will be applied (auto resolved)
  int gpu = -1;                     // the rank's GPU (index in NodeTopology::gpus), -1 none
  int nic = -1;                     // the rank's NIC (rail), -1 none
  int numa = -1;                    // os index of the NUMA node it is bound to, -1 none
  std::string cpuset;               // list syntax; "" when unbound
  std::string launcher_cpus;        // the launcher's binding it respects; "" when none
  std::string reason;               // one line: why this binding
  std::string describe() const;
};

// Pure: which GPU, NIC and CPUs the `local_rank`-th of `local_size` ranks on this host gets.
// GPU = local_rank % gpus. The NIC is the GPU's rail; on CPU-only hosts the ranks are spread over
// the fast NICs (InfiniBand, else Ethernet) in blocks. auto = numa when the host has several
// NUMA nodes and the ranks do not oversubscribe the cores, none otherwise.
BindPlan planBinding(const NodeTopology& topo, int local_rank, int local_size, BindMode mode);

// This process's CPU binding, read live: `bound` is hwloc_get_cpubind(HWLOC_CPUBIND_PROCESS) (the
// union over its threads), `allowed` the CPUs the machine allows it (hwloc's allowed cpuset: the
// cgroup cpuset, which the live topology is already restricted to). Both in list syntax.
struct CpuBinding {
  std::string bound;
  std::string allowed;
  // Pure: `bound` when it is a strict subset of `allowed` (a launcher bound the process: srun
  // --cpu-bind, mpirun --bind-to, taskset), else "".
  std::string launcherCpus() const;
};
// A binding hsdp applied itself (applyBinding) reads as the one the process had before it, so a
// second discovery in the same process does not take hsdp's binding for the launcher's.
StatusOr<CpuBinding> readCpuBinding();

// Pure: `plan` for a process the launcher already bound to `launcher_cpus` ("" when it did not:
// the plan is returned unchanged, as is any plan for HSDP_BIND=none). The launcher's binding is
// never widened: auto keeps it (mode none); numa and core bind to the intersection of the
// planned CPUs and the launcher's, or keep the launcher's binding when they do not overlap.
BindPlan respectLauncherBinding(BindPlan plan, const std::string& launcher_cpus);

// Binds the calling process (CPU and memory policy) with hwloc. Only valid for a topology of
// the live machine; a recorded topology is an error (its CPUs are not this machine's).
Status applyBinding(const NodeTopology& topo, const BindPlan& plan);

}  // namespace hsdp
