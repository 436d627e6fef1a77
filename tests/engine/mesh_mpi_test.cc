// The Mesh's communicators under mpirun, for every valid factor pair of the job's layout. Oracle:
// membership and order computed from the closed-form coordinates of every rank.
#include <gtest/gtest.h>

#include <algorithm>

#include "hsdp/mesh.h"
#include "hsdp/transport_registry.h"
#include "tests/common/mpi_test_main.h"
#include "tests/common/scoped_env.h"

namespace hsdp {
namespace {

using testing::world;

// World ranks of `comm`'s members in comm-rank order, gathered through the comm itself.
std::vector<int> members(Comm& comm) {
  int me = world().rank();
  std::vector<int> out(comm.size());
  EXPECT_TRUE(comm.allGather(&me, out.data(), 1, DType::kInt32).ok());
  return out;
}

// Expected members: ranks whose coordinates match `same`, ordered by `key`.
template <typename Same, typename Key>
std::vector<int> expected(const NodeLayout& l, const MeshShape& s, Same same, Key key) {
  std::vector<std::pair<int, int>> v;
  MeshCoords me = meshCoords(l, s, world().rank());
  for (int r = 0; r < l.world_size; ++r) {
    MeshCoords c = meshCoords(l, s, r);
    if (same(me, c)) v.push_back({key(c), r});
  }
  std::sort(v.begin(), v.end());
  std::vector<int> out;
  for (auto& p : v) out.push_back(p.second);
  return out;
}

TEST(Mesh, CommunicatorsMatchClosedForm) {
  auto layout = groupRanksIntoNodes(world());
  ASSERT_TRUE(layout.ok()) << layout.status().toString();
  const NodeLayout& l = *layout;
  int combos = 0;
  for (int I = 1; I <= l.ranks_per_node; ++I) {
    if (l.ranks_per_node % I) continue;
    for (int J = 1; J <= l.num_nodes; ++J) {
      if (l.num_nodes % J) continue;
      ++combos;
      SCOPED_TRACE(strCat("intra_shard=", I, " inter_shard=", J));
      auto mesh = Mesh::create(world(), l, {I, J});
      ASSERT_TRUE(mesh.ok()) << mesh.status().toString();
      const MeshShape& s = (*mesh)->shape();
      EXPECT_EQ(s.replicas(), l.world_size / (I * J));
      EXPECT_EQ(
          members((*mesh)->intraShard()),
          expected(
              l, s,
              [](auto a, auto b) { return a.node == b.node && a.intra_group == b.intra_group; },
              [](auto c) { return c.intra_idx; }));
      EXPECT_EQ(members((*mesh)->interShard()), expected(
                                                    l, s,
                                                    [](auto a, auto b) {
                                                      return a.inter_group == b.inter_group &&
                                                             a.intra_group == b.intra_group &&
                                                             a.intra_idx == b.intra_idx;
                                                    },
                                                    [](auto c) { return c.inter_idx; }));
      EXPECT_EQ(members((*mesh)->shardGroup()),
                expected(
                    l, s, [](auto a, auto b) { return a.replica_rank == b.replica_rank; },
                    [](auto c) { return c.shard_rank; }));
      EXPECT_EQ(members((*mesh)->replica()),
                expected(
                    l, s, [](auto a, auto b) { return a.shard_rank == b.shard_rank; },
                    [](auto c) { return c.replica_rank; }));
      EXPECT_EQ(members((*mesh)->node()), expected(
                                              l, s, [](auto a, auto b) { return a.node == b.node; },
                                              [](auto c) { return c.local_rank; }));
    }
  }
  EXPECT_GE(combos, 1);
}

// Bad factors fail identically on every rank, before any communicator is built (no hang).
TEST(Mesh, BadFactorsFailOnEveryRank) {
  auto layout = groupRanksIntoNodes(world());
  ASSERT_TRUE(layout.ok());
  const int bad_intra = layout->ranks_per_node + 1;
  auto a = Mesh::create(world(), *layout, {bad_intra, 1});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find(strCat("intra_shard=", bad_intra, " does not divide")),
            std::string::npos);
  auto b = Mesh::create(world(), *layout, {1, layout->num_nodes + 1});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(strCat("inter_shard=", layout->num_nodes + 1)),
            std::string::npos);
  auto c = Mesh::create(world(), *layout, {-1, 1});
  EXPECT_FALSE(c.ok());
  EXPECT_TRUE(world().barrier().ok());  // everyone is still in step
}

// MeshSpec's per-level transports: the program's choice wins over HSDP_TRANSPORT_INTRA/_INTER
// (here deliberately bad, so reading it would fail), and a bad choice names the field on every
// rank.
TEST(Mesh, SpecTransportsWinOverTheEnvironment) {
  auto layout = groupRanksIntoNodes(world());
  ASSERT_TRUE(layout.ok());
  testing::ScopedEnv intra("HSDP_TRANSPORT_INTRA", "bogus");
  testing::ScopedEnv inter("HSDP_TRANSPORT_INTER", "bogus");
  const std::string other = hasTransport("ucx") ? "ucx" : "mpi";
  MeshSpec spec{1, 1};
  spec.intra_transport = other;
  spec.inter_transport = "mpi";
  auto m = Mesh::create(world(), *layout, spec);
  ASSERT_TRUE(m.ok()) << m.status().toString();
  EXPECT_EQ((*m)->intraShard().transportName(), other);
  EXPECT_EQ((*m)->intraShardReduce().transportName(), other);
  EXPECT_EQ((*m)->interShard().transportName(), std::string("mpi"));
  EXPECT_EQ((*m)->replica().transportName(), std::string("mpi"));
  // Unset fields read the environment: bogus there is the variable's error.
  auto env_bad = Mesh::create(world(), *layout, MeshSpec{1, 1});
  ASSERT_FALSE(env_bad.ok());
  EXPECT_NE(env_bad.status().message().find("HSDP_TRANSPORT_INTRA='bogus'"), std::string::npos)
      << env_bad.status().message();
  spec.inter_transport = "nope";
  auto bad = Mesh::create(world(), *layout, spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("MeshSpec::inter_transport='nope'"), std::string::npos)
      << bad.status().message();
  EXPECT_TRUE(world().barrier().ok());
}

}  // namespace
}  // namespace hsdp
