// The binding plan (HSDP_BIND): which NUMA node and cores a rank is bound to, next to its GPU or
// NIC, and applying it through hwloc. The topology it plans on is node_topology.cc's.
#include <hwloc.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "topology/hwloc_handles.h"
#include "topology/node_topology.h"

namespace hsdp {

using hwloc_detail::BitmapPtr;
using hwloc_detail::listString;
using hwloc_detail::newTopology;
using hwloc_detail::TopologyPtr;

StatusOr<BindMode> parseBindMode(std::string_view text) {
  if (text.empty() || text == "auto") return BindMode::kAuto;
  if (text == "none") return BindMode::kNone;
  if (text == "numa") return BindMode::kNuma;
  if (text == "core") return BindMode::kCore;
  return invalidArgument("HSDP_BIND='", text, "' is not one of auto, none, numa, core");
}

const char* bindModeName(BindMode mode) {
  switch (mode) {
    case BindMode::kAuto:
      return "auto";
    case BindMode::kNone:
      return "none";
    case BindMode::kNuma:
      return "numa";
    case BindMode::kCore:
      return "core";
  }
  return "?";
}

std::string BindPlan::describe() const {
  std::string where = gpu >= 0 ? strCat("GPU", gpu) : std::string("no GPU");
  if (nic >= 0) where += strCat(", NIC", nic);
  if (mode == BindMode::kNone && !launcher_cpus.empty())
    return strCat(where, "; launcher-bound (HSDP_BIND=", bindModeName(requested), "): ", reason);
  if (mode == BindMode::kNone)
    return strCat(where, "; unbound (HSDP_BIND=", bindModeName(requested), "): ", reason);
  return strCat(where, "; bound (", bindModeName(mode), ", HSDP_BIND=", bindModeName(requested),
                ") to NUMA ", numa, " cpus ", cpuset, ": ", reason);
}

namespace {
// The NUMA node (os index) and NIC the `r`-th of `size` ranks sits next to; see planBinding.
void rankLocality(const NodeTopology& topo, int r, int size, int* gpu, int* nic, int* numa,
                  std::string* reason) {
  *gpu = *nic = *numa = -1;
  if (!topo.gpus.empty()) {
    *gpu = r % static_cast<int>(topo.gpus.size());
    *nic = topo.nic_of_gpu.empty() ? -1 : topo.nic_of_gpu[*gpu];
    *numa = topo.gpus[*gpu].numa;
    *reason =
        strCat("GPU", *gpu, " (", topo.gpus[*gpu].pci.toString(), ") is local to NUMA ", *numa);
    return;
  }
  std::vector<int> fast;
  for (const NicDevice& n : topo.nics)
    if (n.kind == NicKind::kInfiniBand) fast.push_back(n.index);
  if (fast.empty())
    for (const NicDevice& n : topo.nics) fast.push_back(n.index);
  if (!fast.empty()) {
    // Blocks of consecutive ranks per NIC, so neighbours (often a shard group) share a socket.
    *nic = fast[static_cast<size_t>(r) * fast.size() / std::max(size, 1)];
    *numa = topo.nics[*nic].numa;
    *reason = strCat("CPU-only host: NIC ", topo.nics[*nic].name, " is local to NUMA ", *numa);
    return;
  }
  if (!topo.numa_nodes.empty()) {
    *numa = topo.numa_nodes[static_cast<size_t>(r) * topo.numa_nodes.size() / std::max(size, 1)]
                .os_index;
    *reason = "no GPU or NIC: ranks spread over the NUMA nodes in blocks";
  }
}
}  // namespace

BindPlan planBinding(const NodeTopology& topo, int local_rank, int local_size, BindMode mode) {
  BindPlan p;
  p.requested = mode;
  rankLocality(topo, local_rank, local_size, &p.gpu, &p.nic, &p.numa, &p.reason);
  p.mode = mode;
  if (mode == BindMode::kAuto) {
    // Binding only pays where memory locality differs; oversubscribed ranks must float.
    if (topo.numa_nodes.size() < 2) {
      p.mode = BindMode::kNone;
      p.reason = "one NUMA node, nothing to choose";
    } else if (local_size > topo.cores) {
      p.mode = BindMode::kNone;
      p.reason = strCat(local_size, " ranks oversubscribe the ", topo.cores, " cores");
    } else {
      p.mode = BindMode::kNuma;
    }
  }
  const int slot = topo.numaSlot(p.numa);
  if (p.mode != BindMode::kNone && slot < 0) {
    p.mode = BindMode::kNone;
    p.reason = "locality unknown (no NUMA node with CPUs near the device)";
  }
  if (p.mode == BindMode::kNuma) {
    p.cpuset = topo.numa_nodes[slot].cpuset;
  } else if (p.mode == BindMode::kCore) {
    // The ordinal of this rank among the host's ranks that share its NUMA node picks the core.
    int ordinal = 0;
    for (int r = 0; r < local_rank; ++r) {
      int g, n, numa;
      std::string why;
      rankLocality(topo, r, local_size, &g, &n, &numa, &why);
      ordinal += numa == p.numa;
    }
    const auto& cores = topo.numa_nodes[slot].core_cpusets;
    p.cpuset = cores.empty() ? topo.numa_nodes[slot].cpuset : cores[ordinal % cores.size()];
  }
  return p;
}

namespace {
// A CPU list as a bitmap; null when it is not a non-empty list.
BitmapPtr parseCpuList(const std::string& list) {
  BitmapPtr b(hwloc_bitmap_alloc());
  if (!b || list.empty() || hwloc_bitmap_list_sscanf(b.get(), list.c_str()) != 0 ||
      hwloc_bitmap_iszero(b.get()))
    return nullptr;
  return b;
}

// What applyBinding last applied in this process, and the binding the process had before hsdp
// first bound it (see readCpuBinding).
std::mutex g_applied_mu;
std::string g_applied, g_before;

// A loaded topology of this machine's CPUs (no I/O objects: fast).
StatusOr<TopologyPtr> loadCpuTopology() {
  HSDP_ASSIGN_OR_RETURN(TopologyPtr t, newTopology());
  hwloc_topology_set_io_types_filter(t.get(), HWLOC_TYPE_FILTER_KEEP_NONE);
  if (hwloc_topology_load(t.get()) != 0)
    return internalError("hwloc failed to load this machine's topology: ", std::strerror(errno));
  return t;
}

StatusOr<std::string> processCpubind(hwloc_topology_t t) {
  BitmapPtr b(hwloc_bitmap_alloc());
  if (!b) return Status(StatusCode::kResourceExhausted, "hwloc_bitmap_alloc failed");
  if (hwloc_get_cpubind(t, b.get(), HWLOC_CPUBIND_PROCESS) != 0)
    return internalError("hwloc_get_cpubind failed: ", std::strerror(errno));
  return listString(b.get());
}
}  // namespace

std::string CpuBinding::launcherCpus() const {
  BitmapPtr b = parseCpuList(bound), a = parseCpuList(allowed);
  if (!b || !a) return "";
  // Bound to fewer CPUs than allowed: someone chose them. Equal is a process free to run
  // anywhere it may.
  const bool strict =
      hwloc_bitmap_isincluded(b.get(), a.get()) && !hwloc_bitmap_isequal(a.get(), b.get());
  return strict ? listString(b.get()) : "";
}

StatusOr<CpuBinding> readCpuBinding() {
  HSDP_ASSIGN_OR_RETURN(TopologyPtr t, loadCpuTopology());
  CpuBinding c;
  HSDP_ASSIGN_OR_RETURN(c.bound, processCpubind(t.get()));
  c.allowed = listString(hwloc_topology_get_allowed_cpuset(t.get()));
  std::lock_guard<std::mutex> lock(g_applied_mu);
  if (!g_applied.empty() && c.bound == g_applied) c.bound = g_before;
  return c;
}

BindPlan respectLauncherBinding(BindPlan plan, const std::string& launcher_cpus) {
  if (launcher_cpus.empty() || plan.requested == BindMode::kNone) return plan;
  BitmapPtr launcher = parseCpuList(launcher_cpus);
  if (!launcher) {
    plan.mode = BindMode::kNone;
    plan.cpuset.clear();
    plan.reason = strCat("the launcher's binding '", launcher_cpus, "' is not a CPU list; kept");
    return plan;
  }
  plan.launcher_cpus = listString(launcher.get());
  const std::string kept = strCat("bound by the launcher to cpus ", plan.launcher_cpus, "; kept");
  if (plan.requested == BindMode::kAuto || plan.mode == BindMode::kNone) {
    plan.reason = plan.requested == BindMode::kAuto ? kept : strCat(plan.reason, "; ", kept);
    plan.mode = BindMode::kNone;
    plan.cpuset.clear();
    return plan;
  }
  BitmapPtr planned = parseCpuList(plan.cpuset), both(hwloc_bitmap_alloc());
  if (planned && both) hwloc_bitmap_and(both.get(), planned.get(), launcher.get());
  if (!planned || !both || hwloc_bitmap_iszero(both.get())) {
    plan.reason = strCat("planned NUMA ", plan.numa, " cpus ", plan.cpuset, " (", plan.reason,
                         ") and the launcher's cpus ", plan.launcher_cpus,
                         " do not overlap; kept the launcher's binding");
    plan.mode = BindMode::kNone;
    plan.cpuset.clear();
    return plan;
  }
  const std::string inter = listString(both.get());
  if (hwloc_bitmap_isequal(both.get(), planned.get())) {
    plan.reason = strCat(plan.reason, "; inside the launcher's cpus ", plan.launcher_cpus);
  } else {
    plan.reason = strCat(plan.reason, "; narrowed from ", plan.cpuset, " to the launcher's cpus ",
                         plan.launcher_cpus);
    plan.cpuset = inter;
  }
  return plan;
}

Status applyBinding(const NodeTopology& topo, const BindPlan& plan) {
  if (plan.mode == BindMode::kNone) return okStatus();
  if (topo.source != "live")
    return failedPrecondition("cannot bind to a recorded topology (", topo.source,
                              "): its CPUs are not this machine's");
  HSDP_ASSIGN_OR_RETURN(TopologyPtr t, loadCpuTopology());
  BitmapPtr cpus(hwloc_bitmap_alloc()), nodes(hwloc_bitmap_alloc());
  if (!cpus || !nodes) return Status(StatusCode::kResourceExhausted, "hwloc_bitmap_alloc failed");
  if (hwloc_bitmap_list_sscanf(cpus.get(), plan.cpuset.c_str()) != 0 ||
      hwloc_bitmap_iszero(cpus.get()))
    return invalidArgument("binding cpuset '", plan.cpuset, "' is not a CPU list");
  StatusOr<std::string> before = processCpubind(t.get());
  if (hwloc_set_cpubind(t.get(), cpus.get(), HWLOC_CPUBIND_PROCESS) != 0)
    return internalError("hwloc_set_cpubind(", plan.cpuset, ") failed: ", std::strerror(errno));
  {
    std::lock_guard<std::mutex> lock(g_applied_mu);
    // The binding before hsdp's own first one is what a later readCpuBinding reports.
    if (before.ok() && (g_applied.empty() || *before != g_applied)) g_before = *before;
    g_applied = listString(cpus.get());
  }
  hwloc_bitmap_only(nodes.get(), static_cast<unsigned>(plan.numa));
  // Memory policy is best effort: kernels without NUMA support refuse it, CPU binding still holds.
  if (hwloc_set_membind(t.get(), nodes.get(), HWLOC_MEMBIND_BIND,
                        HWLOC_MEMBIND_PROCESS | HWLOC_MEMBIND_BYNODESET) != 0)
    return internalError("CPUs bound to ", plan.cpuset, ", but hwloc_set_membind(NUMA ", plan.numa,
                         ") failed: ", std::strerror(errno));
  return okStatus();
}

}  // namespace hsdp
