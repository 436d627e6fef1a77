// Topology discovery on recorded machines (tests/topology/fixtures, real hwloc v2 XML): device
// inventory, PCI paths, rails, NVLink graph, binding, the cluster's node level and the mesh it
// gives, and the errors for bad input. CPU counts are checked against hwloc's own CLI
// (hwloc-calc), an independent reading of the same file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "hsdp/mesh.h"
#include "topology/cluster_topology.h"
#include "topology/node_topology.h"

namespace hsdp {
namespace {

const std::string kDir = HSDP_TOPO_FIXTURES;

NodeTopology load(const std::string& xml, const std::string& nvml = "",
                  const std::string& nccl = "") {
  TopologySources s;
  s.hwloc_xml = kDir + "/" + xml;
  if (!nvml.empty()) s.nvml_snapshot = kDir + "/" + nvml;
  if (!nccl.empty()) s.nccl_xml = kDir + "/" + nccl;
  auto t = discoverNodeTopology(s);
  EXPECT_TRUE(t.ok()) << t.status().toString();
  return t.ok() ? *t : NodeTopology();
}

// hwloc-calc's count of `type` objects in a recorded topology.
int hwlocCalc(const std::string& xml, const std::string& type) {
  std::string cmd = "hwloc-calc --input " + kDir + "/" + xml + " --number-of " + type + " all";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  int n = -1;
  if (std::fscanf(p, "%d", &n) != 1) n = -1;
  pclose(p);
  return n;
}

// One view per simulated rank, as discoverClusterTopology would gather them.
std::vector<RankView> views(const std::vector<NodeTopology>& hosts, int ranks_per_host,
                            BindMode mode = BindMode::kAuto) {
  std::vector<RankView> out;
  for (size_t h = 0; h < hosts.size(); ++h) {
    const int first = static_cast<int>(out.size());
    for (int l = 0; l < ranks_per_host; ++l) {
      RankView v;
      v.world_rank = static_cast<int>(out.size());
      v.host = hosts[h].host;
      v.host_key = first;
      v.local_rank = l;
      v.local_size = ranks_per_host;
      v.fabric = hosts[h].fabricDomain();
      v.bind = planBinding(hosts[h], l, ranks_per_host, mode);
      out.push_back(v);
    }
  }
  return out;
}

TEST(Fixtures, CpuCountsAgreeWithHwlocCalc) {
  for (const char* f : {"dgx_h100.xml", "workstation_4gpu.xml", "cpu_2socket.xml",
                        "gb200_nvl72_tray0.xml", "this_machine.xml"}) {
    NodeTopology t = load(f);
    EXPECT_EQ(t.pus, hwlocCalc(f, "pu")) << f;
    EXPECT_EQ(t.cores, hwlocCalc(f, "core")) << f;
    EXPECT_EQ(t.packages, hwlocCalc(f, "package")) << f;
    EXPECT_EQ(static_cast<int>(t.numa_nodes.size()), hwlocCalc(f, "numanode")) << f;
  }
}

TEST(DgxH100, DevicesPathsAndRails) {
  NodeTopology t = load("dgx_h100.xml", "dgx_h100.nvml.json");
  EXPECT_EQ(t.host, "dgx-h100-01");
  ASSERT_EQ(t.gpus.size(), 8u);
  ASSERT_EQ(t.nics.size(), 9u);  // 8 HCAs, then the Ethernet port
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(t.nics[i].name, "mlx5_" + std::to_string(i));
    EXPECT_EQ(t.nics[i].kind, NicKind::kInfiniBand);
    EXPECT_EQ(t.gpus[i].numa, i / 4) << "GPU" << i;
  }
  EXPECT_EQ(t.nics[8].name, "eno1");
  EXPECT_EQ(t.nics[8].kind, NicKind::kEthernet);
  EXPECT_EQ(t.gpus[0].pci.toString(), "0000:19:00.0");
  // GPU pairs share a switch; switches of one socket meet at the package; sockets at the machine.
  EXPECT_EQ(t.gpu_gpu_path[0][1], PciPath::kPix);
  EXPECT_EQ(t.gpu_gpu_path[0][2], PciPath::kNode);
  EXPECT_EQ(t.gpu_gpu_path[0][4], PciPath::kSys);
  EXPECT_EQ(t.gpu_nic_path[0][0], PciPath::kPix);
  EXPECT_EQ(t.gpu_nic_path[0][8], PciPath::kNode);
  // One rail per GPU: the two GPUs of a switch take its two HCAs.
  EXPECT_EQ(t.nic_of_gpu, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(t.nvlinks(0, 7), 18);
  EXPECT_TRUE(t.nvlinkAllToAll());
  EXPECT_EQ(t.fabricDomain(), "");  // NVSwitch inside the host, no multi-node fabric
}

TEST(DgxH100, NcclXmlAgreesWithNvmlSnapshot) {
  NodeTopology a = load("dgx_h100.xml", "dgx_h100.nvml.json");
  NodeTopology b = load("dgx_h100.xml", "", "dgx_h100.nccl.xml");
  EXPECT_EQ(b.links.source.rfind("nccl xml", 0), 0u);
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) EXPECT_EQ(a.nvlinks(i, j), b.nvlinks(i, j)) << i << "," << j;
}

TEST(DgxH100, BindingAndMesh) {
  NodeTopology t = load("dgx_h100.xml", "dgx_h100.nvml.json");
  for (int r = 0; r < 8; ++r) {
    BindPlan p = planBinding(t, r, 8, BindMode::kAuto);
    EXPECT_EQ(p.mode, BindMode::kNuma);
    EXPECT_EQ(p.gpu, r);
    EXPECT_EQ(p.nic, r);
    EXPECT_EQ(p.numa, r / 4);
    EXPECT_EQ(p.cpuset, r < 4 ? "0-111" : "112-223");
  }
  // core: ranks of one NUMA node get distinct cores (2 PUs each).
  EXPECT_EQ(planBinding(t, 0, 8, BindMode::kCore).cpuset, "0-1");
  EXPECT_EQ(planBinding(t, 1, 8, BindMode::kCore).cpuset, "2-3");
  EXPECT_EQ(planBinding(t, 4, 8, BindMode::kCore).cpuset, "112-113");
  EXPECT_EQ(planBinding(t, 3, 8, BindMode::kNone).cpuset, "");

  // Two DGX hosts: nodes are hosts; 16 ranks = 2 x 8; intra 8, inter 2 -> one shard group.
  NodeTopology t2 = t;
  t2.host = "dgx-h100-02";
  auto c = buildClusterTopology(views({t, t2}, 8));
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_EQ(c->level, "host");
  EXPECT_EQ(c->layout.num_nodes, 2);
  EXPECT_EQ(c->layout.ranks_per_node, 8);
  EXPECT_EQ(c->layout.node_names, (std::vector<std::string>{"dgx-h100-01", "dgx-h100-02"}));
  auto s = resolveMeshShape(c->layout, MeshSpec{8, 2});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->shardGroupSize(), 16);
  EXPECT_EQ(s->replicas(), 1);
}

