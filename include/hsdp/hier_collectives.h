// Hierarchical collectives over the shard group, composed from the two sub-communicator levels
// of the mesh (UCC-style: a schedule of sub-team collectives):
//   all-gather     = inter-node all-gather of the shard, then intra-node all-gather of the blocks
//   reduce-scatter = intra-node reduce-scatter of the full buffer, then inter-node reduce-scatter
// With shard index k = intra_idx * J + inter_idx (see mesh.h) both equal the flat collective over
// the shard group: shard k sits at offset k*count.
#pragma once

#include "hsdp/dtype.h"
#include "hsdp/host_buffer.h"
#include "hsdp/transport.h"

namespace hsdp {

class HierarchicalCollectives {
 public:
  // `intra` has I ranks, `inter` J ranks; both must outlive this object.
  HierarchicalCollectives(Comm& intra, Comm& inter) : intra_(intra), inter_(inter) {}

  int groupSize() const { return intra_.size() * inter_.size(); }
  int shardIndex() const { return intra_.rank() * inter_.size() + inter_.rank(); }

  // Preallocates every buffer needed for shards of up to `max_count` elements of `dtype`.
  [[nodiscard]] Status reserve(size_t max_count, DType dtype);
  size_t scratchBytes() const { return scratch_.size(); }

  // `shard` (count elements) -> `full` (groupSize()*count elements, shard k at k*count).
  [[nodiscard]] Status allGather(const void* shard, void* full, size_t count, DType dtype);
  // `full` (groupSize()*count) -> `shard` (count): reduction of block shardIndex().
  [[nodiscard]] Status reduceScatter(const void* full, void* shard, size_t count, DType dtype,
                                     RedOp op);

 private:
  Comm& intra_;
  Comm& inter_;
  HostBuffer scratch_;  // the intra phase's partial result: J*count elements
};

}  // namespace hsdp
