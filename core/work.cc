#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/comm_observer.h"
#include "core/progress.h"
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

void Comm::setName(std::string name) {
  if (CommObserver* o = commObserver(); trace_ && o != nullptr) o->renamed(*trace_, name);
  name_ = std::move(name);
}

WorkHandle completedWork(Status status) {
  return std::make_unique<CompletedWork>(std::move(status));
}

// ---- Comm: the public calls, checked and traced once (non-virtual interface) ------------------

namespace {

bool isFloating(DType t) { return t == DType::kFloat32 || t == DType::kBFloat16; }

// What every transport checks alike. `reduction`: the name in the avg message ("reduceScatter",
// "allReduce"), null for calls that do not reduce.
Status checkShared(const CallArgs& a, const char* reduction, RedOp op, bool has_send) {
  if (reduction != nullptr && op == RedOp::kAvg && !isFloating(a.dtype))
    return invalidArgument(reduction, ": avg of ", dtypeName(a.dtype));
  if (a.count > 0 && (a.recv == nullptr || (has_send && a.send == nullptr)))
    return invalidArgument(a.what, ": null ", a.recv == nullptr ? "recv" : "send", " buffer for ",
                           a.count, " elements");
  return okStatus();
}

OpKind opKindOf(CollectiveOp::Kind kind) {
  switch (kind) {
    case CollectiveOp::Kind::kAllGather:
      return OpKind::kAllGather;
    case CollectiveOp::Kind::kReduceScatter:
      return OpKind::kReduceScatter;
    case CollectiveOp::Kind::kAllReduce:
      return OpKind::kAllReduce;
  }
  return OpKind::kGroup;
}

// The one place a nonblocking call enters the watchdog's trace, through core's hook
// (core/comm_observer.h: the watchdog stands above core): the fingerprint is published; with
// checking on, `start` runs once every member's fingerprint matched, from the progress loop (so
// it captures by value), or, for a transport that compares before it starts, right after a
// blocking comparison. `ops`: operations of a fused group. Untraced: just `start`.
template <typename Start>
StatusOr<WorkHandle> tracedStart(CommTrace* t, bool compare_first, OpKind kind, size_t count,
                                 DType dtype, RedOp op, Start&& start, int ops = 1) {
  CommObserver* o = commObserver();
  if (t == nullptr || o == nullptr) return start();
  const TracedCall call{kind, count, dtype, op, -1, ops, compare_first};
  return o->startTraced(*t, call,
                        std::function<StatusOr<WorkHandle>()>(std::forward<Start>(start)));
}

// A blocking call: published and checked through the hook when traced; waited for inside a
// wait named `what` (the foreign call, e.g. "MPI_Allgather") either way.
Status runCollective(CommTrace* t, OpKind kind, size_t count, DType dtype, RedOp op, int root,
                     const char* what, const std::function<Status()>& run) {
  CommObserver* o = commObserver();
  if (t == nullptr || o == nullptr) {
    ObservedWait wait(nullptr, 0, what);
    return run();
  }
  return o->runTraced(*t, TracedCall{kind, count, dtype, op, root}, what, run);
}

}  // namespace

Status Comm::checkArgs(const CallArgs&) const { return okStatus(); }

StatusOr<WorkHandle> Comm::iallGather(const void* send, void* recv, size_t count, DType dtype) {
  auto lock = progressLock();
  const CallArgs a{"iallGather", send, recv, count, count * size(), dtype};
  HSDP_RETURN_IF_ERROR(checkShared(a, nullptr, RedOp::kSum, true));
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(
      tracedStart(
          trace(), comparesBeforeStart(), OpKind::kAllGather, count, dtype, RedOp::kSum,
          [this, send, recv, count, dtype] { return startAllGather(send, recv, count, dtype); }),
      blockBytesSent(size(), count, dtype));
}

StatusOr<WorkHandle> Comm::iallGatherRuns(const void* send, void* recv, const BlockRuns& layout,
                                          DType dtype, void* pack) {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkBlockRuns(layout, "all-gather"));
  const size_t count = layout.blockCount();
  const CallArgs a{"iallGatherRuns", send, recv, count, count * size(), dtype};
  HSDP_RETURN_IF_ERROR(checkShared(a, nullptr, RedOp::kSum, true));
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(
      tracedStart(trace(), comparesBeforeStart(), OpKind::kAllGather, count, dtype, RedOp::kSum,
                  [this, send, recv, layout, dtype, pack] {
                    return startAllGatherRuns(send, recv, layout, dtype, pack);
                  }),
      blockBytesSent(size(), count, dtype));
}

StatusOr<WorkHandle> Comm::ireduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                          RedOp op) {
  auto lock = progressLock();
  const CallArgs a{"ireduceScatter", send, recv, count, count * size(), dtype};
  // Bad input on any communicator, also where there is nothing to reduce.
  HSDP_RETURN_IF_ERROR(checkShared(a, "reduceScatter", op, true));
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(
      tracedStart(trace(), comparesBeforeStart(), OpKind::kReduceScatter, count, dtype, op,
                  [this, send, recv, count, dtype, op] {
                    return startReduceScatter(send, recv, count, dtype, op);
                  }),
      blockBytesSent(size(), count, dtype));
}