TEST(Workstation, PcieOnlyNoNvlink) {
  NodeTopology t = load("workstation_4gpu.xml", "workstation_4gpu.nvml.json");
  ASSERT_EQ(t.gpus.size(), 4u);
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_EQ(t.nics[0].name, "enp128s0");
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(t.nvlinks(i, j), 0);
      if (i != j) EXPECT_EQ(t.gpu_gpu_path[i][j], PciPath::kPhb);
    }
  EXPECT_FALSE(t.nvlinkAllToAll());
  EXPECT_EQ(t.nic_of_gpu, (std::vector<int>{0, 0, 0, 0}));  // no HCA: the Ethernet port
  BindPlan p = planBinding(t, 2, 4, BindMode::kAuto);
  EXPECT_EQ(p.mode, BindMode::kNone);  // one NUMA node
  EXPECT_EQ(p.gpu, 2);
  auto c = buildClusterTopology(views({t}, 4));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->layout.num_nodes, 1);
  EXPECT_EQ(c->layout.ranks_per_node, 4);
}

TEST(CpuTwoSocket, BindsNextToTheNics) {
  NodeTopology t = load("cpu_2socket.xml");
  EXPECT_TRUE(t.gpus.empty());
  ASSERT_EQ(t.nics.size(), 3u);
  EXPECT_EQ(t.nics[0].name, "mlx5_0");
  EXPECT_EQ(t.nics[1].name, "mlx5_1");
  ASSERT_EQ(t.numa_nodes.size(), 4u);
  // 4 ranks: two blocks, one per HCA, each on the HCA's socket (first NUMA node of it).
  const int want_numa[4] = {0, 0, 2, 2};
  const int want_nic[4] = {0, 0, 1, 1};
  for (int r = 0; r < 4; ++r) {
    BindPlan p = planBinding(t, r, 4, BindMode::kAuto);
    EXPECT_EQ(p.mode, BindMode::kNuma);
    EXPECT_EQ(p.numa, want_numa[r]);
    EXPECT_EQ(p.nic, want_nic[r]);
    EXPECT_EQ(p.cpuset, t.numa_nodes[t.numaSlot(want_numa[r])].cpuset);
  }
  EXPECT_EQ(planBinding(t, 1, 4, BindMode::kCore).cpuset, "2-3");
  // More ranks than cores: auto leaves them unbound.
  EXPECT_EQ(planBinding(t, 0, 100, BindMode::kAuto).mode, BindMode::kNone);
}

