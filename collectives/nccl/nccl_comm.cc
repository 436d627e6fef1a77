#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/nccl/nccl_check.h"
#include "core/watchdog.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_resources.h"
#include "hsdp/env.h"
#include "hsdp/log.h"
#include "hsdp/nccl.h"
#include "hsdp/transport_registry.h"

namespace hsdp::nccl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kNumRoles = 4;

// Polling with back-off: the first rounds only yield (a collective that is about to finish
// should not pay a sleep), later ones sleep so that a rank waiting on a slow peer leaves the
// CPU to the others (several ranks share a host's cores).
void backoff(int round) {
  if (round < 64)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(round < 1024 ? 10 : 100));
}

ncclConfig_t nonblockingConfig(const std::string& name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // no NCCL call may hang the host: we poll, time out and abort instead
  config.commName = name.c_str();
  return config;
}

}  // namespace

const char* streamRoleName(StreamRole role) {
  switch (role) {
    case StreamRole::kAllGather:
      return "allgather";
    case StreamRole::kReduceScatter:
      return "reducescatter";
    case StreamRole::kAllReduce:
      return "allreduce";
    case StreamRole::kControl:
      return "control";
  }
  return "?";
}

StreamRole streamRoleOf(CollectiveOp::Kind kind) {
  switch (kind) {
    case CollectiveOp::Kind::kAllGather:
      return StreamRole::kAllGather;
    case CollectiveOp::Kind::kReduceScatter:
      return StreamRole::kReduceScatter;
    case CollectiveOp::Kind::kAllReduce:
      return StreamRole::kAllReduce;
  }
  return StreamRole::kControl;
}

StatusOr<NcclOptions> NcclOptions::fromEnv() {
  NcclOptions o;
  HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> device, env::getInt("HSDP_CUDA_DEVICE"));
  if (device) o.device = static_cast<int>(*device);
  // HSDP_TIMEOUT_S, the timeout of every transport (or its old name, HSDP_NCCL_TIMEOUT_S).
  HSDP_ASSIGN_OR_RETURN(watchdog::Config wd, watchdog::resolveConfig({}));
  o.timeout_s = std::isfinite(*wd.timeout_s) ? *wd.timeout_s : 0;
  return o;
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

namespace {

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
Status createCudaResources(NcclComm::State& s) {
  for (int r = 0; r < kNumRoles; ++r) {
    HSDP_ASSIGN_OR_RETURN(s.streams[r],
                          gpu::Stream::create(strCat("nccl-", s.name, "-",
                                                     streamRoleName(static_cast<StreamRole>(r)))));
  }
  HSDP_ASSIGN_OR_RETURN(s.caller_ready, gpu::Event::create());
  return okStatus();
}

}  // namespace

// ---- creation ----------------------------------------------------------------------------------

NcclComm::NcclComm(std::shared_ptr<State> state) : s_(std::move(state)) {}
NcclComm::~NcclComm() = default;

StatusOr<std::unique_ptr<NcclComm>> NcclComm::create(std::unique_ptr<Comm> bootstrap,
                                                     const NcclOptions& options) {
  if (bootstrap == nullptr) return invalidArgument("createNcclComm: no bootstrap communicator");
  auto s = std::make_shared<State>();
  s->options = options;
  s->name = "world";
  s->rank = bootstrap->rank();
  s->size = bootstrap->size();
  Comm& boot = *bootstrap;
  s->bootstrap = std::move(bootstrap);

  // 1. The device and its streams. The host group is needed only for the default device choice,
  //    but splitByHost is collective, so every rank takes it.
  int local_rank = 0;
  {
    HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> host, boot.splitByHost());
    local_rank = host->rank();
  }
  Status local = [&]() -> Status {
    std::string why;
    const int count = gpu::deviceCount(&why);
    if (count == 0) return failedPrecondition("no CUDA device visible (", why, ")");
    if (options.device >= count)
      return invalidArgument("HSDP_CUDA_DEVICE=", options.device, " but only ", count,
                             " CUDA device(s) are visible");
    s->device = options.device >= 0 ? options.device : local_rank % count;
    HSDP_CUDA_CHECK(cudaSetDevice(s->device));
    return createCudaResources(*s);
  }();
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(boot, local, strCat("nccl: CUDA set-up of rank ", s->rank)));

  // 2. The unique id, made by rank 0 and broadcast over the bootstrap.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  Status made = okStatus();
  if (s->rank == 0)
    made = [&]() -> Status {
      HSDP_NCCL_CHECK(ncclGetUniqueId(&id));
      return okStatus();
    }();
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(boot, made, "nccl: ncclGetUniqueId on rank 0"));
  HSDP_RETURN_IF_ERROR(boot.broadcast(&id, sizeof(id), DType::kUInt8, 0));

  // 3. Every rank joins; nonblocking, so a missing peer ends in a timeout, not a hang.
  const auto start = Clock::now();
  ncclConfig_t config = nonblockingConfig(s->name);
  ncclResult_t rc = ncclCommInitRankConfig(&s->comm, s->size, id, s->rank, &config);
  Status joined = okStatus();
  if (rc != ncclSuccess && rc != ncclInProgress)
    joined = ncclFailure(rc, "ncclCommInitRankConfig", __FILE__, __LINE__, s->comm);
  else
    joined = s->waitReady(s->comm, "ncclCommInitRankConfig", 0, start);
  if (!joined.ok()) s->abortNow(joined);
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(boot, joined, strCat("nccl: joining ", s->describe())));
  HSDP_INFO(kColl, s->describe(), " created (",
            std::chrono::duration<double>(Clock::now() - start).count(), " s); timeout ",
            options.timeout_s, " s");
  std::unique_ptr<NcclComm> comm(new NcclComm(std::move(s)));
  HSDP_RETURN_IF_ERROR(comm->traceOverBootstrap());
  return comm;
}

