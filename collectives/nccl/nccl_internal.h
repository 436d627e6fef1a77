// Private to collectives/nccl/: what the NCCL transport's files share. The communicator's state
// (NcclComm::State: the NCCL communicator, its role streams, events, timeout and abort), the Work
// of a collective in flight, and the launch every collective goes through. nccl_create.cc makes
// communicators (creation and splits), nccl_comm.cc runs the collectives.
#pragma once

#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/nccl/cuda_check.h"
#include "collectives/nccl/cuda_resources.h"
#include "collectives/nccl/nccl_check.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/log.h"
#include "hsdp/nccl.h"

namespace hsdp::nccl {

using Clock = std::chrono::steady_clock;

constexpr int kNumRoles = 4;

// Polling with back-off: the first rounds only yield (a collective that is about to finish
// should not pay a sleep), later ones sleep so that a rank waiting on a slow peer leaves the
// CPU to the others (several ranks share a host's cores).
inline void backoff(int round) {
  if (round < 64)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(round < 1024 ? 10 : 100));
}

inline ncclConfig_t nonblockingConfig(const std::string& name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // no NCCL call may hang the host: we poll, time out and abort instead
  config.commName = name.c_str();
  return config;
}

// ---- state -------------------------------------------------------------------------------------

struct NcclComm::State {
  std::unique_ptr<Comm> bootstrap;
  NcclOptions options;
  std::string name;  // "world", "split(c)", "host(c)": in NCCL's logs and our messages
  int rank = 0;
  int size = 1;
  int device = 0;
  ncclComm_t comm = nullptr;
  std::array<gpu::Stream, kNumRoles> streams;
  gpu::Event caller_ready;        // recorded on the caller's stream before each collective
  cudaStream_t caller = nullptr;  // nullptr: the legacy default stream
  std::vector<gpu::Event> free_events;
  gpu::DeviceBuffer barrier_word;  // barrier(): one int32 all-reduced on the control stream
  uint64_t seq = 0;                // collectives started, for messages
  bool aborted = false;
  Status abort_reason;

  ~State() { finalize(); }

  std::string describe() const {
    return strCat("nccl comm '", name, "' (rank ", rank, " of ", size, ", device ", device, ")");
  }

  cudaStream_t stream(StreamRole role) const { return streams[static_cast<int>(role)].get(); }

  // Past this communicator's timeout. While the watchdog runs with a timeout no longer than
  // ours, it ends the job first, naming the ranks that did not arrive (hsdp/watchdog.h): then
  // NCCL's wait goes on until it does.
  bool expired(Clock::time_point start) const {
    if (options.timeout_s <= 0) return false;
    if (watchdog::running() && *watchdog::config().timeout_s <= options.timeout_s) return false;
    return std::chrono::duration<double>(Clock::now() - start).count() > options.timeout_s;
  }

  // Aborts the NCCL communicator once; later calls fail with the first reason.
  void abortNow(const Status& reason) {
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    if (comm != nullptr) {
      HSDP_WARN(kColl, describe(), ": aborting the NCCL communicator: ", reason.message());
      ncclResult_t rc = ncclCommAbort(comm);  // blocking, also for nonblocking communicators
      if (rc != ncclSuccess)
        HSDP_WARN(kColl, describe(), ": ncclCommAbort: ", ncclGetErrorString(rc));
      comm = nullptr;
    }
  }

  Status usable(const char* op) const {
    if (!aborted && comm != nullptr) return okStatus();
    return failedPrecondition(describe(), ": ", op,
                              " on an aborted communicator (first error: ", abort_reason.message(),
                              ")");
  }

  // Aborts and returns the Status for a failure of collective `op` (#seq).
  Status fail(const char* op, uint64_t seq_no, const std::string& what) {
    Status s = internalError("nccl ", op, " #", seq_no, " on ", describe(), ": ", what,
                             "; the communicator was aborted");
    abortNow(s);
    return s;
  }

