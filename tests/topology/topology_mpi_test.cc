// The gathered cluster view under mpirun: views cross the wire intact, the node level comes out
// the same on every rank, and bad input (a corrupt HSDP_TOPO_FILE on some ranks, a bad HSDP_BIND)
// is the same error on every rank, without a hang.
#include <gtest/gtest.h>

#include <cstdlib>

#include "hsdp/env.h"
#include "tests/common/mpi_test_main.h"
#include "tests/common/scoped_env.h"
#include "topology/cluster_topology.h"

namespace hsdp {
namespace {

using hsdp::testing::world;
const std::string kDir = HSDP_TOPO_FIXTURES;

using testing::ScopedEnv;

TEST(ClusterMpi, GatheredViewsMatchWhatEachRankSent) {
  // Rank r pretends to sit on GB200 tray r/2 (two ranks per tray): one NVLink clique.
  const int r = world().rank();
  const std::string base = kDir + "/gb200_nvl72_tray" + std::to_string((r / 2) % 4);
  TopologySources src;
  src.hwloc_xml = base + ".xml";
  src.nvml_snapshot = base + ".nvml.json";
  auto topo = discoverNodeTopology(src);
  ASSERT_TRUE(topo.ok()) << topo.status().toString();
  RankView mine;
  mine.world_rank = r;
  mine.host = topo->host;
  mine.host_key = r / 2 * 2;
  mine.local_rank = r % 2;
  mine.local_size = 2;
  mine.fabric = topo->fabricDomain();
  mine.bind = planBinding(*topo, mine.local_rank, 2, BindMode::kCore);
  auto all = gatherRankViews(world(), mine);
  ASSERT_TRUE(all.ok()) << all.status().toString();
  ASSERT_EQ(static_cast<int>(all->size()), world().size());
  EXPECT_EQ(serializeRankView((*all)[r]), serializeRankView(mine));
  for (int q = 0; q < world().size(); ++q) {
    EXPECT_EQ((*all)[q].world_rank, q);
    EXPECT_EQ((*all)[q].host, "gb200-tray0" + std::to_string((q / 2) % 4));
  }
  if (world().size() % 2 == 0) {
    auto c = buildClusterTopology(*all);
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_EQ(c->level, "nvlink-domain");
    EXPECT_EQ(c->layout.num_nodes, 1);
    EXPECT_EQ(c->layout.ranks_per_node, world().size());
  }
}

TEST(ClusterMpi, RecordedHostGivesTheLayoutOnEveryRank) {
  ScopedEnv f("HSDP_TOPO_FILE", kDir + "/dgx_h100.xml");
  ScopedEnv n("HSDP_TOPO_NVML_FILE", kDir + "/dgx_h100.nvml.json");
  auto c = discoverClusterTopology(world());
  ASSERT_TRUE(c.ok()) << c.status().toString();
  const bool virt = env::kRanksPerNode.isSet();
  EXPECT_EQ(c->level, virt ? "virtual" : "host");
  EXPECT_EQ(c->layout.world_size, world().size());
  EXPECT_EQ(c->ranks[world().rank()].host, "dgx-h100-01");
  EXPECT_EQ(c->ranks[world().rank()].gpu, c->ranks[world().rank()].local_rank % 8);
  // groupRanksIntoNodes goes through the same discovery and agrees.
  auto l = groupRanksIntoNodes(world());
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->node_of_rank, c->layout.node_of_rank);
}

TEST(ClusterMpi, CorruptFileOnOneRankFailsEveryRank) {
  // Only the last rank gets a broken file; every rank must return the error naming it.
  const bool last = world().rank() == world().size() - 1;
  ScopedEnv f("HSDP_TOPO_FILE",
              last ? kDir + "/dgx_h100.nccl.xml" : kDir + "/workstation_4gpu.xml");
  auto c = discoverClusterTopology(world());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rank " + std::to_string(world().size() - 1)),
            std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("dgx_h100.nccl.xml is an NCCL topology XML"),
            std::string::npos);
  auto l = groupRanksIntoNodes(world());
  EXPECT_FALSE(l.ok());
}

TEST(ClusterMpi, BadBindValueFailsEveryRank) {
  ScopedEnv b("HSDP_BIND", "sockets");
  auto c = discoverClusterTopology(world());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("HSDP_BIND='sockets'"), std::string::npos);
}

}  // namespace
}  // namespace hsdp
