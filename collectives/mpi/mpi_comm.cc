#include "collectives/mpi/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "collectives/mpi/mpi_check.h"
#include "collectives/mpi/mpi_cma.h"
#include "collectives/mpi/mpi_exchange.h"
#include "collectives/mpi/mpi_gather.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/env.h"
#include "hsdp/log.h"

namespace hsdp::mpi {
namespace {

constexpr int kRingTag = 0x4853;  // "HS": point-to-point traffic of hsdp's own schedules

Status checkCount(size_t count, const char* what) {
  if (count > static_cast<size_t>(INT_MAX))
    return outOfRange(what, ": count ", count, " exceeds the MPI transport's limit of ", INT_MAX,
                      " elements per call");
  return okStatus();
}

// dst += src, float32 (the ring's data type; bf16 reduce-scatters take the exchange instead).
void accumulate(void* dst, const void* src, size_t n) {
  auto* d = static_cast<float*>(dst);
  auto* s = static_cast<const float*>(src);
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}

void scale(void* buf, size_t n, DType t, float factor) {
  if (t == DType::kFloat32) {
    auto* d = static_cast<float*>(buf);
    for (size_t i = 0; i < n; ++i) d[i] *= factor;
  } else if (t == DType::kBFloat16) {
    auto* d = static_cast<bf16*>(buf);
    for (size_t i = 0; i < n; ++i) d[i] = toBf16(toFloat(d[i]) * factor);
  }
}

const env::StringParam kRsAlgo{
    "HSDP_MPI_RS_ALGO", env::StringParam::Kind::kEnum, "auto",
    "The MPI transport's float32 reduce-scatter (every hierarchical intra-node phase runs one): "
    "auto, ring, exchange or cma. ring: partial sums passed to the next rank, n-1 hops, the "
    "fewest bytes on each link (auto's choice when the ranks are on several hosts). exchange: "
    "every rank sends each peer its block and adds the n blocks it receives once. cma: on one "
    "host, every rank reads its block of each peer's input in place with process_vm_readv "
    "(Linux cross-memory attach, as Open MPI's shared-memory transport does) and adds it tile by "
    "tile in cache, half the exchange's memory traffic (auto's choice on one host where a probe "
    "read succeeds; else the exchange). bf16 takes the exchange (or cma) whatever this says. "
    "exchange and cma give the same bits."};

// HSDP_MPI_RS_ALGO, validated: auto (also when unset), ring, exchange or cma.
StatusOr<std::string> reduceScatterAlgo() {
  const std::string v = kRsAlgo.get();
  if (v.empty() || v == "auto") return std::string("auto");
  if (v != "ring" && v != "exchange" && v != "cma")
    return invalidArgument("HSDP_MPI_RS_ALGO='", v, "' is not auto, ring, exchange or cma");
  return v;
}

}  // namespace

Status checkReduceScatterAlgo() { return reduceScatterAlgo().status(); }

// The float32 reduce-scatter of a communicator (collective: every member has the same
// environment and takes the same branch). auto: on one host the cross-memory-attach one where a
// probe read succeeds, else the exchange; between hosts the ring, which puts the fewest bytes on
// the links.
StatusOr<MpiComm::ReduceScatter> MpiComm::chooseReduceScatter(MPI_Comm comm, int rank, int size,
                                                              CmaPeers* peers) {
  HSDP_ASSIGN_OR_RETURN(const std::string v, reduceScatterAlgo());
  if (v == "ring") return ReduceScatter::kRing;
  if (v == "exchange") return ReduceScatter::kExchange;
  MPI_Comm local;
  HSDP_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
  int local_size = 0;
  const int rc = MPI_Comm_size(local, &local_size);
  MPI_Comm_free(&local);
  HSDP_MPI_CHECK(rc);
  int mine = local_size == size ? 1 : 0, shared = 0;
  HSDP_MPI_CHECK(MPI_Allreduce(&mine, &shared, 1, MPI_INT, MPI_MIN, comm));
  if (shared == 1 || v == "cma") {
    HSDP_ASSIGN_OR_RETURN(const bool cma, crossMemoryAttach(comm, rank, size, peers));
    if (cma) return ReduceScatter::kCma;
    if (v == "cma")
      return failedPrecondition("HSDP_MPI_RS_ALGO=cma, but ",
                                shared == 1 ? "this host refuses process_vm_readv between ranks"
                                            : "the ranks are not all on one host");
  }
  HSDP_INFO(kColl, "mpi comm (size ", size, "): reduce-scatter by ",
            shared == 1 ? "exchange (process_vm_readv refused)" : "ring (ranks on several hosts)");
  return shared == 1 ? ReduceScatter::kExchange : ReduceScatter::kRing;
}

StatusOr<std::unique_ptr<Comm>> MpiComm::adopt(MPI_Comm comm, bool traced) {
  HSDP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  HSDP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  HSDP_MPI_CHECK(MPI_Comm_size(comm, &size));
  std::unique_ptr<MpiComm> c(new MpiComm(comm, rank, size));
  if (size > 1) {
    HSDP_ASSIGN_OR_RETURN(c->rs_, chooseReduceScatter(comm, rank, size, &c->peers_));
  } else {
    HSDP_RETURN_IF_ERROR(checkReduceScatterAlgo());  // nothing to choose; a bad value still errs
  }
  if (traced && size > 1 && watchdog::tracing()) {
    // The members' world ranks (local: MPI knows them).
    MPI_Group group, world;
    HSDP_MPI_CHECK(MPI_Comm_group(comm, &group));
    HSDP_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
    std::vector<int> local(size), members(size);
    for (int q = 0; q < size; ++q) local[q] = q;
    const int rc = MPI_Group_translate_ranks(group, size, local.data(), world, members.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    HSDP_MPI_CHECK(rc);
    // With HSDP_CHECK_COLLECTIVES the fingerprints travel over a duplicate of this communicator,
    // so the checks never interleave with the collectives they check.
    HSDP_ASSIGN_OR_RETURN(
        c->trace_, traceComm(std::move(members), rank, [comm]() -> StatusOr<std::shared_ptr<Comm>> {
          MPI_Comm dup;
          HSDP_MPI_CHECK(MPI_Comm_dup(comm, &dup));
          HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> checker, adopt(dup, /*traced=*/false));
          return std::shared_ptr<Comm>(std::move(checker));
        }));
  }
  return std::unique_ptr<Comm>(std::move(c));
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status MpiComm::checkArgs(const CallArgs& a) const { return checkCount(a.total, a.what); }

const char* MpiComm::waitName(const char* call) const {
  if (std::strcmp(call, "allGather") == 0) return "MPI_Allgather";
  if (std::strcmp(call, "allReduce") == 0) return "MPI_Allreduce";
  if (std::strcmp(call, "broadcast") == 0) return "MPI_Bcast";
  if (std::strcmp(call, "barrier") == 0) return "MPI_Barrier";
  return call;
}

// The blocking calls (but allGather) start MPI's nonblocking one and wait in the progress loop:
// MPI's blocking ones spin inside the library (yielding at best), a waiting rank then takes a whole
// core from the computing ones; ProgressiveWork::wait sleeps once nothing moves (core/idle_wait.h).
namespace {
Status waitForRequest(MPI_Request req) {
  RequestWork w(req, nullptr);
  return w.wait();
}
}  // namespace

// Blocking MPI_Allgather, unlike the others: Open MPI's nonblocking one (libnbc) took 97 us
// against 56 us for 32 B on 8 ranks (docs/collectives.md), so a blocking all-gather still waits
// inside MPI, spinning (yielding with HSDP_MPI_YIELD); the engine gathers with iallGather.
Status MpiComm::runAllGather(const void* send, void* recv, size_t count, DType dtype) {
  const size_t es = dtypeSize(dtype);
  const void* src = send;
  if (static_cast<const char*>(send) == static_cast<char*>(recv) + rank_ * count * es)
    src = MPI_IN_PLACE;
  HSDP_MPI_CHECK(MPI_Allgather(src, static_cast<int>(count), mpiType(dtype), recv,
                               static_cast<int>(count), mpiType(dtype), comm_));
  countSent(blockBytesSent(size_, count, dtype));  // MPI's algorithm: the nominal bytes
  return okStatus();
}

StatusOr<WorkHandle> MpiComm::startAllGather(const void* send, void* recv, size_t count,
                                             DType dtype) {
  const size_t es = dtypeSize(dtype);
  const void* src = send;
  if (static_cast<const char*>(send) == static_cast<char*>(recv) + rank_ * count * es)
    src = MPI_IN_PLACE;
  MPI_Request req;
  HSDP_MPI_CHECK(MPI_Iallgather(src, static_cast<int>(count), mpiType(dtype), recv,
                                static_cast<int>(count), mpiType(dtype), comm_, &req));
  countSent(blockBytesSent(size_, count, dtype));
  return watched(std::make_unique<RequestWork>(req, nullptr));
}

StatusOr<WorkHandle> MpiComm::startAllGatherRuns(const void* send, void* recv,
                                                 const BlockRuns& layout, DType dtype, void*) {
  const int tag = kRingTag + static_cast<int>(seq_++ % 4096);
  const GatherRunsArgs args{comm_, rank_, size_, tag, send, recv, layout, dtype, &bytes_sent_};
  if (layout.blockCount() == 0) return completedWork();
  if (rs_ == ReduceScatter::kCma && size_ > 1)  // counts the bytes it reads
    return watched(std::make_unique<CmaAllGatherWork>(args, &peers_));
  HSDP_ASSIGN_OR_RETURN(MPI_Request req, startDatatypeAllGather(args));
  countSent(blockBytesSent(size_, layout.blockCount(), dtype));
  return watched(std::make_unique<RequestWork>(req, nullptr));
}

// Ring reduce-scatter over point-to-point messages, as a state machine. Step s sends our partial
// sum of chunk (r-s-1) to the right and receives the left neighbour's partial of chunk (r-s-2),
// adding our own contribution; after n-1 steps we hold the full sum of chunk r. Our own ring (not
// MPI_Ireduce_scatter_block): Open MPI's allocates temporaries on every call. float32 between
// hosts only, where each rank sends to one neighbour: an exchange would put every rank's blocks
// on the links between hosts (flat over 2 x 4 ranks: 32 blocks cross against the ring's 14).
// bf16 and shared memory take the exchange (mpi_exchange.h).
class RingReduceScatterWork final : public ProgressiveWork {
 public:
  RingReduceScatterWork(MpiComm& c, const void* send, void* recv, size_t count, DType dtype,
                        RedOp op, HostBuffer* slot, int tag)
      : c_(c),
        in_(static_cast<const char*>(send)),
        recv_(recv),
        count_(count),
        dtype_(dtype),
        op_(op),
        slot_(slot),
        tag_(tag),
        chunk_(count * dtypeSize(dtype)) {
    const int n = c_.size_, r = c_.rank_;
    sendp_ = in_ + static_cast<size_t>((r - 1 + n) % n) * chunk_;
    post();
  }
  ~RingReduceScatterWork() override { waitForDestruction(); }

 private:
  void* recvBuffer() const {
    if (step_ == c_.size_ - 2) return recv_;
    return slot_->as<char>() + (step_ % 2) * chunk_;
  }

  void post() {
    const int n = c_.size_, r = c_.rank_;
    const int count = static_cast<int>(count_);
    reqs_.clear();
    int rc = MPI_Irecv(recvBuffer(), count, mpiType(dtype_), (r - 1 + n) % n, tag_, c_.comm_,
                       reqs_.add());
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend(sendp_, count, mpiType(dtype_), (r + 1) % n, tag_, c_.comm_, reqs_.add());
    if (rc != MPI_SUCCESS) return fail(mpiError(rc, "MPI_Isend/Irecv", __FILE__, __LINE__));
    c_.countSent(chunk_);
  }

  void fail(Status s) {
    reqs_.cancel();
    c_.scratch_.release(slot_);
    finish(std::move(s));
  }

  void advance() override {
    StatusOr<bool> flag = reqs_.test();
    if (!flag.ok()) return fail(flag.status());
    if (!*flag) return;
    const int n = c_.size_, r = c_.rank_;
    const int c_recv = ((r - step_ - 2) % n + n) % n;
    void* got = recvBuffer();
    accumulate(got, in_ + static_cast<size_t>(c_recv) * chunk_, count_);
    sendp_ = got;
    if (++step_ < n - 1) return post();
    if (op_ == RedOp::kAvg) scale(recv_, count_, dtype_, 1.0f / static_cast<float>(n));
    c_.scratch_.release(slot_);
    finish(Status());
  }

  MpiComm& c_;
  const char* in_;
  void* recv_;
  size_t count_;
  DType dtype_;
  RedOp op_;
  HostBuffer* slot_;
  int tag_;
  size_t chunk_;
  int step_ = 0;
  const void* sendp_;
  RequestSet reqs_;
};

StatusOr<WorkHandle> MpiComm::startReduceScatter(const void* send, void* recv, size_t count,
                                                 DType dtype, RedOp op) {
  if (size_ == 1) {
    std::memcpy(recv, send, count * dtypeSize(dtype));
    return completedWork();
  }
  if (count == 0) return completedWork();
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    MPI_Request req;
    HSDP_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), mpiType(dtype),
                                             MPI_SUM, comm_, &req));
    countSent(blockBytesSent(size_, count, dtype));
    return watched(std::make_unique<RequestWork>(req, nullptr));
  }
  if (exchanges(dtype)) return startExchange(send, recv, {count, 1, count}, dtype, op);
  const int tag = kRingTag + static_cast<int>(seq_++ % 4096);
  HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, scratch_.acquire(2 * count * dtypeSize(dtype)));
  return watched(
      std::make_unique<RingReduceScatterWork>(*this, send, recv, count, dtype, op, slot, tag));
}

