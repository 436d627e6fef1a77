#include "hsdp/hier_collectives.h"

#include <cstring>

#include "hsdp/log.h"

namespace hsdp {

Status HierarchicalCollectives::reserve(size_t max_count, DType dtype) {
  const size_t es = dtypeSize(dtype);
  const size_t J = inter_.size();
  if (intra_.size() > 1 && J > 1 && scratch_.size() < J * max_count * es) {
    HSDP_ASSIGN_OR_RETURN(scratch_, HostBuffer::allocate(J * max_count * es));
  }
  HSDP_RETURN_IF_ERROR(intra_.reserveScratch(J * max_count * es));
  HSDP_RETURN_IF_ERROR(inter_.reserveScratch(max_count * es));
  return okStatus();
}

Status HierarchicalCollectives::allGather(const void* shard, void* full, size_t count,
                                          DType dtype) {
  const size_t es = dtypeSize(dtype);
  const size_t J = inter_.size();
  // Our intra block holds the J shards of our intra index, one from each node of the group.
  char* block = static_cast<char*>(full) + static_cast<size_t>(intra_.rank()) * J * count * es;
  if (J > 1) {
    HSDP_RETURN_IF_ERROR(inter_.allGather(shard, block, count, dtype));
  } else if (shard != block) {
    std::memcpy(block, shard, count * es);
  }
  if (intra_.size() > 1) HSDP_RETURN_IF_ERROR(intra_.allGather(block, full, J * count, dtype));
  return okStatus();
}

Status HierarchicalCollectives::reduceScatter(const void* full, void* shard, size_t count,
                                              DType dtype, RedOp op) {
  const size_t es = dtypeSize(dtype);
  const size_t J = inter_.size();
  if (intra_.size() == 1) return inter_.reduceScatter(full, shard, count, dtype, op);
  if (J == 1) return intra_.reduceScatter(full, shard, count, dtype, op);
  if (scratch_.size() < J * count * es) {
    HSDP_WARN(kColl, "hierarchical reduceScatter grows scratch on the hot path; reserve first");
    HSDP_RETURN_IF_ERROR(reserve(count, dtype));
  }
  // Averages compose: the average over I of averages over J is the average over I*J.
  HSDP_RETURN_IF_ERROR(intra_.reduceScatter(full, scratch_.data(), J * count, dtype, op));
  return inter_.reduceScatter(scratch_.data(), shard, count, dtype, op);
}

}  // namespace hsdp
