// Comm's defaults of what a backend implements: startGroup one operation at a time, the runs
// variants through a contiguous pack buffer, and the blocking calls as start-and-wait. A
// transport overrides what it does better (core/work.cc has the public, checked calls).
#include <cstring>
#include <memory>
#include <utility>

#include "core/progress.h"
#include "hsdp/transport.h"

namespace hsdp {
namespace {

// The all-gather of the default startAllGatherRuns: completes when the contiguous gather into
// `pack` has, after unpacking every other rank's block into its runs (this rank's went in when
// it started, or was there already).
class UnpackRunsWork final : public ProgressiveWork {
 public:
  UnpackRunsWork(WorkHandle gather, const char* pack, char* recv, const BlockRuns& layout,
                 size_t es, int size, int rank)
      : gather_(std::move(gather)),
        pack_(pack),
        recv_(recv),
        layout_(layout),
        es_(es),
        size_(size),
        rank_(rank) {}
  ~UnpackRunsWork() override { waitForDestruction(); }

 private:
  void advance() override {
    StatusOr<bool> done = isComplete(*gather_);
    if (!done.ok()) return finish(done.status());
    if (!*done) return;
    const size_t block = layout_.blockCount(), run = layout_.run;
    for (size_t q = 0; q < static_cast<size_t>(size_); ++q) {
      if (q == static_cast<size_t>(rank_)) continue;
      for (size_t p = 0; p < layout_.runs; ++p)
        std::memcpy(recv_ + layout_.offset(q, p) * es_, pack_ + (q * block + p * run) * es_,
                    run * es_);
    }
    finish(okStatus());
  }

  WorkHandle gather_;
  const char* pack_;
  char* recv_;
  BlockRuns layout_;
  size_t es_;
  int size_, rank_;
};

}  // namespace

StatusOr<WorkHandle> Comm::startGroup(std::span<const CollectiveOp> ops) {
  // Not fused: igroup calls it with one operation at a time, traced as its single call.
  if (ops.size() != 1)
    return internalError("Comm::startGroup of ", ops.size(), " operations on the '",
                         transportName(), "' transport, which does not fuse groups");
  const CollectiveOp& o = ops.front();
  switch (o.kind) {
    case CollectiveOp::Kind::kAllGather:
      return startAllGather(o.send, o.recv, o.count, o.dtype);
    case CollectiveOp::Kind::kReduceScatter:
      return startReduceScatter(o.send, o.recv, o.count, o.dtype, o.op);
    case CollectiveOp::Kind::kAllReduce:
      return startAllReduce(o.recv, o.count, o.dtype, o.op);
  }
  return invalidArgument("unknown collective kind ", static_cast<int>(o.kind));
}

StatusOr<WorkHandle> Comm::startReduceScatterRuns(const void* send, void* recv,
                                                  const BlockRuns& layout, DType dtype, RedOp op,
                                                  void* pack) {
  const size_t es = dtypeSize(dtype), n = layout.run, block = layout.blockCount();
  if (block == 0) return startReduceScatter(send, recv, 0, dtype, op);
  if (pack == nullptr)
    return invalidArgument("ireduceScatterRuns on the '", transportName(),
                           "' transport needs a pack buffer");
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(pack);
  for (size_t q = 0; q < static_cast<size_t>(size()); ++q)
    for (size_t r = 0; r < layout.runs; ++r)
      std::memcpy(out + (q * block + r * n) * es, in + layout.offset(q, r) * es, n * es);
  return startReduceScatter(pack, recv, block, dtype, op);
}

StatusOr<WorkHandle> Comm::startAllGatherRuns(const void* send, void* recv, const BlockRuns& layout,
                                              DType dtype, void* pack) {
  const size_t es = dtypeSize(dtype), n = layout.run, block = layout.blockCount();
  if (block == 0) return completedWork();
  if (pack == nullptr)
    return invalidArgument("iallGatherRuns on the '", transportName(),
                           "' transport needs a pack buffer");
  auto* out = static_cast<char*>(recv);
  auto* packed = static_cast<char*>(pack);
  const size_t r = static_cast<size_t>(rank());
  char* mine = packed + r * block * es;
  // This rank's block goes to its runs now (unless it is there already) and, contiguous, to its
  // place in `pack`, from where the gather sends it in place.
  const bool in_place = send == out + layout.offset(r, 0) * es;
  for (size_t p = 0; p < layout.runs; ++p) {
    char* run = out + layout.offset(r, p) * es;
    if (!in_place) std::memcpy(run, static_cast<const char*>(send) + p * n * es, n * es);
    std::memcpy(mine + p * n * es, run, n * es);
  }
  HSDP_ASSIGN_OR_RETURN(WorkHandle gather, startAllGather(mine, packed, block, dtype));
  return WorkHandle(
      std::make_unique<UnpackRunsWork>(std::move(gather), packed, out, layout, es, size(), rank()));
}

StatusOr<WorkHandle> Comm::startAllToAll(const void*, void*, size_t, DType) {
  return unimplemented("the '", transportName(), "' transport has no all-to-all");
}

Status Comm::runAllGather(const void* send, void* recv, size_t count, DType dtype) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, startAllGather(send, recv, count, dtype));
  return w->wait();
}

Status Comm::runReduceScatter(const void* send, void* recv, size_t count, DType dtype, RedOp op) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, startReduceScatter(send, recv, count, dtype, op));
  return w->wait();
}

Status Comm::runAllReduce(void* buf, size_t count, DType dtype, RedOp op) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, startAllReduce(buf, count, dtype, op));
  return w->wait();
}

}  // namespace hsdp