StatusOr<WorkHandle> MpiComm::startReduceScatterRuns(const void* send, void* recv,
                                                     const BlockRuns& layout, DType dtype, RedOp op,
                                                     void* pack) {
  // Other types, and float32 between hosts (the ring): packed into ireduceScatter's layout.
  if (!exchanges(dtype) || size_ == 1 || layout.blockCount() == 0)
    return Comm::startReduceScatterRuns(send, recv, layout, dtype, op, pack);
  return startExchange(send, recv, layout, dtype, op);
}

bool MpiComm::exchanges(DType dtype) const {
  return dtype == DType::kBFloat16 || (dtype == DType::kFloat32 && rs_ != ReduceScatter::kRing);
}

StatusOr<WorkHandle> MpiComm::startExchange(const void* send, void* recv, const BlockRuns& layout,
                                            DType dtype, RedOp op) {
  const int tag = kRingTag + static_cast<int>(seq_++ % 4096);
  if (rs_ == ReduceScatter::kCma) {
    HSDP_ASSIGN_OR_RETURN(HostBuffer * slot,
                          scratch_.acquire(CmaReduceScatterWork::scratchBytes(size_)));
    return watched(std::make_unique<CmaReduceScatterWork>(
        BlockReduceArgs{comm_, rank_, size_, tag, send, recv, layout, dtype, op, &scratch_, slot,
                        &bytes_sent_},
        &peers_));
  }
  HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, scratch_.acquire(ExchangeReduceScatterWork::scratchBytes(
                                               layout.blockCount() * dtypeSize(dtype), size_)));
  return watched(std::make_unique<ExchangeReduceScatterWork>(BlockReduceArgs{
      comm_, rank_, size_, tag, send, recv, layout, dtype, op, &scratch_, slot, &bytes_sent_}));
}