TEST(Gb200Nvl72, TraysFormOneNvlinkDomain) {
  std::vector<NodeTopology> trays;
  for (int h = 0; h < 4; ++h) {
    std::string base = "gb200_nvl72_tray" + std::to_string(h);
    trays.push_back(load(base + ".xml", base + ".nvml.json"));
    EXPECT_EQ(trays.back().arch, "aarch64");
    EXPECT_EQ(trays.back().fabricDomain(), "5e1e3a1c-9f0b-4c47-8f5d-0c2a7e6b1d01/32766");
    EXPECT_EQ(trays.back().nic_of_gpu, (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(trays.back().gpu_nic_path[1][1], PciPath::kPix);
    EXPECT_EQ(trays.back().gpu_gpu_path[0][2], PciPath::kSys);  // other Grace socket
  }
  auto c = buildClusterTopology(views(trays, 4));
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_EQ(c->level, "nvlink-domain");
  EXPECT_EQ(c->num_hosts, 4);
  EXPECT_EQ(c->layout.num_nodes, 1);
  EXPECT_EQ(c->layout.ranks_per_node, 16);
  EXPECT_EQ(c->layout.node_names[0], "nvl:5e1e3a1c/32766");
  EXPECT_EQ(c->layout.local_rank_of_rank[12], 12);

  // Two cliques of two trays: two nodes of 8.
  trays[2].links.fabric.assign(4, trays[0].links.fabric[0]);
  for (auto& f : trays[2].links.fabric) f.clique_id = 7;
  trays[3].links.fabric = trays[2].links.fabric;
  c = buildClusterTopology(views(trays, 4));
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_EQ(c->layout.num_nodes, 2);
  EXPECT_EQ(c->layout.ranks_per_node, 8);
  EXPECT_EQ(c->layout.node_of_rank[9], 1);

  // Three trays against one: an error naming both domains and their counts.
  trays[2].links.fabric = trays[0].links.fabric;
  c = buildClusterTopology(views(trays, 4));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("NVLink domains: unequal ranks per node "
                                      "(nvl:5e1e3a1c/32766=12, nvl:5e1e3a1c/7=4)"),
            std::string::npos)
      << c.status().message();
}

TEST(ThisMachine, RecordedVmLoads) {
  NodeTopology t = load("this_machine.xml");
  EXPECT_EQ(t.host, "vm");
  EXPECT_TRUE(t.gpus.empty());
  EXPECT_EQ(t.numa_nodes.size(), 1u);
  ASSERT_EQ(t.nics.size(), 1u);
  EXPECT_EQ(t.nics[0].name, "eth0");
}

TEST(Live, ThisMachineDiscoversWithoutNvml) {
  auto t = discoverNodeTopology(TopologySources{});
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->source, "live");
  EXPECT_GT(t->pus, 0);
  EXPECT_FALSE(t->host.empty());
}

// ---- bad input --------------------------------------------------------------------------------

std::string errorOf(const TopologySources& s) {
  auto t = discoverNodeTopology(s);
  EXPECT_FALSE(t.ok());
  return t.ok() ? "" : t.status().message();
}

