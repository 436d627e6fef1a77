// The two-level mesh. world = nodes x ranks_per_node. The user picks intra_shard (divides
// ranks_per_node) and inter_shard (divides the node count); a shard group is intra_shard ranks on
// each of inter_shard nodes, and what is not sharded is replicated:
//   replicas = world / (intra_shard * inter_shard).
// The shape and a rank's coordinates are plain numbers (hsdp/mesh_shape.h: MeshShape, MeshCoords
// and the arithmetic); this header adds the layout they come from and the communicators.
#pragma once

#include <memory>
#include <string>

#include "hsdp/mesh_shape.h"
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
  Comm& node() const { return *node_; }         // all ranks of this node
  Comm& intraShard() const { return *intra_; }  // I ranks: the intra-node shard phase
  Comm& interShard() const { return *inter_; }  // J ranks: the inter-node shard phase
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
  Comm& replica() const { return *replica_; }  // the owners of the same shard k

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