StatusOr<WorkHandle> Comm::ireduceScatterRuns(const void* send, void* recv, const BlockRuns& layout,
                                              DType dtype, RedOp op, void* pack) {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkBlockRuns(layout));
  const size_t count = layout.blockCount();
  const CallArgs a{"ireduceScatterRuns", send, recv, count, count * size(), dtype};
  HSDP_RETURN_IF_ERROR(checkShared(a, "reduceScatter", op, true));
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(
      tracedStart(trace(), comparesBeforeStart(), OpKind::kReduceScatter, count, dtype, op,
                  [this, send, recv, layout, dtype, op, pack] {
                    return startReduceScatterRuns(send, recv, layout, dtype, op, pack);
                  }),
      blockBytesSent(size(), count, dtype));
}

StatusOr<WorkHandle> Comm::iallReduce(void* buf, size_t count, DType dtype, RedOp op) {
  auto lock = progressLock();
  const CallArgs a{"iallReduce", nullptr, buf, count, count, dtype};
  HSDP_RETURN_IF_ERROR(checkShared(a, "allReduce", op, false));
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(
      tracedStart(trace(), comparesBeforeStart(), OpKind::kAllReduce, count, dtype, op,
                  [this, buf, count, dtype, op] { return startAllReduce(buf, count, dtype, op); }),
      allReduceBytesSent(size(), rank(), count, dtype));
}

StatusOr<WorkHandle> Comm::iallToAll(const void* send, void* recv, size_t count, DType dtype) {
  auto lock = progressLock();
  const CallArgs a{"iallToAll", send, recv, count, count * size(), dtype};
  HSDP_RETURN_IF_ERROR(checkShared(a, nullptr, RedOp::kSum, true));
  const size_t bytes = count * size() * dtypeSize(dtype);
  const auto* s = static_cast<const char*>(send);
  const auto* d = static_cast<const char*>(recv);
  if (count > 0 && s < d + bytes && d < s + bytes)
    return invalidArgument("allToAll: send and recv buffers overlap");
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(
      tracedStart(
          trace(), comparesBeforeStart(), OpKind::kAllToAll, count, dtype, RedOp::kSum,
          [this, send, recv, count, dtype] { return startAllToAll(send, recv, count, dtype); }),
      blockBytesSent(size(), count, dtype));
}

Status Comm::allGather(const void* send, void* recv, size_t count, DType dtype) {
  auto lock = progressLock();
  const CallArgs a{"allGather", send, recv, count, count * size(), dtype};
  HSDP_RETURN_IF_ERROR(checkShared(a, nullptr, RedOp::kSum, true));
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(
      runCollective(trace(), OpKind::kAllGather, count, dtype, RedOp::kSum, -1,
                    waitName("allGather"), [&] { return runAllGather(send, recv, count, dtype); }),
      blockBytesSent(size(), count, dtype));
}

Status Comm::reduceScatter(const void* send, void* recv, size_t count, DType dtype, RedOp op) {
  auto lock = progressLock();
  const CallArgs a{"reduceScatter", send, recv, count, count * size(), dtype};
  HSDP_RETURN_IF_ERROR(checkShared(a, "reduceScatter", op, true));
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(runCollective(trace(), OpKind::kReduceScatter, count, dtype, op, -1,
                               waitName("reduceScatter"),
                               [&] { return runReduceScatter(send, recv, count, dtype, op); }),
                 blockBytesSent(size(), count, dtype));
}

Status Comm::allReduce(void* buf, size_t count, DType dtype, RedOp op) {
  auto lock = progressLock();
  const CallArgs a{"allReduce", nullptr, buf, count, count, dtype};
  HSDP_RETURN_IF_ERROR(checkShared(a, "allReduce", op, false));
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(
      runCollective(trace(), OpKind::kAllReduce, count, dtype, op, -1, waitName("allReduce"),
                    [&] { return runAllReduce(buf, count, dtype, op); }),
      allReduceBytesSent(size(), rank(), count, dtype));
}

Status Comm::broadcast(void* buf, size_t count, DType dtype, int root) {
  auto lock = progressLock();
  const CallArgs a{"broadcast", nullptr, buf, count, count, dtype};
  HSDP_RETURN_IF_ERROR(checkShared(a, nullptr, RedOp::kSum, false));
  if (root < 0 || root >= size())
    return invalidArgument("broadcast: root ", root, " outside communicator of size ", size());
  HSDP_RETURN_IF_ERROR(checkArgs(a));
  return counted(
      runCollective(trace(), OpKind::kBroadcast, count, dtype, RedOp::kSum, root,
                    waitName("broadcast"), [&] { return runBroadcast(buf, count, dtype, root); }),
      broadcastBytesSent(size(), rank(), root, count, dtype));
}

