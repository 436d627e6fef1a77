#include "collectives/mpi/mpi_comm.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "collectives/mpi/mpi_check.h"
#include "core/watchdog.h"
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

bool isFloating(DType t) { return t == DType::kFloat32 || t == DType::kBFloat16; }

}  // namespace

StatusOr<std::unique_ptr<Comm>> MpiComm::adopt(MPI_Comm comm, bool traced) {
  HSDP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  HSDP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  HSDP_MPI_CHECK(MPI_Comm_size(comm, &size));
  std::unique_ptr<MpiComm> c(new MpiComm(comm, rank, size));
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

Status MpiComm::allGather(const void* send, void* recv, size_t count, DType dtype) {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkCount(count * size_, "allGather"));
  const size_t es = dtypeSize(dtype);
  const void* src = send;
  if (static_cast<const char*>(send) == static_cast<char*>(recv) + rank_ * count * es)
    src = MPI_IN_PLACE;
  return runCollective(
      trace_.get(), OpKind::kAllGather, count, dtype, RedOp::kSum, -1, "MPI_Allgather",
      [&]() -> Status {
        HSDP_MPI_CHECK(MPI_Allgather(src, static_cast<int>(count), mpiType(dtype), recv,
                                     static_cast<int>(count), mpiType(dtype), comm_));
        return okStatus();
      });
}

StatusOr<WorkHandle> MpiComm::iallGather(const void* send, void* recv, size_t count,
                                         DType dtype) {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkCount(count * size_, "iallGather"));
  const size_t es = dtypeSize(dtype);
  const void* src = send;
  if (static_cast<const char*>(send) == static_cast<char*>(recv) + rank_ * count * es)
    src = MPI_IN_PLACE;
  return startCollective(
      trace_.get(), OpKind::kAllGather, count, dtype, RedOp::kSum,
      [this, src, recv, count, dtype]() -> StatusOr<WorkHandle> {
        MPI_Request req;
        HSDP_MPI_CHECK(MPI_Iallgather(src, static_cast<int>(count), mpiType(dtype), recv,
                                      static_cast<int>(count), mpiType(dtype), comm_, &req));
        return watched(std::make_unique<RequestWork>(req, nullptr));
      });
}

// Ring reduce-scatter over point-to-point messages, as a state machine. Step s sends our partial
// sum of chunk (r-s-1) to the right and receives the left neighbour's partial of chunk (r-s-2),
// adding our own contribution; after n-1 steps we hold the full sum of chunk r. Our own ring (not
// MPI_Ireduce_scatter_block): Open MPI's allocates temporaries on every call. float32 only: a
// bf16 ring would round the partial sum at every hop (bf16 uses ExchangeReduceScatterWork).
class RingReduceScatterWork final : public ProgressiveWork {
 public:
  RingReduceScatterWork(MpiComm& c, const void* send, void* recv, size_t count, DType dtype,
                        RedOp op, HostBuffer* slot, int tag)
      : c_(c), in_(static_cast<const char*>(send)), recv_(recv), count_(count), dtype_(dtype),
        op_(op), slot_(slot), tag_(tag), chunk_(count * dtypeSize(dtype)) {
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
    int rc = MPI_Irecv(recvBuffer(), count, mpiType(dtype_), (r - 1 + n) % n, tag_, c_.comm_,
                       &reqs_[0]);
    if (rc == MPI_SUCCESS)
      rc = MPI_Isend(sendp_, count, mpiType(dtype_), (r + 1) % n, tag_, c_.comm_, &reqs_[1]);
    if (rc != MPI_SUCCESS) fail(mpiError(rc, "MPI_Isend/Irecv", __FILE__, __LINE__));
  }

  void fail(Status s) {
    c_.scratch_.release(slot_);
    finish(std::move(s));
  }

