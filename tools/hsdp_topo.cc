// hsdp-topo: what hsdp sees of a host and the mesh it would build.
//
//   hsdp-topo                                  this machine
//   hsdp-topo --input dgx.xml --nvml dgx.nvml.json --intra-shard 4 --inter-shard 1
//   hsdp-topo --input tray0.xml --nvml tray0.nvml.json --input tray1.xml --nvml tray1.nvml.json
//                                              several recorded hosts as one simulated cluster
//   mpirun -np 16 hsdp-topo                    the gathered cluster view, printed by rank 0
//   hsdp-topo --dump-nvml FILE                 record this GPU host's NVML view for tests
//
// Prints: the host summary, a matrix in the style of `nvidia-smi topo -m` (GPU x GPU link, GPU x
// NIC PCI path, CPU and NUMA affinity), the rails, the binding of each local rank, the cluster's
// node level and the mesh for --intra-shard/--inter-shard. --json prints the same as one object.
// Exit codes: 0 ok, 2 bad input (the message names the file or value), 3 a runtime failure (a
// failing disk, a foreign library's error).
#include <cstdio>
#include <cstdlib>

#include "engine/topology_report.h"
#include "hsdp/cli.h"
#include "hsdp/files.h"
#include "hsdp/flags.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "topology/cluster_topology.h"
#include "topology/node_topology.h"

namespace {

constexpr int kExitBadInput = 2;

struct Options {
  std::vector<std::string> inputs, nvml, nccl;
  int ranks_per_host = 0;  // 0: one per GPU, or 1 on CPU-only hosts
  int intra_shard = 0, inter_shard = 0;
  std::string bind;
  std::string dump_nvml;
  bool json = false;
};

void printHost(const hsdp::NodeTopology& t) {
  std::printf("host %s (%s; %s)\n", t.host.c_str(), t.arch.empty() ? "?" : t.arch.c_str(),
              t.source == "live" ? "this machine" : t.source.c_str());
  std::printf("  %d packages, %d cores, %d PUs, %zu NUMA nodes, %zu GPUs, %zu NICs\n", t.packages,
              t.cores, t.pus, t.numa_nodes.size(), t.gpus.size(), t.nics.size());
  for (const auto& n : t.numa_nodes)
    std::printf("  NUMA %d: package %d, cpus %s, %zu cores, %.1f GiB\n", n.os_index, n.package,
                n.cpuset.c_str(), n.core_cpusets.size(), n.memory_bytes / 1073741824.0);
  for (const auto& n : t.nics)
    std::printf("  NIC%d %s (%s%s%s) pci %s NUMA %d\n", n.index, n.name.c_str(),
                hsdp::nicKindName(n.kind), n.netdev.empty() || n.netdev == n.name ? "" : ", ",
                n.netdev == n.name ? "" : n.netdev.c_str(), n.pci.toString().c_str(), n.numa);
  if (!t.links.source.empty())
    std::printf("  NVLink: %s%s%s\n", t.links.source.c_str(),
                t.nvlinkAllToAll() ? "; all GPUs connected (NVSwitch or full mesh)" : "",
                t.fabricDomain().empty() ? "" : ("; fabric clique " + t.fabricDomain()).c_str());
  else
    std::printf("  NVLink: no information (%s)\n", t.links_note.c_str());
  if (t.gpus.empty()) return;
  std::printf("\n        ");
  for (const auto& g : t.gpus) std::printf("%-6s", hsdp::strCat("GPU", g.index).c_str());
  for (const auto& n : t.nics) std::printf("%-6s", hsdp::strCat("NIC", n.index).c_str());
  std::printf("%-20s %s\n", "CPU Affinity", "NUMA Affinity");
  for (const auto& g : t.gpus) {
    std::printf("  GPU%-3d", g.index);
    for (const auto& h : t.gpus)
      std::printf("%-6s", hsdp::engine::linkCell(t, g.index, h.index).c_str());
    for (const auto& n : t.nics)
      std::printf("%-6s", hsdp::pciPathName(t.gpu_nic_path[g.index][n.index]));
    std::printf("%-20s %d\n", g.cpuset.c_str(), g.numa);
  }
  std::printf(
      "\n  Legend: X = self, NV# = # NVLinks, PIX = one PCIe switch, PXB = several PCIe "
      "switches, PHB = PCIe host bridge, NODE = host bridges of one NUMA node, SYS = across "
      "NUMA nodes\n  rails:");
  for (const auto& g : t.gpus) {
    int n = t.nic_of_gpu[g.index];
    std::printf(" GPU%d->%s", g.index,
                n < 0 ? "none"
                      : hsdp::strCat(t.nics[n].name, "(",
                                     hsdp::pciPathName(t.gpu_nic_path[g.index][n]), ")")
                            .c_str());
  }
  std::printf("\n");
}

// Prints the cluster part; returns the exit code.
int report(const Options& opt, const std::vector<hsdp::NodeTopology>& hosts,
           const hsdp::ClusterTopology& c) {
  hsdp::MeshSpec spec{opt.intra_shard, opt.inter_shard};
  auto shape = hsdp::resolveMeshShape(c.layout, spec);
  if (opt.json) {
    std::printf("%s\n", hsdp::engine::topologyJson(hosts, c, spec).c_str());
    return shape.ok() ? 0 : kExitBadInput;
  }
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (i) std::printf("\n");
    printHost(hosts[i]);
  }
  std::printf("\nranks (%zu on %d hosts):\n", c.ranks.size(), c.num_hosts);
  for (const auto& v : c.ranks)
    std::printf("  rank %d on %s local %d: %s%s\n", v.world_rank, v.host.c_str(), v.local_rank,
                v.nic.empty() ? "" : ("rail " + v.nic + "; ").c_str(), v.bind.describe().c_str());
  std::printf("\nnode level: %s\n%s\n", c.level.c_str(), c.describe().c_str());
  if (!shape.ok()) {
    std::fprintf(stderr, "hsdp-topo: error: %s\n",
                 hsdp::files::printable(shape.status().toString()).c_str());
    return kExitBadInput;
  }
  const auto& s = *shape;
  std::printf(
      "mesh: %d ranks = %d nodes x %d; intra_shard %d x inter_shard %d = shard group %d; "
      "replicas %d\n",
      s.world_size, s.num_nodes, s.ranks_per_node, s.intra_shard, s.inter_shard, s.shardGroupSize(),
      s.replicas());
  return 0;
}