Status NcclComm::traceOverBootstrap() {
  HSDP_ASSIGN_OR_RETURN(trace_, traceOver(*s_->bootstrap));
  return okStatus();
}

StatusOr<std::unique_ptr<Comm>> createNcclComm(std::unique_ptr<Comm> bootstrap,
                                               const NcclOptions& options) {
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> c,
                        NcclComm::create(std::move(bootstrap), options));
  return std::unique_ptr<Comm>(std::move(c));
}

StatusOr<std::unique_ptr<Comm>> createNcclComm(std::unique_ptr<Comm> bootstrap) {
  HSDP_ASSIGN_OR_RETURN(NcclOptions options, NcclOptions::fromEnv());
  return createNcclComm(std::move(bootstrap), options);
}

StatusOr<std::unique_ptr<Comm>> createNcclComm(Comm& bootstrap) {
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> own, bootstrap.split(0, bootstrap.rank()));
  return createNcclComm(std::move(own));
}

// ---- splits ------------------------------------------------------------------------------------

namespace {

// ncclCommSplit of `parent` into the group `sub_boot` already formed on the bootstrap side. The
// NCCL key is the rank in `sub_boot`, so both sides order the members identically.
StatusOr<std::shared_ptr<NcclComm::State>> splitInto(NcclComm::State& parent,
                                                     std::unique_ptr<Comm> sub_boot, int color,
                                                     std::string name) {
  auto s = std::make_shared<NcclComm::State>();
  s->options = parent.options;
  s->name = std::move(name);
  s->rank = sub_boot->rank();
  s->size = sub_boot->size();
  s->device = parent.device;
  Comm& boot = *sub_boot;
  s->bootstrap = std::move(sub_boot);

  Status local = [&]() -> Status {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard guard, gpu::DeviceGuard::set(s->device));
    HSDP_RETURN_IF_ERROR(createCudaResources(*s));
    const auto start = Clock::now();
    const uint64_t seq_no = parent.seq++;
    ncclConfig_t config = nonblockingConfig(s->name);
    ncclResult_t rc = ncclCommSplit(parent.comm, color, s->rank, &s->comm, &config);
    if (rc != ncclSuccess && rc != ncclInProgress)
      return parent.fail("ncclCommSplit", seq_no, ncclMessage(rc, parent.comm));
    // The parent is busy until the split is done, and the child until it is initialised.
    HSDP_RETURN_IF_ERROR(parent.waitReady(parent.comm, "ncclCommSplit", seq_no, start));
    if (s->comm == nullptr)
      return internalError("ncclCommSplit on ", parent.describe(), " returned no communicator");
    HSDP_RETURN_IF_ERROR(s->waitReady(s->comm, "ncclCommSplit", seq_no, start));
    int nccl_rank = -1, nccl_size = -1;
    HSDP_NCCL_CHECK(ncclCommUserRank(s->comm, &nccl_rank));
    HSDP_NCCL_CHECK(ncclCommCount(s->comm, &nccl_size));
    if (nccl_rank != s->rank || nccl_size != s->size)
      return internalError("ncclCommSplit gave rank ", nccl_rank, " of ", nccl_size,
                           ", the bootstrap's split rank ", s->rank, " of ", s->size);
    return okStatus();
  }();
  if (!local.ok()) s->abortNow(local);
  HSDP_RETURN_IF_ERROR(agreeOnSuccess(
      boot, local, strCat("nccl: splitting ", parent.describe(), " into '", s->name, "'")));
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<Comm>> NcclComm::split(int color, int key) {
  State& s = *s_;
  HSDP_RETURN_IF_ERROR(s.usable("split"));
  if (color < 0) return invalidArgument("split: color ", color, " must be >= 0");
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> sub, s.bootstrap->split(color, key));
  HSDP_ASSIGN_OR_RETURN(std::shared_ptr<State> child,
                        splitInto(s, std::move(sub), color, strCat(s.name, "/", color)));
  std::unique_ptr<NcclComm> comm(new NcclComm(std::move(child)));
  HSDP_RETURN_IF_ERROR(comm->traceOverBootstrap());
  return std::unique_ptr<Comm>(std::move(comm));
}