  void advance() override {
    int flag = 0;
    int rc = MPI_Testall(2, reqs_, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return fail(mpiError(rc, "MPI_Testall", __FILE__, __LINE__));
    if (!flag) return;
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
  MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// bf16 reduce-scatter as an exchange plus one float accumulation: every rank sends block k of its
// input to rank k, which adds the n bf16 blocks in float (in rank order, so every rank's result
// is reproducible) and rounds once. The same bytes cross the wire as with the ring, (n-1)/n of
// the buffer, but the sum is rounded to bf16 once instead of at each of the ring's n-1 hops
// (the all-to-all reduce-scatter ZeRO++ uses to keep low-precision gradients accurate).
class ExchangeReduceScatterWork final : public ProgressiveWork {
 public:
  ExchangeReduceScatterWork(MpiComm& c, const void* send, void* recv, size_t count, RedOp op,
                            HostBuffer* slot, int tag)
      : c_(c), in_(static_cast<const bf16*>(send)), recv_(static_cast<bf16*>(recv)),
        count_(count), op_(op), slot_(slot), reqs_(2 * (c.size_ - 1), MPI_REQUEST_NULL) {
    const int n = c_.size_, r = c_.rank_;
    const int cnt = static_cast<int>(count_);
    int rc = MPI_SUCCESS;
    // Posted in the order (r+1, r+2, ...) so that no peer is everyone's first target.
    for (int i = 1; i < n && rc == MPI_SUCCESS; ++i) {
      const int from = (r - i + n) % n, to = (r + i) % n;
      rc = MPI_Irecv(block(from), cnt, MPI_UINT16_T, from, tag, c_.comm_, &reqs_[2 * (i - 1)]);
      if (rc == MPI_SUCCESS)
        rc = MPI_Isend(in_ + static_cast<size_t>(to) * count_, cnt, MPI_UINT16_T, to, tag,
                       c_.comm_, &reqs_[2 * (i - 1) + 1]);
    }
    if (rc != MPI_SUCCESS) fail(mpiError(rc, "MPI_Isend/Irecv", __FILE__, __LINE__));
  }
  ~ExchangeReduceScatterWork() override { waitForDestruction(); }

 private:
  // Where the block from rank `from` lands: our own block is read from the input in place.
  bf16* block(int from) const {
    const int n = c_.size_, r = c_.rank_;
    if (from == r) return const_cast<bf16*>(in_ + static_cast<size_t>(r) * count_);
    const int slot_index = (from - r - 1 + n) % n;  // peers r+1.. in order; 0 .. n-2
    return slot_->as<bf16>() + static_cast<size_t>(slot_index) * count_;
  }

  void fail(Status s) {
    for (MPI_Request& q : reqs_)
      if (q != MPI_REQUEST_NULL) {
        MPI_Cancel(&q);
        MPI_Request_free(&q);
      }
    c_.scratch_.release(slot_);
    finish(std::move(s));
  }

  void advance() override {
    int flag = 0;
    int rc = MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return fail(mpiError(rc, "MPI_Testall", __FILE__, __LINE__));
    if (!flag) return;
    const int n = c_.size_;
    const float scale = op_ == RedOp::kAvg ? 1.0f / static_cast<float>(n) : 1.0f;
    std::vector<const bf16*> blocks(n);
    for (int q = 0; q < n; ++q) blocks[q] = block(q);
    for (size_t i = 0; i < count_; ++i) {
      float acc = 0.0f;
      for (int q = 0; q < n; ++q) acc += toFloat(blocks[q][i]);
      recv_[i] = toBf16(acc * scale);
    }
    c_.scratch_.release(slot_);
    finish(Status());
  }

  MpiComm& c_;
  const bf16* in_;
  bf16* recv_;
  size_t count_;
  RedOp op_;
  HostBuffer* slot_;
  std::vector<MPI_Request> reqs_;
};

StatusOr<WorkHandle> MpiComm::ireduceScatter(const void* send, void* recv, size_t count,
                                             DType dtype, RedOp op) {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkCount(count * size_, "ireduceScatter"));
  // Bad input on any communicator, also where there is nothing to reduce.
  if (op == RedOp::kAvg && !isFloating(dtype))
    return invalidArgument("reduceScatter: avg of ", dtypeName(dtype));
  if (size_ == 1) {
    std::memcpy(recv, send, count * dtypeSize(dtype));
    return completedWork();
  }
  return startCollective(
      trace_.get(), OpKind::kReduceScatter, count, dtype, op,
      [this, send, recv, count, dtype, op]() -> StatusOr<WorkHandle> {
        if (count == 0) return completedWork();
        if (!isFloating(dtype)) {
          MPI_Request req;
          HSDP_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count),
                                                   mpiType(dtype), MPI_SUM, comm_, &req));
          return watched(std::make_unique<RequestWork>(req, nullptr));
        }
        const int tag = kRingTag + static_cast<int>(seq_++ % 4096);
        if (dtype == DType::kBFloat16) {
          HSDP_ASSIGN_OR_RETURN(HostBuffer * slot,
                                scratch_.acquire((size_ - 1) * count * dtypeSize(dtype)));
          return watched(
              std::make_unique<ExchangeReduceScatterWork>(*this, send, recv, count, op, slot, tag));
        }
        HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, scratch_.acquire(2 * count * dtypeSize(dtype)));
        return watched(std::make_unique<RingReduceScatterWork>(*this, send, recv, count, dtype, op,
                                                               slot, tag));
      });
}

// All-to-all as one round of point-to-point messages: a receive from and a send to every peer,
// in the order (r+1, r+2, ...) so that no peer is everyone's first target; our own block is
// copied. Completes when every request has (MPI_Testall).
class AllToAllWork final : public ProgressiveWork {
 public:
  AllToAllWork(MpiComm& c, const char* send, char* recv, size_t count, DType dtype, int tag)
      : reqs_(2 * (c.size() - 1), MPI_REQUEST_NULL) {
    const int n = c.size(), r = c.rank();
    const size_t block = count * dtypeSize(dtype);
    std::memcpy(recv + static_cast<size_t>(r) * block, send + static_cast<size_t>(r) * block,
                block);
    int rc = MPI_SUCCESS;
    for (int i = 1; i < n && rc == MPI_SUCCESS; ++i) {
      const int from = (r - i + n) % n, to = (r + i) % n;
      rc = MPI_Irecv(recv + static_cast<size_t>(from) * block, static_cast<int>(count),
                     mpiType(dtype), from, tag, c.raw(), &reqs_[2 * (i - 1)]);
      if (rc == MPI_SUCCESS)
        rc = MPI_Isend(send + static_cast<size_t>(to) * block, static_cast<int>(count),
                       mpiType(dtype), to, tag, c.raw(), &reqs_[2 * (i - 1) + 1]);
    }
    if (rc != MPI_SUCCESS) {
      for (MPI_Request& q : reqs_)
        if (q != MPI_REQUEST_NULL) {
          MPI_Cancel(&q);
          MPI_Request_free(&q);
        }
      finish(mpiError(rc, "MPI_Isend/Irecv", __FILE__, __LINE__));
    }
  }
  ~AllToAllWork() override { waitForDestruction(); }

