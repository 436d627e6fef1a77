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
// next chunk queued when one finishes. The all-gather's chunks land in place (both levels write
// each chunk's pieces straight into the full buffer, Comm::iallGatherRuns); the reduce-scatter
// reads its chunks in place (Comm::ireduceScatterRuns). Where a transport cannot, its chunks go
// through up to four staging slots preallocated by reserve(), one memcpy per piece.
// The inter phase may use its own wire format, per direction (HierOptions::gather_wire and
// reduce_wire): bf16 (half the bytes across nodes), or int8/int4 block-quantized (hsdp/quantize.h):
//   all-gather     each rank's shard (or the caller's already encoded shard) is encoded once;
//                  the codes cross nodes and then travel inside the node as they are, and every
//                  rank decodes all I*J pieces straight into the gathered buffer, so every rank
//                  holds bitwise the same values (its own shard's decoding included);
//   reduce-scatter the intra reduce-scatter stays fp32; across nodes each rank encodes the J-1
//                  pieces the other nodes own, exchanges them in one all-to-all (Comm::
//                  iallToAll), and sums the J pieces of its own block in fp32 in node order
//                  (its own piece exact): nothing is re-quantized hop by hop (ZeRO++'s qgZ).
//                  With a residual buffer the encoding error of what a rank sent is added to
//                  what it sends next time (error feedback).
// Quantized chunks start at multiples of the block size within a shard, so a block never
// straddles two ranks' data or two chunks.
//
// Operations started on one object are issued to the sub-communicators in start order (a later
// operation issues nothing until every earlier one has issued its last step), so all ranks issue
// the same sequence on each communicator while several operations are in flight. Use separate
// objects on separate communicators for concurrent roles (the engine's gathers and reductions).
#pragma once

#include <memory>

#include "hsdp/dtype.h"
#include "hsdp/quantize.h"
#include "hsdp/transport.h"

namespace hsdp {

namespace hier_detail {
struct State;  // collectives/hier/hier_collectives.cc
}  // namespace hier_detail

struct HierOptions {
  int chunks = 1;  // pipeline depth; >= 1
  // Wire type of the inter phase for float32 data, both directions (kBFloat16: the bf16 wire
  // wherever gather_wire / reduce_wire below are left at fp32).
  DType inter_dtype = DType::kFloat32;
  // Fewer chunks for small operations: each chunk of the full buffer moves at least this many
  // bytes (0: always `chunks`). Every chunk pays the sub-collectives' latency once per level.
  size_t min_chunk_bytes = 0;
  // The inter wire of all-gathers and of reduce-scatters of float32 data (fp32, bf16, int8,
  // int4 with its block size).
  WireFormat gather_wire;
  WireFormat reduce_wire;
  // The inter wire of all-reduces of float32 data. fp32: the pipelined schedule, exact. bf16,
  // int8, int4: intra reduce-scatter, then across nodes an all-to-all of encoded pieces summed
  // in fp32 (own piece exact), the sum encoded once and all-gathered, every piece decoded by
  // every rank (so all hold bitwise the same result), then intra all-gather; one chunk. The
  // engine's encoded replica all-reduce (HSDP_REPLICA_WIRE) is this with an intra level of one.
  WireFormat allreduce_wire;
};

class HierarchicalCollectives {
 public:
  // `intra` has I ranks, `inter` J ranks; both must outlive this object and its operations.
  HierarchicalCollectives(Comm& intra, Comm& inter, HierOptions options = {});
  ~HierarchicalCollectives();

  int groupSize() const;
  int shardIndex() const;
  const HierOptions& options() const;
  // Errors name the values: chunks < 1; an inter dtype other than float32/bf16; a quantization
  // block that is not a multiple of 16 in [16, 2^20].
  [[nodiscard]] Status setOptions(HierOptions options);

  // Preallocates every buffer needed for shards of up to `max_count` elements of `dtype`.
  [[nodiscard]] Status reserve(size_t max_count, DType dtype);
  size_t scratchBytes() const;

  // `shard` (count elements) -> `full` (groupSize()*count elements, shard k at k*count), over
  // options().gather_wire, or over `wire` for this call (fp32: exact whatever the options).
  [[nodiscard]] StatusOr<WorkHandle> iallGather(const void* shard, void* full, size_t count,
                                                DType dtype);
  [[nodiscard]] StatusOr<WorkHandle> iallGather(const void* shard, void* full, size_t count,
                                                DType dtype, const WireFormat& wire);
  // With a quantizing gather wire (gatherQuantizes()): `encoded` is this rank's float32 shard of
  // `count` elements already encoded with options().gather_wire (wireEncode: encodedBytes(
  // gather_wire, count) bytes), e.g. the engine's master shard encoded once per step; `full`
  // receives every shard decoded. FailedPrecondition when the wire quantizes nothing.
  [[nodiscard]] StatusOr<WorkHandle> iallGatherEncoded(const void* encoded, float* full,
                                                       size_t count);
  // True when all-gathers of float32 data quantize: an int8/int4 gather wire across > 1 node.
  bool gatherQuantizes() const;
  // `full` (groupSize()*count) -> `shard` (count): reduction of block shardIndex(). With a
  // quantizing reduce wire, `residual` (residualCount(count) floats, zeros before the first
  // call, kept by the caller between calls) turns on error feedback; null: none.
  [[nodiscard]] StatusOr<WorkHandle> ireduceScatter(const void* full, void* shard, size_t count,
                                                    DType dtype, RedOp op,
                                                    float* residual = nullptr);
  // Floats of error-feedback residual a reduce-scatter of `count` elements per shard keeps:
  // (J-1)*count with an int8/int4 reduce wire across J > 1 nodes, else 0.
  size_t residualCount(size_t count) const;
  // In-place all-reduce of `count` elements over the whole group (any count). With an encoded
  // all-reduce wire, `residual` (allReduceResidualCount(count) floats, zeros at first) turns
  // on error feedback for both encodings (what a rank sent, and the sum it encoded).
  [[nodiscard]] StatusOr<WorkHandle> iallReduce(void* buf, size_t count, DType dtype, RedOp op,
                                                float* residual = nullptr);
  // J * ceil(count / (I*J)) with a bf16/int8/int4 all-reduce wire across J > 1 nodes, else 0.
  size_t allReduceResidualCount(size_t count) const;

  [[nodiscard]] Status allGather(const void* shard, void* full, size_t count, DType dtype);
  [[nodiscard]] Status reduceScatter(const void* full, void* shard, size_t count, DType dtype,
                                     RedOp op, float* residual = nullptr);
  [[nodiscard]] Status allReduce(void* buf, size_t count, DType dtype, RedOp op,
                                 float* residual = nullptr);

 private:
  std::unique_ptr<hier_detail::State> s_;  // the levels, options, staging and issue order
};

}  // namespace hsdp
