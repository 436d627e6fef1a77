// The one description of a mesh, as plain numbers: its shape (world = nodes x ranks_per_node,
// the intra and inter shard factors), where a rank sits in it, and the sharding mode. No
// communicators and no topology: the engine's Mesh (hsdp/mesh.h) is built on these, and a
// checkpoint's manifest records the MeshShape it was saved on (the offline reshard plans a mesh
// from them without a job).
//
// Coordinates of a rank (R ranks per node, N nodes, I = intra_shard, J = inter_shard):
//   intra_group = local_rank / I, intra_idx = local_rank % I   (contiguous ranks of a node)
//   inter_group = node / J,       inter_idx = node % J         (contiguous nodes)
//   shard index k = intra_idx * J + inter_idx
// so that a hierarchical all-gather (inter phase, then intra phase) lands shard k at offset k
// with no reshuffle: the result equals a flat all-gather over the shard group in rank order.
#pragma once

#include <string_view>

#include "hsdp/status.h"

namespace hsdp {

enum class ShardMode {
  kNone,   // plain data parallel: parameters, gradients, optimizer state replicated
  kZero1,  // optimizer state sharded; parameters and full gradients replicated
  kZero2,  // optimizer state and gradients sharded; parameters replicated
  kZero3,  // parameters, gradients, optimizer state sharded over the shard group
};

StatusOr<ShardMode> parseShardMode(std::string_view name);  // "none", "zero1", "zero2", "zero3"
const char* shardModeName(ShardMode mode);

struct MeshShape {
  int world_size = 0;
  int num_nodes = 0;
  int ranks_per_node = 0;
  int intra_shard = 0;
  int inter_shard = 0;
  int shardGroupSize() const { return intra_shard * inter_shard; }
  int replicas() const { return world_size / shardGroupSize(); }
};

struct MeshCoords {
  int world_rank = 0;
  int node = 0;
  int local_rank = 0;
  int intra_group = 0;
  int intra_idx = 0;
  int inter_group = 0;
  int inter_idx = 0;
  int shard_rank = 0;    // k: which shard of every unit this rank owns
  int replica_rank = 0;  // which replica (shard group) this rank belongs to
};

// The shape of world_size = num_nodes x ranks_per_node ranks with the factors intra_shard (0: all
// ranks of a node) and inter_shard (0: 1), checked: a factor must be positive and divide the
// ranks per node (intra) or the node count (inter). Errors name the values.
StatusOr<MeshShape> meshShapeOf(int world_size, int num_nodes, int ranks_per_node, int intra_shard,
                                int inter_shard);

// Pure arithmetic: where `world_rank`, the `local_rank`-th rank of node `node`, sits in the mesh.
MeshCoords meshCoords(const MeshShape& shape, int world_rank, int node, int local_rank);

// Consecutive ranks in nodes of `ranks_per_node` (HSDP_RANKS_PER_NODE's layout): errors name the
// values when the count is not positive, exceeds the world, or does not divide it.
[[nodiscard]] Status checkConsecutiveNodes(int world_size, int ranks_per_node);

}  // namespace hsdp
