#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/comm_observer.h"
#include "hsdp/transport.h"

namespace hsdp {
namespace {

class CompletedWork final : public Work {
 public:
  explicit CompletedWork(Status s) : status_(std::move(s)) {}
  Status wait() override { return status_; }
  StatusOr<bool> test() override {
    if (!status_.ok()) return status_;
    return true;
  }

 private:
  Status status_;
};

// The Work of a group started operation by operation.
class AllOfWork final : public Work {
 public:
  explicit AllOfWork(std::vector<WorkHandle> works) : works_(std::move(works)) {}

  Status wait() override {
    Status first;
    for (WorkHandle& w : works_) {
      Status s = w->wait();  // every one, even after a failure: their buffers are in use
      if (first.ok() && !s.ok()) first = std::move(s);
    }
    return first;
  }

  StatusOr<bool> test() override {
    // Every pending one is tested on each call, so all of them keep progressing (a transport
    // may progress an operation only inside its own test()), not just the oldest.
    bool all = true;
    for (size_t k = done_; k < works_.size(); ++k) {
      HSDP_ASSIGN_OR_RETURN(bool d, works_[k]->test());
      if (!d)
        all = false;
      else if (all)
        done_ = k + 1;  // a completed prefix is not tested again
    }
    return all;
  }

 private:
  std::vector<WorkHandle> works_;
  size_t done_ = 0;  // works_[0, done_) are known complete
};

}  // namespace

const char* collectiveKindName(CollectiveOp::Kind kind) {
  switch (kind) {
    case CollectiveOp::Kind::kAllGather:
      return "allGather";
    case CollectiveOp::Kind::kReduceScatter:
      return "reduceScatter";
    case CollectiveOp::Kind::kAllReduce:
      return "allReduce";
  }
  return "?";
}

Status checkIndependent(std::span<const CollectiveOp> ops, int comm_size) {
  struct Range {
    uintptr_t begin, end;
    size_t op;
  };
  std::vector<Range> writes, reads;
  const size_t n = static_cast<size_t>(comm_size);
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveOp& o = ops[i];
    if (o.count == 0) continue;
    const size_t bytes = o.count * dtypeSize(o.dtype);
    auto at = [](const void* p) { return reinterpret_cast<uintptr_t>(p); };
    switch (o.kind) {
      case CollectiveOp::Kind::kAllGather:
        writes.push_back({at(o.recv), at(o.recv) + n * bytes, i});
        reads.push_back({at(o.send), at(o.send) + bytes, i});
        break;
      case CollectiveOp::Kind::kReduceScatter:
        writes.push_back({at(o.recv), at(o.recv) + bytes, i});
        reads.push_back({at(o.send), at(o.send) + n * bytes, i});
        break;
      case CollectiveOp::Kind::kAllReduce:
        writes.push_back({at(o.recv), at(o.recv) + bytes, i});
        break;
    }
  }
  auto clash = [&](size_t a, size_t b, const char* how) {
    if (a > b) std::swap(a, b);
    return invalidArgument("group operations ", a, " (", collectiveKindName(ops[a].kind), ") and ",
                           b, " (", collectiveKindName(ops[b].kind), ") ", how,
                           ": the operations of a group are in flight at once and must be "
                           "independent");
  };
  std::sort(writes.begin(), writes.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t k = 1; k < writes.size(); ++k)
    if (writes[k].begin < writes[k - 1].end)
      return clash(writes[k - 1].op, writes[k].op, "write overlapping buffers");
  // The writes are disjoint and sorted: a read can overlap only the last write starting before
  // its end and the ones before it that reach past its begin; walk back while they do.
  for (const Range& r : reads) {
    auto it = std::lower_bound(writes.begin(), writes.end(), r.end,
                               [](const Range& w, uintptr_t e) { return w.begin < e; });
    while (it != writes.begin()) {
      --it;
      if (it->end <= r.begin) break;
      if (it->op != r.op) return clash(r.op, it->op, "read and write overlapping buffers");
    }
  }
  return okStatus();
}