// All-to-all as one round of point-to-point messages: a receive from and a send to every peer,
// in the order (r+1, r+2, ...) so that no peer is everyone's first target; our own block is
// copied. Completes when every request has.
class AllToAllWork final : public ProgressiveWork {
 public:
  AllToAllWork(MpiComm& c, const char* send, char* recv, size_t count, DType dtype, int tag) {
    const int n = c.size(), r = c.rank();
    const size_t block = count * dtypeSize(dtype);
    std::memcpy(recv + static_cast<size_t>(r) * block, send + static_cast<size_t>(r) * block,
                block);
    int rc = MPI_SUCCESS;
    for (int i = 1; i < n && rc == MPI_SUCCESS; ++i) {
      const int from = (r - i + n) % n, to = (r + i) % n;
      rc = MPI_Irecv(recv + static_cast<size_t>(from) * block, static_cast<int>(count),
                     mpiType(dtype), from, tag, c.raw(), reqs_.add());
      if (rc == MPI_SUCCESS)
        rc = MPI_Isend(send + static_cast<size_t>(to) * block, static_cast<int>(count),
                       mpiType(dtype), to, tag, c.raw(), reqs_.add());
    }
    if (rc != MPI_SUCCESS) {
      reqs_.cancel();
      finish(mpiError(rc, "MPI_Isend/Irecv", __FILE__, __LINE__));
    }
  }
  ~AllToAllWork() override { waitForDestruction(); }

