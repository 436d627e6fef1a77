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

}  // namespace

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