WorkHandle allOf(std::vector<WorkHandle> works) {
  if (works.size() == 1) return std::move(works.front());
  return std::make_unique<AllOfWork>(std::move(works));
}

namespace {
// One operation of a group, started as its single call.
StatusOr<WorkHandle> startOp(Comm& comm, const CollectiveOp& o) {
  switch (o.kind) {
    case CollectiveOp::Kind::kAllGather:
      return comm.iallGather(o.send, o.recv, o.count, o.dtype);
    case CollectiveOp::Kind::kReduceScatter:
      return comm.ireduceScatter(o.send, o.recv, o.count, o.dtype, o.op);
    case CollectiveOp::Kind::kAllReduce:
      return comm.iallReduce(o.recv, o.count, o.dtype, o.op);
  }
  return invalidArgument("unknown collective kind ", static_cast<int>(o.kind));
}
}  // namespace

StatusOr<WorkHandle> Comm::igroup(std::span<const CollectiveOp> ops) {
  HSDP_RETURN_IF_ERROR(checkIndependent(ops, size()));
  std::vector<WorkHandle> works;
  works.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveOp& o = ops[i];
    StatusOr<WorkHandle> w = startOp(*this, o);
    if (!w.ok()) {
      // The ones already started are in flight on their buffers: let them finish first. (A
      // failure here is this rank's bad argument; the peers' matching calls may then wait.)
      for (WorkHandle& started : works) (void)started->wait();
      return w.status().withContext(
          strCat("group operation ", i, " of ", ops.size(), " (", collectiveKindName(o.kind), ")"));
    }
    works.push_back(std::move(*w));
  }
  if (works.empty()) return completedWork();
  return allOf(std::move(works));
}

void Comm::setName(std::string name) {
  if (CommObserver* o = commObserver(); trace_ && o != nullptr) o->renamed(*trace_, name);
  name_ = std::move(name);
}

WorkHandle completedWork(Status status) {
  return std::make_unique<CompletedWork>(std::move(status));
}

Status checkBlockRuns(const BlockRuns& l) {
  if (l.runs == 0) return invalidArgument("reduce-scatter blocks of 0 runs");
  if (l.runs > 1 && l.stride < l.run)
    return invalidArgument("reduce-scatter runs of ", l.run, " elements ", l.stride,
                           " apart overlap");
  return okStatus();
}

StatusOr<WorkHandle> Comm::ireduceScatterRuns(const void* send, void* recv, const BlockRuns& layout,
                                              DType dtype, RedOp op, void* pack) {
  HSDP_RETURN_IF_ERROR(checkBlockRuns(layout));
  const size_t es = dtypeSize(dtype), n = layout.run, block = layout.blockCount();
  if (block == 0) return ireduceScatter(send, recv, 0, dtype, op);
  if (pack == nullptr)
    return invalidArgument("ireduceScatterRuns on the '", transportName(),
                           "' transport needs a pack buffer");
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(pack);
  for (size_t q = 0; q < static_cast<size_t>(size()); ++q)
    for (size_t r = 0; r < layout.runs; ++r)
      std::memcpy(out + (q * block + r * n) * es, in + layout.offset(q, r) * es, n * es);
  return ireduceScatter(pack, recv, block, dtype, op);
}

StatusOr<WorkHandle> Comm::iallToAll(const void*, void*, size_t, DType) {
  return unimplemented("the '", transportName(), "' transport has no all-to-all");
}

Status Comm::allGather(const void* send, void* recv, size_t count, DType dtype) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, iallGather(send, recv, count, dtype));
  return w->wait();
}

Status Comm::reduceScatter(const void* send, void* recv, size_t count, DType dtype, RedOp op) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, ireduceScatter(send, recv, count, dtype, op));
  return w->wait();
}

Status Comm::allReduce(void* buf, size_t count, DType dtype, RedOp op) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, iallReduce(buf, count, dtype, op));
  return w->wait();
}

}  // namespace hsdp