 private:
  void advance() override {
    StatusOr<bool> flag = reqs_.test();
    if (!flag.ok()) return finish(flag.status());
    if (*flag) finish(Status());
  }

  RequestSet reqs_;
};

StatusOr<WorkHandle> MpiComm::startAllToAll(const void* send, void* recv, size_t count,
                                            DType dtype) {
  if (size_ == 1 || count == 0) {
    std::memcpy(recv, send, count * size_ * dtypeSize(dtype));
    return completedWork();
  }
  const int tag = kRingTag + static_cast<int>(seq_++ % 4096);
  countSent(blockBytesSent(size_, count, dtype));  // its sends: a block to each peer
  return watched(std::make_unique<AllToAllWork>(*this, static_cast<const char*>(send),
                                                static_cast<char*>(recv), count, dtype, tag));
}

Status MpiComm::runAllReduce(void* buf, size_t count, DType dtype, RedOp op) {
  if (size_ == 1) return okStatus();
  MPI_Op mop = dtype == DType::kBFloat16 ? bf16SumOp() : MPI_SUM;
  MPI_Request req;
  HSDP_MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(count), mpiType(dtype), mop, comm_, &req));
  countSent(allReduceBytesSent(size_, rank_, count, dtype));
  HSDP_RETURN_IF_ERROR(waitForRequest(req));
  if (op == RedOp::kAvg) scale(buf, count, dtype, 1.0f / static_cast<float>(size_));
  return okStatus();
}

