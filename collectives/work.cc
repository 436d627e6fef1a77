#include "hsdp/transport.h"

#include <utility>

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
      if (!d) all = false;
      else if (all) done_ = k + 1;  // a completed prefix is not tested again
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
    case CollectiveOp::Kind::kAllGather: return "allGather";
    case CollectiveOp::Kind::kReduceScatter: return "reduceScatter";
    case CollectiveOp::Kind::kAllReduce: return "allReduce";
  }
  return "?";
}

WorkHandle allOf(std::vector<WorkHandle> works) {
  if (works.size() == 1) return std::move(works.front());
  return std::make_unique<AllOfWork>(std::move(works));
}

StatusOr<WorkHandle> Comm::igroup(std::span<const CollectiveOp> ops) {
  std::vector<WorkHandle> works;
  works.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    const CollectiveOp& o = ops[i];
    StatusOr<WorkHandle> w = Status(StatusCode::kInternal, "unset");
    switch (o.kind) {
      case CollectiveOp::Kind::kAllGather:
        w = iallGather(o.send, o.recv, o.count, o.dtype);
        break;
      case CollectiveOp::Kind::kReduceScatter:
        w = ireduceScatter(o.send, o.recv, o.count, o.dtype, o.op);
        break;
      case CollectiveOp::Kind::kAllReduce:
        w = iallReduce(o.recv, o.count, o.dtype, o.op);
        break;
    }
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

WorkHandle completedWork(Status status) {
  return std::make_unique<CompletedWork>(std::move(status));
}

StatusOr<WorkHandle> Comm::iallGather(const void* send, void* recv, size_t count, DType dtype) {
  HSDP_RETURN_IF_ERROR(allGather(send, recv, count, dtype));
  return completedWork();
}

StatusOr<WorkHandle> Comm::ireduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                          RedOp op) {
  HSDP_RETURN_IF_ERROR(reduceScatter(send, recv, count, dtype, op));
  return completedWork();
}

StatusOr<WorkHandle> Comm::iallReduce(void* buf, size_t count, DType dtype, RedOp op) {
  HSDP_RETURN_IF_ERROR(allReduce(buf, count, dtype, op));
  return completedWork();
}

}  // namespace hsdp
