// The collectives of the CUDA memory space (core/memory_space.h: SpaceCollectives) and the
// space's registration as "cuda": this file builds the bundle, the CUDA memory, step kernels and
// host copies of cuda/cuda_space.h plus the NCCL collectives below, which need NcclComm and so
// live beside the transport (the NCCL module may use cuda/; cuda/ may not use it).
//
// Collectives run on the NCCL communicators' role streams; each bound communicator waits for its
// lane's queued work before a collective (NcclComm::setCallerStream), and a lane that needs a
// collective's result waits for an event recorded on the role stream right after the collective
// was enqueued, so the host runs ahead.
#include <cuda_runtime.h>

#include <deque>
#include <string_view>
#include <vector>

#include "collectives/nccl/cuda_check.h"
#include "collectives/nccl/cuda_resources.h"
#include "cuda/cuda_space.h"
#include "hsdp/log.h"
#include "hsdp/nccl.h"

namespace hsdp::nccl {
namespace {

// Collectives reached but not yet seen complete; beyond this many the oldest is waited for
// (the host falls that far behind only if nothing ever polls).
constexpr size_t kMaxInflight = 4096;

// A collective of a bound NCCL communicator plus an event recorded on its role stream right
// after the enqueue: what a lane waits on to consume the result.
class DeviceWork final : public Work {
 public:
  DeviceWork(WorkHandle inner, gpu::Event done)
      : inner_(std::move(inner)), done_(std::move(done)) {}
  Status wait() override { return inner_->wait(); }
  StatusOr<bool> test() override { return inner_->test(); }
  cudaEvent_t event() const { return done_.get(); }
  gpu::Event takeEvent() { return std::move(done_); }

 private:
  WorkHandle inner_;
  gpu::Event done_;
};

class NcclSpaceCollectives final : public SpaceCollectives {
 public:
  explicit NcclSpaceCollectives(gpu::CudaSpace& space) : space_(space) {
    // The communicators bound to the compute lane follow the user's compute stream.
    space_.onComputeStream([this](cudaStream_t compute) {
      for (const Bound& b : bound_)
        if (b.lane == Lane::kCompute) b.comm->setCallerStream(compute);
    });
  }

  ~NcclSpaceCollectives() override {
    space_.onComputeStream(nullptr);
    // The communicators outlive the engine (the mesh does); their caller streams must not point
    // at the space's reduce stream, which dies with the space.
    for (const Bound& b : bound_) b.comm->setCallerStream(nullptr);
  }

  Status bindComm(Comm& comm, Lane lane, const char* role) override {
    auto* nccl = dynamic_cast<NcclComm*>(&comm);
    if (nccl == nullptr || std::string_view(comm.transportName()) != "nccl")
      return invalidArgument("Device::kCuda: the mesh's ", role, " communicator runs on '",
                             comm.transportName(),
                             "', not nccl; build the mesh over an NCCL world "
                             "(hsdp::nccl::createNcclComm, hsdp/nccl.h)");
    if (nccl->device() != space_.device())
      return invalidArgument("Device::kCuda: the mesh's ", role, " communicator is on CUDA device ",
                             nccl->device(), " but the engine was created on device ",
                             space_.device(),
                             " (make the communicator's device current before create())");
    for (const Bound& b : bound_)
      if (b.comm == nccl && b.lane != lane)
        return internalError("the ", role, " communicator is bound to two lanes");
    nccl->setCallerStream(space_.stream(lane));
    bound_.push_back({nccl, lane});
    return okStatus();
  }

  StatusOr<WorkHandle> iallGather(Comm& comm, const void* send, void* recv, size_t count,
                                  DType dtype) override {
    HSDP_ASSIGN_OR_RETURN(NcclComm * nccl, boundComm(comm, "all-gather"));
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(space_.device()));
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, comm.iallGather(send, recv, count, dtype));
    return track(std::move(w), nccl->stream(StreamRole::kAllGather));
  }

