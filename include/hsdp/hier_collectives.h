// Hierarchical collectives over the shard group, composed from the two sub-communicator levels
// of the mesh (UCC-style: a schedule of sub-team collectives):
//   all-gather     = inter-node all-gather of the shard, then intra-node all-gather of the blocks
//   reduce-scatter = intra-node reduce-scatter of the full buffer, then inter-node reduce-scatter
//   all-reduce     = intra reduce-scatter, inter reduce-scatter, inter all-gather, intra
//                    all-gather (the inter pair is the all-reduce of each rank's piece)
// With shard index k = intra_idx * J + inter_idx (see mesh.h) the first two equal the flat
// collective over the shard group: shard k sits at offset k*count.
//
// Pipelining: with chunks = C > 1 (both levels larger than one rank) each shard is cut into C
// chunks (C need not divide the count) and chunk c's intra phase runs while later chunks' inter
// phases are on the wire; up to two operations per level are in flight, so a link always has the
// next chunk queued when one finishes. The chunks travel through up to four staging slots
// preallocated by reserve(); unpacking them into the strided full buffer is one memcpy per piece.
// The inter phase may use its own wire type (bf16 across nodes, fp32 inside).
//
// Operations started on one object are issued to the sub-communicators in start order (a later
// operation issues nothing until every earlier one has issued its last step), so all ranks issue
// the same sequence on each communicator while several operations are in flight. Use separate
// objects on separate communicators for concurrent roles (the engine's gathers and reductions).
#pragma once

#include <memory>

#include "hsdp/dtype.h"
#include "hsdp/transport.h"

namespace hsdp {

namespace hier_detail {
struct State;  // collectives/hier/hier_collectives.cc
}  // namespace hier_detail

struct HierOptions {
  int chunks = 1;                     // pipeline depth; >= 1
  DType inter_dtype = DType::kFloat32;  // wire type of the inter phase for float32 data
  // Fewer chunks for small operations: each chunk of the full buffer moves at least this many
  // bytes (0: always `chunks`). Every chunk pays the sub-collectives' latency once per level.
  size_t min_chunk_bytes = 0;
};

class HierarchicalCollectives {
 public:
  // `intra` has I ranks, `inter` J ranks; both must outlive this object and its operations.
  HierarchicalCollectives(Comm& intra, Comm& inter, HierOptions options = {});
  ~HierarchicalCollectives();

  int groupSize() const;
  int shardIndex() const;
  const HierOptions& options() const;
  // Errors name the values: chunks < 1; an inter dtype other than float32/bf16.
  [[nodiscard]] Status setOptions(HierOptions options);

  // Preallocates every buffer needed for shards of up to `max_count` elements of `dtype`.
  [[nodiscard]] Status reserve(size_t max_count, DType dtype);
  size_t scratchBytes() const;

  // `shard` (count elements) -> `full` (groupSize()*count elements, shard k at k*count).
  [[nodiscard]] StatusOr<WorkHandle> iallGather(const void* shard, void* full, size_t count,
                                                DType dtype);
  // `full` (groupSize()*count) -> `shard` (count): reduction of block shardIndex().
  [[nodiscard]] StatusOr<WorkHandle> ireduceScatter(const void* full, void* shard, size_t count,
                                                    DType dtype, RedOp op);
  // In-place all-reduce of `count` elements over the whole group (any count).
  [[nodiscard]] StatusOr<WorkHandle> iallReduce(void* buf, size_t count, DType dtype, RedOp op);

  [[nodiscard]] Status allGather(const void* shard, void* full, size_t count, DType dtype);
  [[nodiscard]] Status reduceScatter(const void* full, void* shard, size_t count, DType dtype,
                                     RedOp op);
  [[nodiscard]] Status allReduce(void* buf, size_t count, DType dtype, RedOp op);

 private:
  std::unique_ptr<hier_detail::State> s_;  // the levels, options, staging and issue order
};

}  // namespace hsdp