StatusOr<WorkHandle> MpiComm::startAllReduce(void* buf, size_t count, DType dtype, RedOp op) {
  if (size_ == 1) return completedWork();
  MPI_Op mop = dtype == DType::kBFloat16 ? bf16SumOp() : MPI_SUM;
  MPI_Request req;
  HSDP_MPI_CHECK(
      MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(count), mpiType(dtype), mop, comm_, &req));
  countSent(allReduceBytesSent(size_, rank_, count, dtype));
  std::function<void()> done;
  if (op == RedOp::kAvg) {
    const float f = 1.0f / static_cast<float>(size_);
    done = [buf, count, dtype, f] { scale(buf, count, dtype, f); };
  }
  return watched(std::make_unique<RequestWork>(req, std::move(done)));
}

// Broadcast and barrier stay on MPI's blocking calls (they wait inside Open MPI, yielding with
// HSDP_MPI_YIELD): started as libnbc schedules, a barrier one rank reaches while the others
// still wait in a nonblocking all-gather matched that all-gather's messages and failed with
// MPI_ERR_TRUNCATE instead of hanging, so the watchdog could no longer name the missing call
// (faults.watchdog.missing_unchecked.mpi). They are not where a step waits for its slowest rank.
Status MpiComm::runBroadcast(void* buf, size_t count, DType dtype, int root) {
  HSDP_MPI_CHECK(MPI_Bcast(buf, static_cast<int>(count), mpiType(dtype), root, comm_));
  countSent(broadcastBytesSent(size_, rank_, root, count, dtype));
  return okStatus();
}

Status MpiComm::runBarrier() {
  HSDP_MPI_CHECK(MPI_Barrier(comm_));
  return okStatus();
}

StatusOr<std::unique_ptr<Comm>> MpiComm::split(int color, int key) {
  auto lock = progressLock();
  if (color < 0) return invalidArgument("split: color ", color, " must be >= 0");
  MPI_Comm out;
  {
    watchdog::WaitScope wait("MPI_Comm_split");
    HSDP_MPI_CHECK(MPI_Comm_split(comm_, color, key, &out));
  }
  return adopt(out);
}

StatusOr<std::unique_ptr<Comm>> MpiComm::splitByHost() {
  auto lock = progressLock();
  MPI_Comm out;
  {
    watchdog::WaitScope wait("MPI_Comm_split_type");
    HSDP_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out));
  }
  return adopt(out);
}

Status MpiComm::reserveScratch(size_t bytes) {
  auto lock = progressLock();
  if (size_ == 1) return okStatus();  // a group of one never uses the ring
  // Float32 on shared memory and bf16 exchange (n-1 blocks, at most two segments of them); the
  // float ring between hosts needs two blocks.
  const size_t exchange = rs_ == ReduceScatter::kCma
                              ? CmaReduceScatterWork::scratchBytes(size_)
                              : ExchangeReduceScatterWork::scratchBytes(bytes, size_);
  const size_t bf16_exchange = ExchangeReduceScatterWork::scratchBytes(bytes / 2, size_);
  HSDP_RETURN_IF_ERROR(scratch_.reserve(
      rs_ != ReduceScatter::kRing ? exchange : std::max<size_t>(2 * bytes, bf16_exchange)));
  HSDP_INFO(kColl, "mpi comm (size ", size_, ") scratch ", scratch_.totalBytes(), " bytes");
  return okStatus();
}

WorkHandle MpiComm::watched(std::unique_ptr<ProgressiveWork> w) const {
  if (trace_) w->watchAs(trace_.get(), trace_->entered());
  return WorkHandle(std::move(w));
}

void MpiComm::abortJob(int code) {
  MPI_Abort(comm_, code);
  std::abort();  // MPI_Abort does not return; keeps [[noreturn]] honest if it ever does
}

}  // namespace hsdp::mpi
