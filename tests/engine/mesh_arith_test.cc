// Mesh arithmetic without MPI: layouts, factors, coordinates.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "hsdp/mesh.h"

namespace hsdp {
namespace {

TEST(MeshShape, DefaultsShardInsideNodeReplicateAcross) {
  NodeLayout l = *virtualNodeLayout(8, 4);
  MeshShape s = *resolveMeshShape(l, {});
  EXPECT_EQ(s.intra_shard, 4);
  EXPECT_EQ(s.inter_shard, 1);
  EXPECT_EQ(s.shardGroupSize(), 4);
  EXPECT_EQ(s.replicas(), 2);
}

TEST(MeshShape, ErrorsNameTheValues) {
  NodeLayout l = *virtualNodeLayout(8, 4);
  auto a = resolveMeshShape(l, {3, 1});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("intra_shard=3 does not divide the 4 ranks per node"),
            std::string::npos)
      << a.status().message();
  auto b = resolveMeshShape(l, {4, 3});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("inter_shard=3 does not divide the 2 nodes"),
            std::string::npos);
  EXPECT_FALSE(resolveMeshShape(l, {-2, 1}).ok());
  EXPECT_FALSE(resolveMeshShape(l, {1, -1}).ok());
}

// For every world/layout/factor combination: the groups implied by the coordinates have the
// right sizes, every shard group holds each shard index once, and replicas pair equal shards.
TEST(MeshCoords, GroupsPartitionTheWorld) {
  for (auto [world, rpn] : std::vector<std::pair<int, int>>{
           {1, 1}, {2, 1}, {2, 2}, {3, 1}, {6, 3}, {6, 2}, {8, 4}, {8, 2}, {12, 3}}) {
    NodeLayout l = *virtualNodeLayout(world, rpn);
    for (int I = 1; I <= rpn; ++I) {
      if (rpn % I) continue;
      for (int J = 1; J <= l.num_nodes; ++J) {
        if (l.num_nodes % J) continue;
        MeshShape s = *resolveMeshShape(l, {I, J});
        std::map<int, std::set<int>> shards_of_group;  // replica_rank -> shard indices
        std::map<int, std::set<int>> replicas_of_shard;
        std::set<std::tuple<int, int>> seen;
        for (int r = 0; r < world; ++r) {
          MeshCoords c = meshCoords(l, s, r);
          EXPECT_TRUE(shards_of_group[c.replica_rank].insert(c.shard_rank).second);
          EXPECT_TRUE(replicas_of_shard[c.shard_rank].insert(c.replica_rank).second);
          EXPECT_TRUE(seen.insert({c.replica_rank, c.shard_rank}).second);
          // The shard group spans I ranks of a node and J nodes.
          EXPECT_LT(c.intra_idx, I);
          EXPECT_LT(c.inter_idx, J);
          EXPECT_EQ(c.shard_rank, c.intra_idx * J + c.inter_idx);
        }
        EXPECT_EQ(static_cast<int>(shards_of_group.size()), s.replicas());
        for (auto& [g, ks] : shards_of_group) EXPECT_EQ(static_cast<int>(ks.size()), I * J);
        for (auto& [k, rs] : replicas_of_shard)
          EXPECT_EQ(static_cast<int>(rs.size()), s.replicas());
      }
    }
  }
}

}  // namespace
}  // namespace hsdp
