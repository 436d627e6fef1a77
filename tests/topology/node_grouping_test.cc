// Node grouping without MPI: virtual nodes and grouping by host keys.
#include <gtest/gtest.h>

#include "hsdp/topology.h"

namespace hsdp {
namespace {

TEST(NodeLayout, VirtualNodeErrors) {
  EXPECT_NE(virtualNodeLayout(8, 3).status().message().find("does not divide the world size 8"),
            std::string::npos);
  EXPECT_NE(virtualNodeLayout(8, 16).status().message().find("exceeds the world size 8"),
            std::string::npos);
  EXPECT_NE(virtualNodeLayout(8, 0).status().message().find("must be positive"), std::string::npos);
}

TEST(NodeLayout, FromKeysGroupsNonContiguousRanks) {
  // Round-robin placement: ranks 0,2,4 on host A (key 0), ranks 1,3,5 on host B (key 1).
  NodeLayout l = *nodeLayoutFromKeys({0, 1, 0, 1, 0, 1}, {"a", "b", "a", "b", "a", "b"});
  EXPECT_EQ(l.num_nodes, 2);
  EXPECT_EQ(l.ranks_per_node, 3);
  EXPECT_EQ(l.node_of_rank, (std::vector<int>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(l.local_rank_of_rank, (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(l.node_names, (std::vector<std::string>{"a", "b"}));
}

TEST(NodeLayout, UnequalNodesAreAnError) {
  auto l = nodeLayoutFromKeys({0, 0, 0, 3}, {"a", "a", "a", "b"});
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("a=3, b=1"), std::string::npos) << l.status().message();
}

}  // namespace
}  // namespace hsdp
