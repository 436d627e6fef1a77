// The NCCL transport's collectives (include/hsdp/nccl.h); communicators are made in
// nccl_create.cc, the shared state is in nccl_internal.h.
#include <cmath>
#include <cstring>

#include "collectives/nccl/nccl_internal.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/env.h"
#include "hsdp/transport_registry.h"

namespace hsdp::nccl {

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

namespace {
const env::IntParam kCudaDevice{
    "HSDP_CUDA_DEVICE", env::Unset{""}, 0, 1023,
    "CUDA device of this rank's NCCL communicators (CUDA builds); unset: the rank's index on its "
    "host modulo the visible devices."};
}  // namespace

StatusOr<NcclOptions> NcclOptions::fromEnv() {
  NcclOptions o;
  HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> device, kCudaDevice.get());
  if (device) o.device = static_cast<int>(*device);
  // HSDP_TIMEOUT_S, the timeout of every transport (or its old name, HSDP_NCCL_TIMEOUT_S).
  HSDP_ASSIGN_OR_RETURN(watchdog::Config wd, watchdog::resolveConfig({}));
  o.timeout_s = std::isfinite(*wd.timeout_s) ? *wd.timeout_s : 0;
  return o;
}

// ---- collectives -------------------------------------------------------------------------------
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