  StatusOr<WorkHandle> ireduceScatter(Comm& comm, const void* send, void* recv, size_t count,
                                      DType dtype, RedOp op) override {
    HSDP_ASSIGN_OR_RETURN(NcclComm * nccl, boundComm(comm, "reduce-scatter"));
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(space_.device()));
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, comm.ireduceScatter(send, recv, count, dtype, op));
    return track(std::move(w), nccl->stream(StreamRole::kReduceScatter));
  }

  StatusOr<WorkHandle> iallReduce(Comm& comm, void* buf, size_t count, DType dtype,
                                  RedOp op) override {
    HSDP_ASSIGN_OR_RETURN(NcclComm * nccl, boundComm(comm, "all-reduce"));
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(space_.device()));
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, comm.iallReduce(buf, count, dtype, op));
    return track(std::move(w), nccl->stream(StreamRole::kAllReduce));
  }

  StatusOr<WorkHandle> igroup(Comm& comm, std::span<const CollectiveOp> ops) override {
    HSDP_ASSIGN_OR_RETURN(NcclComm * nccl, boundComm(comm, "group"));
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(space_.device()));
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, comm.igroup(ops));
    // The group ran on its first operation's role stream (NcclComm::igroup).
    const StreamRole role = ops.empty() ? StreamRole::kAllGather : streamRoleOf(ops.front().kind);
    return track(std::move(w), nccl->stream(role));
  }

  StatusOr<bool> reached(WorkHandle& w, Lane lane, bool block, bool exposed) override {
    if (w == nullptr) return true;
    auto* dw = dynamic_cast<DeviceWork*>(w.get());
    if (dw == nullptr) return internalError("CUDA memory space: a collective it did not start");
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard g, gpu::DeviceGuard::set(space_.device()));
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(space_.stream(lane), dw->event(), 0));
    // Kept until it completes, so an NCCL error or timeout still surfaces (poll()).
    inflight_.push_back(std::move(w));
    HSDP_RETURN_IF_ERROR(poll());
    return true;
  }

  Status poll() override {
    while (!inflight_.empty()) {
      WorkHandle& front = inflight_.front();
      bool done = false;
      if (inflight_.size() > kMaxInflight) {
        HSDP_RETURN_IF_ERROR(front->wait());
        done = true;
      } else {
        HSDP_ASSIGN_OR_RETURN(done, front->test());
      }
      if (!done) break;
      // The collective completed, and our event was recorded right after it on the same
      // stream, so the event is free for reuse (a re-record does not disturb earlier waits).
      free_events_.push_back(static_cast<DeviceWork*>(front.get())->takeEvent());
      inflight_.pop_front();
    }
    return okStatus();
  }

 private:
  struct Bound {
    NcclComm* comm;
    Lane lane;
  };

  StatusOr<NcclComm*> boundComm(Comm& comm, const char* op) const {
    for (const Bound& b : bound_)
      if (b.comm == &comm) return b.comm;
    return internalError("CUDA memory space: ", op, " on a communicator that was not bound");
  }

  // Wraps a just-enqueued collective with an event recorded after it on its role stream.
  StatusOr<WorkHandle> track(WorkHandle w, cudaStream_t role_stream) {
    gpu::Event e;
    if (!free_events_.empty()) {
      e = std::move(free_events_.back());
      free_events_.pop_back();
    } else {
      HSDP_ASSIGN_OR_RETURN(e, gpu::Event::create());
    }
    HSDP_CUDA_CHECK(cudaEventRecord(e.get(), role_stream));
    return WorkHandle(std::make_unique<DeviceWork>(std::move(w), std::move(e)));
  }

  gpu::CudaSpace& space_;
  std::vector<Bound> bound_;
  std::deque<WorkHandle> inflight_;
  // Why: each tracked collective needs an event of its own (several are in flight at once, on
  // different role streams); events of completed ones are reused, so none is created per step.
  std::vector<gpu::Event> free_events_;
};

// The bundle on the device current now. The kernels sum the norm through the collectives.
StatusOr<SpaceBundle> createCudaBundle(void* compute) {
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<gpu::CudaSpace> space,
                        gpu::CudaSpace::create(static_cast<cudaStream_t>(compute)));
  SpaceBundle b;
  b.collectives = std::make_unique<NcclSpaceCollectives>(*space);
  HSDP_ASSIGN_OR_RETURN(b.kernels, gpu::createCudaStepKernels(*space, *b.collectives));
  HSDP_ASSIGN_OR_RETURN(b.host_copies, gpu::createCudaHostCopies(*space));
  HSDP_INFO(kShard, "engine on CUDA device ", space->device(), " (compute stream ", compute, ")");
  b.memory = std::move(space);
  return b;
}

}  // namespace
}  // namespace hsdp::nccl

namespace hsdp::modules {
// Called once by the generated module list (cmake/HsdpModules.cmake).
void registerCudaMemorySpace() { registerMemorySpace("cuda", nccl::createCudaBundle); }
}  // namespace hsdp::modules
