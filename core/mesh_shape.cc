#include "hsdp/mesh_shape.h"

namespace hsdp {

StatusOr<ShardMode> parseShardMode(std::string_view name) {
  if (name == "none") return ShardMode::kNone;
  if (name == "zero1") return ShardMode::kZero1;
  if (name == "zero2") return ShardMode::kZero2;
  if (name == "zero3") return ShardMode::kZero3;
  return invalidArgument("unknown mode '", name, "' (expected none, zero1, zero2 or zero3)");
}

const char* shardModeName(ShardMode mode) {
  switch (mode) {
    case ShardMode::kNone:
      return "none";
    case ShardMode::kZero1:
      return "zero1";
    case ShardMode::kZero2:
      return "zero2";
    case ShardMode::kZero3:
      return "zero3";
  }
  return "?";
}

StatusOr<MeshShape> meshShapeOf(int world_size, int num_nodes, int ranks_per_node, int intra_shard,
                                int inter_shard) {
  MeshShape s;
  s.world_size = world_size;
  s.num_nodes = num_nodes;
  s.ranks_per_node = ranks_per_node;
  s.intra_shard = intra_shard == 0 ? ranks_per_node : intra_shard;
  s.inter_shard = inter_shard == 0 ? 1 : inter_shard;
  if (s.intra_shard < 0) return invalidArgument("intra_shard=", s.intra_shard, " must be positive");
  if (s.inter_shard < 0) return invalidArgument("inter_shard=", s.inter_shard, " must be positive");
  if (ranks_per_node % s.intra_shard != 0)
    return invalidArgument("intra_shard=", s.intra_shard, " does not divide the ", ranks_per_node,
                           " ranks per node (world ", world_size, " = ", num_nodes, " nodes x ",
                           ranks_per_node, ")");
  if (num_nodes % s.inter_shard != 0)
    return invalidArgument("inter_shard=", s.inter_shard, " does not divide the ", num_nodes,
                           " nodes (world ", world_size, " = ", num_nodes, " nodes x ",
                           ranks_per_node, ")");
  return s;
}

MeshCoords meshCoords(const MeshShape& shape, int world_rank, int node, int local_rank) {
  MeshCoords c;
  c.world_rank = world_rank;
  c.node = node;
  c.local_rank = local_rank;
  c.intra_group = c.local_rank / shape.intra_shard;
  c.intra_idx = c.local_rank % shape.intra_shard;
  c.inter_group = c.node / shape.inter_shard;
  c.inter_idx = c.node % shape.inter_shard;
  c.shard_rank = c.intra_idx * shape.inter_shard + c.inter_idx;
  const int intra_groups_per_node = shape.ranks_per_node / shape.intra_shard;
  c.replica_rank = c.inter_group * intra_groups_per_node + c.intra_group;
  return c;
}

Status checkConsecutiveNodes(int world_size, int ranks_per_node) {
  if (ranks_per_node <= 0)
    return invalidArgument("HSDP_RANKS_PER_NODE=", ranks_per_node, " must be positive");
  if (ranks_per_node > world_size)
    return invalidArgument("HSDP_RANKS_PER_NODE=", ranks_per_node, " exceeds the world size ",
                           world_size);
  if (world_size % ranks_per_node != 0)
    return invalidArgument("HSDP_RANKS_PER_NODE=", ranks_per_node,
                           " does not divide the world size ", world_size);
  return okStatus();
}

}  // namespace hsdp