std::string tempFile(const std::string& name, const std::string& content) {
  std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << content;
  return path;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(BadInput, HwlocXmlErrorsNameTheFile) {
  TopologySources s;
  s.hwloc_xml = "/nonexistent/topo.xml";
  EXPECT_NE(errorOf(s).find("cannot open '/nonexistent/topo.xml'"), std::string::npos)
      << errorOf(s);
  s.hwloc_xml = tempFile("empty.xml", "");
  EXPECT_NE(errorOf(s).find("is empty"), std::string::npos);
  std::string full = slurp(kDir + "/dgx_h100.xml");
  s.hwloc_xml = tempFile("truncated.xml", full.substr(0, full.size() / 2));
  std::string e = errorOf(s);
  EXPECT_NE(e.find(s.hwloc_xml), std::string::npos) << e;
  EXPECT_NE(e.find("malformed or truncated"), std::string::npos) << e;
  s.hwloc_xml = kDir + "/dgx_h100.nccl.xml";
  EXPECT_NE(errorOf(s).find("is an NCCL topology XML"), std::string::npos);
  s.hwloc_xml = tempFile("other.xml", "<?xml version=\"1.0\"?><svg/>");
  EXPECT_NE(errorOf(s).find("root element <svg>"), std::string::npos);
  // Found by topology_fuzz: hwloc 2.9 (and lstopo) crash on it; hsdp rejects it first.
  s.hwloc_xml = kDir + "/bad_hwloc_missing_cpuset.xml";
  e = errorOf(s);
  EXPECT_NE(e.find("PU object without complete_cpuset"), std::string::npos) << e;
  s.hwloc_xml = tempFile("binary.xml", std::string("\x7f"
                                                   "ELF\x02\x01",
                                                   6));
  EXPECT_NE(errorOf(s).find("is not well-formed XML"), std::string::npos) << errorOf(s);
}

TEST(BadInput, SnapshotErrors) {
  TopologySources s;
  s.hwloc_xml = kDir + "/dgx_h100.xml";
  s.nvml_snapshot = kDir + "/workstation_4gpu.nvml.json";  // another machine's GPUs
  std::string e = errorOf(s);
  EXPECT_NE(e.find("GPU 00000000:17:00.0 is not a GPU of"), std::string::npos) << e;
  s.nvml_snapshot = tempFile("trunc.json", slurp(kDir + "/dgx_h100.nvml.json").substr(0, 300));
  EXPECT_NE(errorOf(s).find("not valid JSON (malformed or truncated NVML snapshot)"),
            std::string::npos);
  s.nvml_snapshot = tempFile("wrong.json", "{\"gpus\": []}");
  EXPECT_NE(errorOf(s).find("is not an hsdp NVML snapshot"), std::string::npos);
  s.nvml_snapshot =
      tempFile("badtype.json",
               "{\"format\":\"hsdp-nvml-snapshot\",\"version\":1,\"gpus\":[{\"bus_id\":7}]}");
  EXPECT_NE(errorOf(s).find("malformed NVML snapshot"), std::string::npos);
  s.nvml_snapshot = "";
  s.nccl_xml = kDir + "/dgx_h100.xml";
  EXPECT_NE(errorOf(s).find("is not an NCCL topology XML (root element <topology>"),
            std::string::npos);
  s.nccl_xml = tempFile("trunc.nccl.xml", slurp(kDir + "/dgx_h100.nccl.xml").substr(0, 400));
  EXPECT_NE(errorOf(s).find("is not well-formed XML"), std::string::npos);
}

TEST(BadInput, ValuesAreNamed) {
  EXPECT_NE(parseBindMode("socket").status().message().find("HSDP_BIND='socket'"),
            std::string::npos);
  EXPECT_FALSE(parsePciAddress("0000:zz:00.0").ok());
  EXPECT_EQ(parsePciAddress("00000000:1B:00.0")->toString(), "0000:1b:00.0");
  std::vector<RankView> v = views({load("workstation_4gpu.xml")}, 2);
  v[1].error = "INVALID_ARGUMENT: bad file";
  auto c = buildClusterTopology(v);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rank 1 (ws-4gpu): INVALID_ARGUMENT: bad file"),
            std::string::npos);
  v[1].error.clear();
  v[1].fabric = "x/1";  // one host cannot straddle two NVLink domains
  EXPECT_NE(buildClusterTopology(v).status().message().find("host ws-4gpu: rank 0"),
            std::string::npos);
}

// ---- NVML through dlopen ----------------------------------------------------------------------

TEST(Nvml, MissingLibraryIsNotFound) {
  NodeTopology t = load("workstation_4gpu.xml");
  auto l = gpuLinksFromNvml(t, "libnvidia-ml-does-not-exist.so.1");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kNotFound);
  EXPECT_NE(l.status().message().find("libnvidia-ml-does-not-exist.so.1 not loaded"),
            std::string::npos);
}

TEST(Nvml, FailingDriverIsReported) {
  NodeTopology t = load("workstation_4gpu.xml");
  setenv("FAKE_NVML_MODE", "init_fails", 1);
  auto l = gpuLinksFromNvml(t, HSDP_FAKE_NVML);
  unsetenv("FAKE_NVML_MODE");
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("nvmlInit_v2 failed: Driver Not Loaded (9)"),
            std::string::npos)
      << l.status().message();
}

TEST(Nvml, LiveLinksThroughTheFakeDriver) {
  NodeTopology t = load("workstation_4gpu.xml");
  auto l = gpuLinksFromNvml(t, HSDP_FAKE_NVML);
  ASSERT_TRUE(l.ok()) << l.status().toString();
  t.links = *l;
  EXPECT_EQ(t.links.source, "nvml");
  EXPECT_EQ(t.nvlinks(0, 1), 4);
  EXPECT_EQ(t.nvlinks(2, 3), 4);
  EXPECT_EQ(t.nvlinks(0, 2), 0);
  EXPECT_FALSE(t.nvlinkAllToAll());
  EXPECT_EQ(t.links.fabric[0].state, "not_supported");
}

TEST(RankView, SerializationRoundTrips) {
  NodeTopology t = load("dgx_h100.xml", "dgx_h100.nvml.json");
  RankView v = views({t}, 8)[5];
  v.nic = "mlx5_5";
  v.fabric = "u/3";
  auto back = parseRankView(serializeRankView(v));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(serializeRankView(*back), serializeRankView(v));
  EXPECT_FALSE(parseRankView("{\"r\":1").ok());
}

}  // namespace
}  // namespace hsdp
