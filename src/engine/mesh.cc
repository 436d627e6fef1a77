#include "hsdp/mesh.h"

#include "hsdp/log.h"
#include "hsdp/transport_select.h"

namespace hsdp {

StatusOr<MeshShape> resolveMeshShape(const NodeLayout& layout, const MeshSpec& spec) {
  return meshShapeOf(layout.world_size, layout.num_nodes, layout.ranks_per_node, spec.intra_shard,
                     spec.inter_shard);
}

MeshCoords meshCoords(const NodeLayout& layout, const MeshShape& shape, int world_rank) {
  return meshCoords(shape, world_rank, layout.node_of_rank[world_rank],
                    layout.local_rank_of_rank[world_rank]);
}

StatusOr<std::unique_ptr<Mesh>> Mesh::create(Comm& world, const NodeLayout& layout,
                                             const MeshSpec& spec) {
  if (layout.world_size != world.size())
    return invalidArgument("node layout covers ", layout.world_size, " ranks but the world has ",
                           world.size());
  std::unique_ptr<Mesh> m(new Mesh());
  HSDP_ASSIGN_OR_RETURN(m->shape_, resolveMeshShape(layout, spec));
  m->layout_ = layout;
  m->world_ = &world;
  const MeshShape& s = m->shape_;
  const MeshCoords c = meshCoords(layout, s, world.rank());
  m->coords_ = c;
  const int groups_per_node = s.ranks_per_node / s.intra_shard;

  HSDP_ASSIGN_OR_RETURN(m->node_, world.split(c.node, c.local_rank));
  const int intra_color = c.node * groups_per_node + c.intra_group;
  const int inter_color =
      (c.inter_group * groups_per_node + c.intra_group) * s.intra_shard + c.intra_idx;
  HSDP_ASSIGN_OR_RETURN(m->intra_, world.split(intra_color, c.intra_idx));
  HSDP_ASSIGN_OR_RETURN(m->inter_, world.split(inter_color, c.inter_idx));
  HSDP_ASSIGN_OR_RETURN(m->intra_reduce_, world.split(intra_color, c.intra_idx));
  HSDP_ASSIGN_OR_RETURN(m->inter_reduce_, world.split(inter_color, c.inter_idx));
  HSDP_ASSIGN_OR_RETURN(m->shard_group_, world.split(c.replica_rank, c.shard_rank));
  HSDP_ASSIGN_OR_RETURN(m->shard_group_reduce_, world.split(c.replica_rank, c.shard_rank));
  HSDP_ASSIGN_OR_RETURN(m->replica_, world.split(c.shard_rank, c.replica_rank));

  // Each level may run on its own transport: MeshSpec's choice, else HSDP_TRANSPORT_INTRA /
  // _INTER, else the bootstrap's.
  auto level = [&](MeshLevel l, std::unique_ptr<Comm>& comm) -> Status {
    const bool intra = l == MeshLevel::kIntra;
    HSDP_ASSIGN_OR_RETURN(
        comm, selectLevelTransport(
                  l, std::move(comm), intra ? spec.intra_transport : spec.inter_transport,
                  intra ? "MeshSpec::intra_transport" : "MeshSpec::inter_transport"));
    return okStatus();
  };
  HSDP_RETURN_IF_ERROR(level(MeshLevel::kIntra, m->intra_));
  HSDP_RETURN_IF_ERROR(level(MeshLevel::kInter, m->inter_));
  HSDP_RETURN_IF_ERROR(level(MeshLevel::kIntra, m->intra_reduce_));
  HSDP_RETURN_IF_ERROR(level(MeshLevel::kInter, m->inter_reduce_));
  HSDP_RETURN_IF_ERROR(level(MeshLevel::kInter, m->replica_));

  // Names in messages and in the watchdog's reports ("... (shard group, inter level, seq 12)").
  m->node_->setName("node");
  m->intra_->setName("intra level");
  m->inter_->setName("inter level");
  m->intra_reduce_->setName("intra level/reduce");
  m->inter_reduce_->setName("inter level/reduce");
  m->shard_group_->setName("shard group");
  m->shard_group_reduce_->setName("shard group/reduce");
  m->replica_->setName("replica");

  // The layout arithmetic and the communicators must agree; a mismatch is a bug, not bad input.
  if (m->intra_->size() != s.intra_shard || m->intra_->rank() != c.intra_idx ||
      m->inter_->size() != s.inter_shard || m->inter_->rank() != c.inter_idx ||
      m->shard_group_->size() != s.shardGroupSize() || m->shard_group_->rank() != c.shard_rank ||
      m->shard_group_reduce_->size() != s.shardGroupSize() ||
      m->shard_group_reduce_->rank() != c.shard_rank || m->replica_->size() != s.replicas() ||
      m->replica_->rank() != c.replica_rank || m->node_->size() != s.ranks_per_node)
    return internalError("mesh communicators disagree with the layout on world rank ",
                         world.rank());
  HSDP_INFO(kMesh, m->describe(), "; this rank: node ", c.node, " local ", c.local_rank, " shard ",
            c.shard_rank, " replica ", c.replica_rank);
  return m;
}

std::string Mesh::describe() const {
  const MeshShape& s = shape_;
  return strCat(s.world_size, " ranks = ", s.num_nodes, " nodes x ", s.ranks_per_node,
                "; intra_shard ", s.intra_shard, " x inter_shard ", s.inter_shard,
                " = shard group ", s.shardGroupSize(), "; replicas ", s.replicas());
}

}  // namespace hsdp
