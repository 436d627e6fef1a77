// The two-level mesh. world = nodes x ranks_per_node. The user picks intra_shard (divides
// ranks_per_node) and inter_shard (divides the node count); a shard group is intra_shard ranks on
// each of inter_shard nodes, and what is not sharded is replicated:
//   replicas = world / (intra_shard * inter_shard).
//
// Coordinates of a rank (R ranks per node, N nodes, I = intra_shard, J = inter_shard):
//   intra_group = local_rank / I, intra_idx = local_rank % I   (contiguous ranks of a node)
//   inter_group = node / J,       inter_idx = node % J         (contiguous nodes)
//   shard index k = intra_idx * J + inter_idx
// so that a hierarchical all-gather (inter phase, then intra phase) lands shard k at offset k
// with no reshuffle: the result equals a flat all-gather over the shard group in rank order.
#pragma once

#include <memory>
#include <string>

#include "hsdp/topology.h"
#include "hsdp/transport.h"

namespace hsdp {

struct MeshSpec {
  int intra_shard = 0;  // 0: default, all ranks of a node
  int inter_shard = 0;  // 0: default, 1 (replicate across nodes)
  // Transport of each level (hsdp/transport_select.h): "mpi", "ucx", "nccl" or one the program
  // registered. "": HSDP_TRANSPORT_INTRA / HSDP_TRANSPORT_INTER, else mpi (the bootstrap).
  std::string intra_transport;
  std::string inter_transport;
};

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

// Validates the factors against the layout and fills the defaults. Errors name the values.
StatusOr<MeshShape> resolveMeshShape(const NodeLayout& layout, const MeshSpec& spec);

// Pure arithmetic: where `world_rank` sits in the mesh.
MeshCoords meshCoords(const NodeLayout& layout, const MeshShape& shape, int world_rank);

class Mesh {
 public:
  // Collective over `world` (which must outlive the Mesh): builds the sub-communicators.
  static StatusOr<std::unique_ptr<Mesh>> create(Comm& world, const NodeLayout& layout,
                                                const MeshSpec& spec);

  const MeshShape& shape() const { return shape_; }
  const MeshCoords& coords() const { return coords_; }
  const NodeLayout& layout() const { return layout_; }

  Comm& world() const { return *world_; }
  // The world for control messages on host memory (checkpoint agreement, finalize's signature
  // check): world() itself on host transports, its host bootstrap on a device one.
  Comm& control() const { return world_->hostComm(); }
  Comm& node() const { return *node_; }               // all ranks of this node
  Comm& intraShard() const { return *intra_; }        // I ranks: the intra-node shard phase
  Comm& interShard() const { return *inter_; }        // J ranks: the inter-node shard phase
  // The same two groups again, as separate communicators for gradient reduction: all-gathers
  // of parameters and reduce-scatters of gradients are in flight at the same time, and each
  // communicator must see its operations in the same order on every rank (as FSDP keeps
  // separate process groups / streams for the two roles).
  Comm& intraShardReduce() const { return *intra_reduce_; }
  Comm& interShardReduce() const { return *inter_reduce_; }
  Comm& shardGroup() const { return *shard_group_; }  // I*J ranks, rank == shard index k
  // The shard group again, for the flat (one-level) gradient reduce-scatter: NCCL runs one
  // communicator's collectives in issue order, so on the same communicator a reduce-scatter would
  // wait for the next unit's prefetched gather (and the other way round).
  Comm& shardGroupReduce() const { return *shard_group_reduce_; }
  Comm& replica() const { return *replica_; }         // the owners of the same shard k

  // One line: "8 ranks = 2 nodes x 4; intra_shard 4 x inter_shard 1 = shard group 4; replicas 2"
  std::string describe() const;

 private:
  Mesh() = default;
  MeshShape shape_;
  MeshCoords coords_;
  NodeLayout layout_;
  Comm* world_ = nullptr;
  std::unique_ptr<Comm> node_, intra_, inter_, intra_reduce_, inter_reduce_, shard_group_,
      shard_group_reduce_, replica_;
};

}  // namespace hsdp