Status Comm::barrier() {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkArgs({"barrier", nullptr, nullptr, 0, 0, DType::kUInt8}));
  return runCollective(trace(), OpKind::kBarrier, 0, DType::kUInt8, RedOp::kSum, -1,
                       waitName("barrier"), [&] { return runBarrier(); });
}

StatusOr<WorkHandle> Comm::igroup(std::span<const CollectiveOp> ops) {
  auto lock = progressLock();
  const size_t n = static_cast<size_t>(size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveOp& o = ops[i];
    const bool gathers = o.kind == CollectiveOp::Kind::kAllGather;
    const bool reduces = o.kind == CollectiveOp::Kind::kReduceScatter;
    const CallArgs a{collectiveKindName(o.kind),
                     o.kind == CollectiveOp::Kind::kAllReduce ? nullptr : o.send,
                     o.recv,
                     o.count,
                     gathers || reduces ? o.count * n : o.count,
                     o.dtype};
    Status s = checkShared(a, gathers ? nullptr : collectiveKindName(o.kind), o.op,
                           o.kind != CollectiveOp::Kind::kAllReduce);
    if (s.ok()) s = checkArgs(a);
    if (!s.ok())
      return s.withContext(
          strCat("group operation ", i, " of ", ops.size(), " (", collectiveKindName(o.kind), ")"));
  }
  HSDP_RETURN_IF_ERROR(checkIndependent(ops, size()));
  uint64_t nominal = 0;  // what the group sends, each operation as its single call
  for (const CollectiveOp& o : ops)
    nominal += o.kind == CollectiveOp::Kind::kAllReduce
                   ? allReduceBytesSent(size(), rank(), o.count, o.dtype)
                   : blockBytesSent(size(), o.count, o.dtype);
  if (fusesGroups()) {
    size_t total = 0, live = 0;
    for (const CollectiveOp& o : ops) total += o.count, live += o.count > 0 ? 1 : 0;
    // Compared before the start whatever the transport: the start reads `ops`, which the
    // caller may reuse once igroup returns.
    return counted(tracedStart(
                       trace(), /*compare_first=*/true, OpKind::kGroup, total,
                       ops.empty() ? DType::kFloat32 : ops.front().dtype, RedOp::kSum,
                       [this, ops] { return startGroup(ops); }, static_cast<int>(live)),
                   nominal);
  }
  std::vector<WorkHandle> works;
  works.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveOp o = ops[i];
    StatusOr<WorkHandle> w = tracedStart(trace(), comparesBeforeStart(), opKindOf(o.kind), o.count,
                                         o.dtype, o.op, [this, o] {
                                           return startGroup({&o, 1});
                                         });
    if (!w.ok()) {
      // The ones already started are in flight on their buffers: let them finish first. (A
      // failure here is this rank's; the peers' matching calls may then wait.)
      for (WorkHandle& started : works) (void)started->wait();
      return w.status().withContext(
          strCat("group operation ", i, " of ", ops.size(), " (", collectiveKindName(o.kind), ")"));
    }
    works.push_back(std::move(*w));
  }
  if (works.empty()) return completedWork();
  return counted(StatusOr<WorkHandle>(allOf(std::move(works))), nominal);
}

uint64_t blockBytesSent(int size, size_t count, DType dtype) {
  return size < 2 ? 0 : uint64_t(size - 1) * count * dtypeSize(dtype);
}

uint64_t allReduceBytesSent(int size, int rank, size_t count, DType dtype) {
  if (size < 2) return 0;
  const uint64_t n = static_cast<uint64_t>(size), base = count / n, extra = count % n;
  auto chunk = [&](uint64_t i) { return base + (i < extra ? 1 : 0); };
  const uint64_t r = static_cast<uint64_t>(rank);
  return (2 * uint64_t{count} - chunk((r + 1) % n) - chunk((r + 2) % n)) * dtypeSize(dtype);
}

uint64_t broadcastBytesSent(int size, int rank, int root, size_t count, DType dtype) {
  return rank == root ? blockBytesSent(size, count, dtype) : 0;
}

Status agreeOnSuccess(Comm& bootstrap, const Status& local, const std::string& what) {
  int32_t failed = local.ok() ? 0 : 1;
  HSDP_RETURN_IF_ERROR(bootstrap.allReduce(&failed, 1, DType::kInt32, RedOp::kSum));
  if (!local.ok()) return local.withContext(what);
  if (failed > 0)
    return internalError(what, " failed on ", failed, " of ", bootstrap.size(),
                         " ranks (this rank, ", bootstrap.rank(), ", succeeded; see theirs)");
  return okStatus();
}

Status checkBlockRuns(const BlockRuns& l, const char* what) {
  if (l.runs == 0) return invalidArgument(what, " blocks of 0 runs");
  if (l.runs > 1 && l.stride < l.run)
    return invalidArgument(what, " runs of ", l.run, " elements ", l.stride, " apart overlap");
  return okStatus();
}

}  // namespace hsdp