StatusOr<std::unique_ptr<Comm>> NcclComm::splitByHost() {
  State& s = *s_;
  HSDP_RETURN_IF_ERROR(s.usable("splitByHost"));
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> sub, s.bootstrap->splitByHost());
  // One color per host: the rank (in this communicator) of the host group's first member.
  int32_t color = s.rank;
  HSDP_RETURN_IF_ERROR(sub->broadcast(&color, 1, DType::kInt32, 0));
  HSDP_ASSIGN_OR_RETURN(std::shared_ptr<State> child,
                        splitInto(s, std::move(sub), color, strCat(s.name, "/host", color)));
  std::unique_ptr<NcclComm> comm(new NcclComm(std::move(child)));
  HSDP_RETURN_IF_ERROR(comm->traceOverBootstrap());
  return std::unique_ptr<Comm>(std::move(comm));
}

// ---- collectives -------------------------------------------------------------------------------

namespace {

// Everything a collective does around its NCCL call: checks, the device, ordering after the
// caller's stream, the enqueue (waiting out ncclInProgress) and the completion event.
template <typename Launch>
StatusOr<WorkHandle> launchCollective(const std::shared_ptr<NcclComm::State>& sp,
                                      const CommTrace* trace, const char* op, StreamRole role,
                                      Launch launch) {
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

}  // namespace

namespace {

ncclRedOp_t ncclOp(RedOp op) { return op == RedOp::kAvg ? ncclAvg : ncclSum; }

// One collective onto `stream` (arguments already checked by State::checkCall).
ncclResult_t launch(const CollectiveOp& o, ncclComm_t comm, cudaStream_t stream) {
  switch (o.kind) {
    case CollectiveOp::Kind::kAllGather:
      return ncclAllGather(o.send, o.recv, o.count, ncclType(o.dtype), comm, stream);
    case CollectiveOp::Kind::kReduceScatter:
      return ncclReduceScatter(o.send, o.recv, o.count, ncclType(o.dtype), ncclOp(o.op), comm,
                               stream);
    case CollectiveOp::Kind::kAllReduce:
      return ncclAllReduce(o.recv, o.recv, o.count, ncclType(o.dtype), ncclOp(o.op), comm, stream);
  }
  return ncclInvalidArgument;
}

// NCCL's limit on the operations between one ncclGroupStart and its ncclGroupEnd.
constexpr size_t kMaxGroupOps = 2048;

}  // namespace

Status NcclComm::checkArgs(const CallArgs& args) const { return s_->checkCall(args); }

StatusOr<WorkHandle> NcclComm::startOne(const CollectiveOp& o) {
  if (o.count == 0) return completedWork();
  State& s = *s_;
  return launchCollective(s_, trace(), collectiveKindName(o.kind), streamRoleOf(o.kind),
                          [&](cudaStream_t st) { return launch(o, s.comm, st); });
}

StatusOr<WorkHandle> NcclComm::startAllGather(const void* send, void* recv, size_t count,
                                              DType dtype) {
  return startOne(CollectiveOp::allGather(send, recv, count, dtype));
}

StatusOr<WorkHandle> NcclComm::startReduceScatter(const void* send, void* recv, size_t count,
                                                  DType dtype, RedOp op) {
  return startOne(CollectiveOp::reduceScatter(send, recv, count, dtype, op));
}

StatusOr<WorkHandle> NcclComm::startAllReduce(void* buf, size_t count, DType dtype, RedOp op) {
  return startOne(CollectiveOp::allReduce(buf, count, dtype, op));
}

StatusOr<WorkHandle> NcclComm::startReduceScatterRuns(const void*, void*, const BlockRuns&, DType,
                                                      RedOp, void*) {
  return unimplemented(
      "the 'nccl' transport has no reduce-scatter of non-contiguous blocks "
      "(device buffers): pack them and call ireduceScatter");
}

StatusOr<WorkHandle> NcclComm::startAllGatherRuns(const void* send, void* recv,
                                                  const BlockRuns& layout, DType dtype, void*) {
  State& s = *s_;
  const size_t n = layout.run, es = dtypeSize(dtype), block = layout.blockCount();
  if (block == 0) return completedWork();
  // One send and one receive per run and peer, in one group (NCCL matches a pair's sends and
  // receives in the order they were posted).
  if (2 * static_cast<size_t>(s.size - 1) * layout.runs > kMaxGroupOps)
    return unimplemented("nccl iallGatherRuns: ", layout.runs, " runs to ", s.size - 1,
                         " peers exceed the ", kMaxGroupOps, " operations of one NCCL group");
  auto* out = static_cast<char*>(recv);
  const auto* in = static_cast<const char*>(send);
  const size_t me = static_cast<size_t>(s.rank);
  const bool in_place = in == out + layout.offset(me, 0) * es;
  return launchCollective(
      s_, trace(), "allGatherRuns", StreamRole::kAllGather, [&](cudaStream_t st) {
        // Our own block to its runs first, on the same stream (device to device).
        for (size_t p = 0; p < layout.runs && !in_place; ++p)
          if (cudaMemcpyAsync(out + layout.offset(me, p) * es, in + p * n * es, n * es,
                              cudaMemcpyDeviceToDevice, st) != cudaSuccess)
            return ncclUnhandledCudaError;
        // Why send from our runs: in place, the block is not contiguous in `send`.
        auto mine = [&](size_t p) {
          return in_place ? out + layout.offset(me, p) * es : in + p * n * es;
        };
        ncclResult_t rc = ncclGroupStart();
        if (rc != ncclSuccess) return rc;
        ncclResult_t first = ncclSuccess;
        for (int q = 0; q < s.size; ++q) {
          if (q == s.rank) continue;
          for (size_t p = 0; p < layout.runs; ++p)
            for (ncclResult_t r : {ncclSend(mine(p), n, ncclType(dtype), q, s.comm, st),
                                   ncclRecv(out + layout.offset(static_cast<size_t>(q), p) * es, n,
                                            ncclType(dtype), q, s.comm, st)})
              if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
        }
        // Closed even after a failed call (the group depth is per thread; see startGroup).
        const ncclResult_t end = ncclGroupEnd();
        return first != ncclSuccess ? first : end;
      });
}

StatusOr<WorkHandle> NcclComm::startAllToAll(const void* send, void* recv, size_t count,
                                             DType dtype) {
  State& s = *s_;
  if (count == 0) return completedWork();
  const size_t block = count * dtypeSize(dtype);
  return launchCollective(
      s_, trace(), "allToAll", StreamRole::kReduceScatter, [&](cudaStream_t st) {
        ncclResult_t rc = ncclGroupStart();
        if (rc != ncclSuccess) return rc;
        ncclResult_t first = ncclSuccess;
        for (int j = 0; j < s.size; ++j) {
          const auto* from = static_cast<const char*>(send) + static_cast<size_t>(j) * block;
          auto* to = static_cast<char*>(recv) + static_cast<size_t>(j) * block;
          for (ncclResult_t r : {ncclSend(from, count, ncclType(dtype), j, s.comm, st),
                                 ncclRecv(to, count, ncclType(dtype), j, s.comm, st)})
            if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
        }
        // Closed even after a failed call (the group depth is per thread; see startGroup).
        const ncclResult_t end = ncclGroupEnd();
        return first != ncclSuccess ? first : end;
      });
}

StatusOr<WorkHandle> NcclComm::startGroup(std::span<const CollectiveOp> ops) {
  State& s = *s_;
  HSDP_RETURN_IF_ERROR(s.usable("group"));
  size_t live = 0;
  for (const CollectiveOp& o : ops) live += o.count > 0 ? 1 : 0;
  if (live == 0) return completedWork();

  HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard guard, gpu::DeviceGuard::set(s.device));
  const StreamRole role = streamRoleOf(ops.front().kind);
  const cudaStream_t stream = s.stream(role);
  HSDP_ASSIGN_OR_RETURN(gpu::Event done, s.takeEvent());
  HSDP_RETURN_IF_ERROR(s.orderAfterCaller(stream));
  const auto start = Clock::now();
  const uint64_t seq_no = s.seq++;
  for (size_t b = 0; b < ops.size(); b += kMaxGroupOps) {
    const size_t e = std::min(ops.size(), b + kMaxGroupOps);
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess)
      return s.fail("group", seq_no, strCat("ncclGroupStart: ", ncclMessage(rc, s.comm)));
    ncclResult_t first = ncclSuccess;
    size_t first_at = 0;
    for (size_t i = b; i < e; ++i) {
      if (ops[i].count == 0) continue;
      ncclResult_t r = launch(ops[i], s.comm, stream);
      if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) {
        first = r;
        first_at = i;
      }
    }
    // Closed even after a failed call: the group depth is per thread, and an open group would
    // hold back every later NCCL call of this thread (other communicators' included).
    ncclResult_t end = ncclGroupEnd();
    // The arguments were checked, so a rejection now is unexpected; NCCL has recorded it as the
    // communicator's error (nothing of this group is launched) and the communicator is unusable
    // from now on, and earlier sub-groups may be in flight: abort.
    if (first != ncclSuccess)
      return s.fail(
          "group", seq_no,
          strCat("operation ", first_at, " of ", ops.size(), " (",
                 collectiveKindName(ops[first_at].kind), "): ", ncclMessage(first, s.comm)));
    if (end != ncclSuccess && end != ncclInProgress)
      return s.fail("group", seq_no, strCat("ncclGroupEnd: ", ncclMessage(end, s.comm)));
    // Nonblocking: the group may still be in progress; the next group (and the event below)
    // must come after it is on the stream.
    if (end == ncclInProgress) HSDP_RETURN_IF_ERROR(s.waitReady(s.comm, "group", seq_no, start));
  }
  // Why the event is recorded only now: inside a group NCCL enqueues nothing until ncclGroupEnd
  // (on more than one rank), so an event recorded after each call would fire before the
  // collectives ran.
  HSDP_CUDA_CHECK(cudaEventRecord(done.get(), stream));
  HSDP_TRACE(kColl, s.describe(), ": group #", seq_no, " of ", live, " operations on stream ",
             s.streams[static_cast<int>(role)].name());
  return WorkHandle(
      std::make_unique<NcclWork>(s_, "group", seq_no, std::move(done), start, trace()));
}

