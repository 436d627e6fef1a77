#include "collectives/mpi/mpi_comm.h"

#include <climits>
#include <cstring>

#include "collectives/mpi/mpi_check.h"
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

void accumulate(void* dst, const void* src, size_t n, DType t) {
  if (t == DType::kFloat32) {
    auto* d = static_cast<float*>(dst);
    auto* s = static_cast<const float*>(src);
    for (size_t i = 0; i < n; ++i) d[i] += s[i];
  } else {  // bf16: add in float, round once per hop, as a bf16 wire format does
    auto* d = static_cast<bf16*>(dst);
    auto* s = static_cast<const bf16*>(src);
    for (size_t i = 0; i < n; ++i) d[i] = toBf16(toFloat(d[i]) + toFloat(s[i]));
  }
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

StatusOr<std::unique_ptr<Comm>> MpiComm::adopt(MPI_Comm comm) {
  HSDP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  int rank = 0, size = 0;
  HSDP_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  HSDP_MPI_CHECK(MPI_Comm_size(comm, &size));
  return std::unique_ptr<Comm>(new MpiComm(comm, rank, size));
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

Status MpiComm::allGather(const void* send, void* recv, size_t count, DType dtype) {
  HSDP_RETURN_IF_ERROR(checkCount(count * size_, "allGather"));
  const size_t es = dtypeSize(dtype);
  const void* src = send;
  if (static_cast<const char*>(send) == static_cast<char*>(recv) + rank_ * count * es)
    src = MPI_IN_PLACE;
  HSDP_MPI_CHECK(MPI_Allgather(src, static_cast<int>(count), mpiType(dtype), recv,
                               static_cast<int>(count), mpiType(dtype), comm_));
  return okStatus();
}

Status MpiComm::reduceScatter(const void* send, void* recv, size_t count, DType dtype, RedOp op) {
  HSDP_RETURN_IF_ERROR(checkCount(count * size_, "reduceScatter"));
  const size_t es = dtypeSize(dtype);
  if (size_ == 1) {
    std::memcpy(recv, send, count * es);
    return okStatus();
  }
  if (isFloating(dtype)) {
    // Our own ring on preallocated scratch: Open MPI's MPI_Reduce_scatter_block allocates
    // temporaries on every call, and it has no bf16 sum.
    HSDP_RETURN_IF_ERROR(ringReduceScatter(send, recv, count, dtype));
    if (op == RedOp::kAvg) scale(recv, count, dtype, 1.0f / static_cast<float>(size_));
    return okStatus();
  }
  if (op == RedOp::kAvg) return invalidArgument("reduceScatter: avg of ", dtypeName(dtype));
  HSDP_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), mpiType(dtype),
                                          MPI_SUM, comm_));
  return okStatus();
}

Status MpiComm::ringReduceScatter(const void* send, void* recv, size_t count, DType dtype) {
  const size_t es = dtypeSize(dtype);
  const size_t chunk = count * es;
  if (scratch_.size() < 2 * chunk) {
    HSDP_WARN(kColl, "reduceScatter of ", chunk,
              " bytes per rank grows scratch on the hot path; call reserveScratch first");
    HSDP_RETURN_IF_ERROR(reserveScratch(chunk));
  }
  const int n = size_, r = rank_;
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  auto* in = static_cast<const char*>(send);
  char* bufs[2] = {scratch_.as<char>(), scratch_.as<char>() + chunk};
  // Step s: send our partial sum of chunk (r-s-1), receive the partial of chunk (r-s-2) from the
  // left neighbour and add our own contribution. After n-1 steps we hold all of chunk r.
  const void* sendp = in + static_cast<size_t>((r - 1 + n) % n) * chunk;
  for (int s = 0; s < n - 1; ++s) {
    const int c_recv = ((r - s - 2) % n + n) % n;
    void* recvp = (s == n - 2) ? recv : bufs[s % 2];
    HSDP_MPI_CHECK(MPI_Sendrecv(sendp, static_cast<int>(count), mpiType(dtype), next, kRingTag,
                                recvp, static_cast<int>(count), mpiType(dtype), prev, kRingTag,
                                comm_, MPI_STATUS_IGNORE));
    accumulate(recvp, in + static_cast<size_t>(c_recv) * chunk, count, dtype);
    sendp = recvp;
  }
  return okStatus();
}

Status MpiComm::allReduce(void* buf, size_t count, DType dtype, RedOp op) {
  HSDP_RETURN_IF_ERROR(checkCount(count, "allReduce"));
  if (size_ == 1) return okStatus();
  if (op == RedOp::kAvg && !isFloating(dtype))
    return invalidArgument("allReduce: avg of ", dtypeName(dtype));
  MPI_Op mop = dtype == DType::kBFloat16 ? bf16SumOp() : MPI_SUM;
  HSDP_MPI_CHECK(
      MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(count), mpiType(dtype), mop, comm_));
  if (op == RedOp::kAvg) scale(buf, count, dtype, 1.0f / static_cast<float>(size_));
  return okStatus();
}

Status MpiComm::broadcast(void* buf, size_t count, DType dtype, int root) {
  HSDP_RETURN_IF_ERROR(checkCount(count, "broadcast"));
  if (root < 0 || root >= size_)
    return invalidArgument("broadcast: root ", root, " outside communicator of size ", size_);
  HSDP_MPI_CHECK(MPI_Bcast(buf, static_cast<int>(count), mpiType(dtype), root, comm_));
  return okStatus();
}

Status MpiComm::barrier() {
  HSDP_MPI_CHECK(MPI_Barrier(comm_));
  return okStatus();
}

StatusOr<std::unique_ptr<Comm>> MpiComm::split(int color, int key) {
  if (color < 0) return invalidArgument("split: color ", color, " must be >= 0");
  MPI_Comm out;
  HSDP_MPI_CHECK(MPI_Comm_split(comm_, color, key, &out));
  return adopt(out);
}

StatusOr<std::unique_ptr<Comm>> MpiComm::splitByHost() {
  MPI_Comm out;
  HSDP_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out));
  return adopt(out);
}

Status MpiComm::reserveScratch(size_t bytes) {
  if (scratch_.size() >= 2 * bytes) return okStatus();
  HSDP_ASSIGN_OR_RETURN(scratch_, HostBuffer::allocate(2 * bytes));
  HSDP_INFO(kColl, "mpi comm (size ", size_, ") scratch ", 2 * bytes, " bytes");
  return okStatus();
}

void MpiComm::abortJob(int code) {
  MPI_Abort(comm_, code);
  std::abort();  // MPI_Abort does not return; keeps [[noreturn]] honest if it ever does
}

}  // namespace hsdp::mpi