  // Non-OK when `c` (this communicator or one being created) reports an asynchronous error.
  // ncclInProgress is not an error.
  Status asyncError(ncclComm_t c, const char* op, uint64_t seq_no, bool* in_progress) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(c, &async);
    if (rc != ncclSuccess)
      return internalError("nccl ", op, " #", seq_no, " on ", describe(),
                           ": ncclCommGetAsyncError failed: ", ncclMessage(rc, c));
    if (in_progress) *in_progress = async == ncclInProgress;
    if (async == ncclSuccess || async == ncclInProgress) return okStatus();
    return internalError("NCCL error ", static_cast<int>(async), ": ", ncclMessage(async, c));
  }

  // Waits until `c` has left ncclInProgress (after an init, a split, an enqueue or a finalize
  // on a nonblocking communicator), polling for errors; aborts `c` on an error or a timeout.
  Status waitReady(ncclComm_t c, const char* op, uint64_t seq_no, Clock::time_point start) {
    watchdog::WaitScope wait("nccl", op);
    for (int round = 0;; ++round) {
      bool in_progress = false;
      Status s = asyncError(c, op, seq_no, &in_progress);
      if (!s.ok()) return c == comm ? fail(op, seq_no, s.message()) : s;
      if (!in_progress) return okStatus();
      if (expired(start)) {
        std::string what =
            strCat("still in progress after ", options.timeout_s,
                   " s (NcclOptions::timeout_s, HSDP_TIMEOUT_S): a peer did not take part or died");
        if (c == comm) return fail(op, seq_no, what);
        return internalError("nccl ", op, " on ", describe(), ": ", what);
      }
      backoff(round);
    }
  }

  // The result of launching a collective on the nonblocking communicator: ncclInProgress waits
  // until the work is on the stream (recording the completion event earlier would record it
  // before the collective); any error aborts. Even an invalid argument does: on a nonblocking
  // communicator NCCL records it as the communicator's asynchronous error, so every later call
  // would fail too. (checkCall rejects what NCCL would, first, and leaves the communicator usable.)
  Status enqueued(ncclResult_t rc, const char* op, uint64_t seq_no, Clock::time_point start) {
    if (rc == ncclSuccess) return okStatus();
    if (rc == ncclInProgress) return waitReady(comm, op, seq_no, start);
    return fail(op, seq_no, ncclMessage(rc, comm));
  }

  // Collective buffers must be device (or managed) memory of our device.
  Status checkBuffer(const void* p, const char* which, const char* op) const {
    Status s = gpu::checkDevicePointer(p, device);
    if (s.ok()) return s;
    return invalidArgument("nccl ", op, " on ", describe(), ": ", which, " buffer ", s.message(),
                           "; the NCCL transport moves device buffers of its device only");
  }

  // Everything NCCL would reject about one call's buffers (Comm::checkArgs; inside a group a
  // rejected call would fail the whole group at ncclGroupEnd).
  Status checkCall(const CallArgs& a) const {
    HSDP_RETURN_IF_ERROR(usable(a.what));
    if (a.count == 0) return okStatus();
    if (a.send == nullptr) return checkBuffer(a.recv, "in-place", a.what);
    HSDP_RETURN_IF_ERROR(checkBuffer(a.send, "send", a.what));
    return checkBuffer(a.recv, "recv", a.what);
  }

  StatusOr<gpu::Event> takeEvent() {
    if (!free_events.empty()) {
      gpu::Event e = std::move(free_events.back());
      free_events.pop_back();
      return e;
    }
    return gpu::Event::create();
  }

  // Orders the role stream after the work already queued on the caller's stream.
  Status orderAfterCaller(cudaStream_t role_stream) {
    HSDP_CUDA_CHECK(cudaEventRecord(caller_ready.get(), caller));
    HSDP_CUDA_CHECK(cudaStreamWaitEvent(role_stream, caller_ready.get(), 0));
    return okStatus();
  }

  void finalize() {
    if (comm == nullptr || aborted) return;
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device &&
                          cudaSetDevice(device) == cudaSuccess;
    // Finalize flushes what was issued; nonblocking, so it is waited for like everything else,
    // and a peer that never finalizes costs at most the timeout (then abort).
    const auto start = Clock::now();
    ncclResult_t rc = ncclCommFinalize(comm);
    Status s = rc == ncclSuccess || rc == ncclInProgress
                   ? waitReady(comm, "finalize", seq, start)
                   : internalError("ncclCommFinalize: ", ncclMessage(rc, comm));
    if (!s.ok()) {
      abortNow(s);
    } else {
      rc = ncclCommDestroy(comm);
      if (rc != ncclSuccess)
        HSDP_WARN(kColl, describe(), ": ncclCommDestroy: ", ncclGetErrorString(rc));
      comm = nullptr;
    }
    if (switched) (void)cudaSetDevice(previous);
  }
};