Status NcclComm::runBroadcast(void* buf, size_t count, DType dtype, int root) {
  State& s = *s_;
  if (count == 0) return okStatus();
  HSDP_ASSIGN_OR_RETURN(
      WorkHandle w,
      launchCollective(s_, trace(), "broadcast", StreamRole::kControl, [&](cudaStream_t st) {
        return ncclBroadcast(buf, buf, count, ncclType(dtype), root, s.comm, st);
      }));
  return w->wait();
}

Status NcclComm::runBarrier() {
  State& s = *s_;
  if (s.barrier_word.data() == nullptr) {
    HSDP_ASSIGN_OR_RETURN(gpu::DeviceGuard guard, gpu::DeviceGuard::set(s.device));
    HSDP_ASSIGN_OR_RETURN(s.barrier_word, gpu::DeviceBuffer::allocate(sizeof(int32_t)));
    HSDP_CUDA_CHECK(
        cudaMemsetAsync(s.barrier_word.data(), 0, sizeof(int32_t), s.stream(StreamRole::kControl)));
  }
  void* word = s.barrier_word.data();
  HSDP_ASSIGN_OR_RETURN(
      WorkHandle w,
      launchCollective(s_, trace(), "barrier", StreamRole::kControl, [&](cudaStream_t st) {
        return ncclAllReduce(word, word, 1, ncclInt32, ncclSum, s.comm, st);
      }));
  return w->wait();
}