using hsdp::cli::exitCodeOf;

int fail(const hsdp::Status& s) {
  std::fprintf(stderr, "hsdp-topo: error: %s\n", hsdp::files::printable(s.toString()).c_str());
  return exitCodeOf(s);
}

// Recorded or live hosts without MPI: each host gets `ranks_per_host` simulated ranks.
int runLocal(const Options& opt) {
  hsdp::TopologyQuery q{opt.inputs,      opt.nvml,        opt.nccl, opt.ranks_per_host,
                        opt.intra_shard, opt.inter_shard, opt.bind};
  auto view = hsdp::engine::simulateTopology(q);
  if (!view.ok()) return fail(view.status());
  return report(opt, view->hosts, view->cluster);
}

int runMpi(int argc, char** argv, const Options& opt) {
  auto session = hsdp::mpi::Session::init(&argc, &argv);
  if (!session.ok()) return fail(session.status());
  auto world = (*session)->world();
  if (!world.ok()) return fail(world.status());
  hsdp::NodeTopology local;
  auto c = hsdp::discoverClusterTopology(**world, hsdp::ClusterOptions{false}, &local);
  if (!c.ok()) {
    std::fprintf(stderr, "hsdp-topo [rank %d]: error: %s\n", (*world)->rank(),
                 c.status().toString().c_str());
    return exitCodeOf(c.status());
  }
  if ((*world)->rank() != 0) return 0;
  return report(opt, {local}, *c);
}

}  // namespace

int main(int argc, char** argv) {
  // hwloc reads recorded XML with its built-in minimal parser rather than its libxml2 plugin
  // (unless the user chose with HWLOC_LIBXML / HWLOC_LIBXML_IMPORT): the library hands hwloc
  // only its own re-serialization of a checked document, in the plain form that parser reads,
  // so the plugin adds nothing but a global libxml2 error handler that dangles once hwloc
  // unloads it (hsdp also restores the handlers around every hwloc load; this is the second
  // fence). Set here, before any thread or hwloc call, because hwloc reads it once and setenv
  // is not safe beside other threads, which is why the library itself does not do it.
  if (!std::getenv("HWLOC_LIBXML") && !std::getenv("HWLOC_LIBXML_IMPORT"))
    setenv("HWLOC_LIBXML_IMPORT", "0", 0);
  CLI::App app{"hsdp-topo: hosts, GPU/NIC topology, binding and the mesh hsdp would build"};
  Options opt;
  app.add_option("--input", opt.inputs, "recorded hwloc v2 XML (repeat for several hosts)")
      ->check(CLI::ExistingFile);
  app.add_option("--nvml", opt.nvml, "NVML snapshot per --input (hsdp-topo --dump-nvml)");
  app.add_option("--nccl", opt.nccl, "NCCL topology XML per --input (NCCL_TOPO_DUMP_FILE)");
  // At most 4096 ranks per host (a simulated host's views are built in memory, one per rank).
  hsdp::cli::addInt(app, "--ranks-per-host", opt.ranks_per_host,
                    "simulated ranks per host (default: one per GPU, 1 on CPU-only hosts)", 1,
                    4096);
  hsdp::cli::addShardFactorFlags(
      app, opt.intra_shard, opt.inter_shard,
      {"shard factor inside a node (default: all)", "shard factor across nodes (default: 1)"});
  app.add_option("--bind", opt.bind, "auto|none|numa|core (default: HSDP_BIND, else auto)");
  app.add_option("--dump-nvml", opt.dump_nvml, "write this host's NVML view to FILE and exit");
  app.add_flag("--json", opt.json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, "hsdp-topo");
  }
  if (opt.intra_shard < 0 || opt.inter_shard < 0)
    return fail(hsdp::invalidArgument("--intra-shard ", opt.intra_shard, " / --inter-shard ",
                                      opt.inter_shard, " must be positive"));
  if (!opt.dump_nvml.empty()) {
    auto snap = hsdp::dumpNvmlSnapshot("libnvidia-ml.so.1");
    if (!snap.ok()) return fail(snap.status());
    // Written atomically through the file layer: never through a symbolic link, FIFO or device,
    // never a half-written snapshot in place of an old one.
    if (hsdp::Status s = hsdp::files::writeFileAtomically(opt.dump_nvml, *snap + "\n"); !s.ok())
      return fail(s);
    return 0;
  }
  // Under mpirun (Open MPI or any PMIx launcher) the cluster view is gathered; otherwise MPI is
  // not started at all, so the tool works on machines without a launcher.
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK");
  if (under_mpirun && opt.inputs.size() <= 1 && opt.nvml.empty() && opt.nccl.empty()) {
    if (!opt.inputs.empty()) setenv("HSDP_TOPO_FILE", opt.inputs[0].c_str(), 1);
    if (!opt.bind.empty()) setenv("HSDP_BIND", opt.bind.c_str(), 1);
    return runMpi(argc, argv, opt);
  }
  return runLocal(opt);
}