// A collective in flight: completes when its event on the role stream has fired. test() and
// wait() also poll the communicator for asynchronous errors and enforce the timeout.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclComm::State> s, const char* op, uint64_t seq, gpu::Event done,
           Clock::time_point start, const CommTrace* trace)
      : s_(std::move(s)),
        op_(op),
        seq_(seq),
        done_event_(std::move(done)),
        start_(start),
        trace_(trace),
        trace_seq_(trace ? trace->entered() : 0) {}

  ~NcclWork() override {
    // Reuse the event unless the collective may still be running (abandoned) or the
    // communicator was aborted.
    if (finished_ && !s_->aborted) s_->free_events.push_back(std::move(done_event_));
  }

  StatusOr<bool> test() override {
    if (!finished_) poll();
    if (!finished_) return false;
    if (!result_.ok()) return result_;
    return true;
  }

  Status wait() override {
    watchdog::CommWait watched(trace_, trace_seq_, "nccl wait");
    for (int round = 0; !finished_; ++round) {
      poll();
      if (!finished_) backoff(round);
    }
    return result_;
  }

 private:
  void finish(Status s) {
    finished_ = true;
    result_ = std::move(s);
  }

  void poll() {
    NcclComm::State& s = *s_;
    if (s.aborted) {
      finish(s.usable(op_));
      return;
    }
    cudaError_t err = cudaEventQuery(done_event_.get());
    // Why: cudaErrorNotReady is recorded as this thread's last runtime error like any other, so
    // the next kernel launcher's HSDP_CUDA_CHECK(cudaGetLastError()) (cuda/kernels.h, the GPU
    // example's kernels) would report "device not ready" and fail the step. Clear it here (it
    // is not sticky; a real fault still surfaces from the calls that follow).
    if (err == cudaErrorNotReady) (void)cudaGetLastError();
    if (err != cudaSuccess && err != cudaErrorNotReady) {
      finish(s.fail(op_, seq_,
                    strCat("CUDA error while waiting: ", cudaGetErrorName(err), " (",
                           cudaGetErrorString(err), ")")));
      return;
    }
    Status async = s.asyncError(s.comm, op_, seq_, nullptr);
    if (!async.ok()) {
      finish(s.fail(op_, seq_, async.message()));
      return;
    }
    if (err == cudaSuccess) {
      finish(okStatus());
      return;
    }
    if (s.expired(start_))
      finish(s.fail(
          op_, seq_,
          strCat("did not complete within ", s.options.timeout_s,
                 " s (NcclOptions::timeout_s, HSDP_TIMEOUT_S): another rank did not start the same "
                 "collective (every rank must start the same collectives in the same "
                 "order, with the same counts), or a peer died")));
  }

  std::shared_ptr<NcclComm::State> s_;
  const char* op_;
  uint64_t seq_;
  gpu::Event done_event_;
  Clock::time_point start_;
  const CommTrace* trace_;  // the communicator's, for the watchdog's report of a wait on it
  uint64_t trace_seq_;
  bool finished_ = false;
  Status result_;
};

// Creates the CUDA side of a communicator on `device`: role streams and the ordering event.
Status createCudaResources(NcclComm::State& s);

// Everything a collective does around its NCCL call: checks, the device, ordering after the
// caller's stream, the enqueue (waiting out ncclInProgress) and the completion event.
template <typename Launch>
inline StatusOr<WorkHandle> launchCollective(const std::shared_ptr<NcclComm::State>& sp,
                                             const CommTrace* trace, const char* op,
                                             StreamRole role, Launch launch) {
  NcclComm::State& s = *sp;
  HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard guard, gpu::DeviceGuard::set(s.device));
  const cudaStream_t stream = s.stream(role);
  HSDP_ASSIGN_OR_RETURN(gpu::Event done, s.takeEvent());
  HSDP_RETURN_IF_ERROR(s.orderAfterCaller(stream));
  const auto start = Clock::now();
  const uint64_t seq_no = s.seq++;
  HSDP_RETURN_IF_ERROR(s.enqueued(launch(stream), op, seq_no, start));
  HSDP_CUDA_CHECK(cudaEventRecord(done.get(), stream));
  HSDP_TRACE(kColl, s.describe(), ": ", op, " #", seq_no, " on stream ",
             s.streams[static_cast<int>(role)].name());
  return WorkHandle(std::make_unique<NcclWork>(sp, op, seq_no, std::move(done), start, trace));
}

}  // namespace hsdp::nccl