// ---- the rest ----------------------------------------------------------------------------------

int NcclComm::rank() const { return s_->rank; }
int NcclComm::size() const { return s_->size; }
int NcclComm::device() const { return s_->device; }
cudaStream_t NcclComm::stream(StreamRole role) const { return s_->stream(role); }
void NcclComm::setCallerStream(cudaStream_t stream) { s_->caller = stream; }
void NcclComm::abort(const Status& reason) { s_->abortNow(reason); }
bool NcclComm::aborted() const { return s_->aborted; }
Comm& NcclComm::bootstrap() { return *s_->bootstrap; }
const NcclOptions& NcclComm::options() const { return s_->options; }

void NcclComm::abortJob(int code) {
  s_->abortNow(internalError("abortJob(", code, ") on ", s_->describe()));
  s_->bootstrap->abortJob(code);
  std::abort();  // the bootstrap's abortJob does not return; keeps [[noreturn]] honest
}

}  // namespace hsdp::nccl

namespace hsdp::modules {
// Called once by the generated module list (cmake/HsdpModules.cmake).
void registerNcclTransport() {
  registerTransport("nccl", [](std::unique_ptr<Comm> bootstrap) {
    return nccl::createNcclComm(std::move(bootstrap));
  });
}
}  // namespace hsdp::modules