 private:
  void advance() override {
    int flag = 0;
    int rc = MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return finish(mpiError(rc, "MPI_Testall", __FILE__, __LINE__));
    if (flag) finish(Status());
  }

  std::vector<MPI_Request> reqs_;
};

StatusOr<WorkHandle> MpiComm::iallToAll(const void* send, void* recv, size_t count, DType dtype) {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkCount(count * size_, "iallToAll"));
  const size_t bytes = count * size_ * dtypeSize(dtype);
  const auto* s = static_cast<const char*>(send);
  auto* d = static_cast<char*>(recv);
  if (count > 0 && s < d + bytes && d < s + bytes)
    return invalidArgument("allToAll: send and recv buffers overlap");
  if (size_ == 1 || count == 0) {
    std::memcpy(recv, send, bytes);
    return completedWork();
  }
  return startCollective(
      trace_.get(), OpKind::kAllToAll, count, dtype, RedOp::kSum,
      [this, s, d, count, dtype]() -> StatusOr<WorkHandle> {
        const int tag = kRingTag + static_cast<int>(seq_++ % 4096);
        return watched(std::make_unique<AllToAllWork>(*this, s, d, count, dtype, tag));
      });
}

Status MpiComm::allReduce(void* buf, size_t count, DType dtype, RedOp op) {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkCount(count, "allReduce"));
  if (op == RedOp::kAvg && !isFloating(dtype))
    return invalidArgument("allReduce: avg of ", dtypeName(dtype));
  if (size_ == 1) return okStatus();
  MPI_Op mop = dtype == DType::kBFloat16 ? bf16SumOp() : MPI_SUM;
  HSDP_RETURN_IF_ERROR(runCollective(
      trace_.get(), OpKind::kAllReduce, count, dtype, op, -1, "MPI_Allreduce", [&]() -> Status {
        HSDP_MPI_CHECK(
            MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(count), mpiType(dtype), mop, comm_));
        return okStatus();
      }));
  if (op == RedOp::kAvg) scale(buf, count, dtype, 1.0f / static_cast<float>(size_));
  return okStatus();
}

StatusOr<WorkHandle> MpiComm::iallReduce(void* buf, size_t count, DType dtype, RedOp op) {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkCount(count, "iallReduce"));
  if (op == RedOp::kAvg && !isFloating(dtype))
    return invalidArgument("allReduce: avg of ", dtypeName(dtype));
  if (size_ == 1) return completedWork();
  return startCollective(trace_.get(), OpKind::kAllReduce, count, dtype, op,
                         [this, buf, count, dtype, op]() -> StatusOr<WorkHandle> {
                           MPI_Op mop = dtype == DType::kBFloat16 ? bf16SumOp() : MPI_SUM;
                           MPI_Request req;
                           HSDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(count),
                                                         mpiType(dtype), mop, comm_, &req));
                           std::function<void()> done;
                           if (op == RedOp::kAvg) {
                             const float f = 1.0f / static_cast<float>(size_);
                             done = [buf, count, dtype, f] { scale(buf, count, dtype, f); };
                           }
                           return watched(std::make_unique<RequestWork>(req, std::move(done)));
                         });
}

Status MpiComm::broadcast(void* buf, size_t count, DType dtype, int root) {
  auto lock = progressLock();
  HSDP_RETURN_IF_ERROR(checkCount(count, "broadcast"));
  if (root < 0 || root >= size_)
    return invalidArgument("broadcast: root ", root, " outside communicator of size ", size_);
  return runCollective(
      trace_.get(), OpKind::kBroadcast, count, dtype, RedOp::kSum, root, "MPI_Bcast",
      [&]() -> Status {
        HSDP_MPI_CHECK(MPI_Bcast(buf, static_cast<int>(count), mpiType(dtype), root, comm_));
        return okStatus();
      });
}

Status MpiComm::barrier() {
  auto lock = progressLock();
  return runCollective(trace_.get(), OpKind::kBarrier, 0, DType::kUInt8, RedOp::kSum, -1,
                       "MPI_Barrier", [&]() -> Status {
                         HSDP_MPI_CHECK(MPI_Barrier(comm_));
                         return okStatus();
                       });
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
  // The float ring needs two blocks; the bf16 exchange n-1 blocks of half the bytes.
  HSDP_RETURN_IF_ERROR(scratch_.reserve(std::max<size_t>(2 * bytes, (size_ - 1) * bytes / 2)));
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
