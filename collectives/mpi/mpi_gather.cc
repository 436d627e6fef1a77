#include "collectives/mpi/mpi_gather.h"

#include <sys/uio.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "collectives/mpi/mpi_check.h"

namespace hsdp::mpi {
namespace {

// process_vm_readv takes at most IOV_MAX (1024 on Linux) iovecs per side and call.
constexpr size_t kMaxIov = 1024;

bool inRuns(const GatherRunsArgs& a) {
  const size_t es = dtypeSize(a.dtype);
  return a.send ==
         static_cast<const char*>(a.recv) + a.layout.offset(static_cast<size_t>(a.rank), 0) * es;
}

}  // namespace

CmaAllGatherWork::CmaAllGatherWork(const GatherRunsArgs& a, const CmaPeers* peers)
    : CmaWork(a.comm, a.rank, a.size, a.tag, peers, reinterpret_cast<uintptr_t>(a.send),
              inRuns(a) ? 1 : 0),
      a_(a),
      es_(dtypeSize(a.dtype)) {
  // Our own block to its runs (unless it is there): nothing of it crosses processes.
  if (inRuns(a_)) return;
  const size_t run = a_.layout.run * es_;
  for (size_t p = 0; p < a_.layout.runs; ++p)
    std::memcpy(static_cast<char*>(a_.recv) + a_.layout.offset(a_.rank, p) * es_,
                static_cast<const char*>(a_.send) + p * run, run);
}

Status CmaAllGatherWork::read() {
  const int n = a_.size, r = a_.rank;
  const BlockRuns& l = a_.layout;
  const size_t run = l.run * es_;
  auto* out = static_cast<char*>(a_.recv);
  std::vector<iovec> local, remote;
  auto at = [](uint64_t address) {
    return reinterpret_cast<void*>(static_cast<uintptr_t>(address));
  };
  for (int i = 1; i < n; ++i) {
    // Peers in a different order on every rank, so no rank is read by all the others at once.
    const int q = (r + i) % n;
    for (size_t p0 = 0; p0 < l.runs; p0 += kMaxIov) {
      const size_t p1 = std::min(l.runs, p0 + kMaxIov), bytes = (p1 - p0) * run;
      local.clear();
      remote.clear();
      for (size_t p = p0; p < p1; ++p) local.push_back({out + l.offset(q, p) * es_, run});
      if (peerFlag(q) != 0) {  // in the peer's runs
        for (size_t p = p0; p < p1; ++p)
          remote.push_back({at(peerAddress(q) + p * l.stride * es_), run});
      } else {
        remote.push_back({at(peerAddress(q) + p0 * run), bytes});
      }
      const ssize_t got = process_vm_readv(peers_->pids[q], local.data(), local.size(),
                                           remote.data(), remote.size(), 0);
      if (got != static_cast<ssize_t>(bytes)) return readError(q, bytes, got);  // died: ESRCH
      if (a_.sent != nullptr) a_.sent->fetch_add(bytes, std::memory_order_relaxed);
    }
  }
  return okStatus();
}

StatusOr<MPI_Request> startDatatypeAllGather(const GatherRunsArgs& a) {
  const BlockRuns& l = a.layout;
  const size_t es = dtypeSize(a.dtype), extent = l.runs * l.stride * es;
  if (l.runs > INT_MAX || l.stride > INT_MAX || l.blockCount() > INT_MAX ||
      extent > static_cast<size_t>(PTRDIFF_MAX))
    return outOfRange("iallGatherRuns: runs of ", l.run, " x ", l.runs, " stride ", l.stride,
                      " exceed the MPI transport's limit of ", INT_MAX);
  MPI_Datatype runs, block;
  HSDP_MPI_CHECK(MPI_Type_vector(static_cast<int>(l.runs), static_cast<int>(l.run),
                                 static_cast<int>(l.stride), mpiType(a.dtype), &runs));
  int rc = MPI_Type_create_resized(runs, 0, static_cast<MPI_Aint>(extent), &block);
  MPI_Type_free(&runs);
  HSDP_MPI_CHECK(rc);
  rc = MPI_Type_commit(&block);
  MPI_Request req = MPI_REQUEST_NULL;
  if (rc == MPI_SUCCESS)
    rc = MPI_Iallgather(inRuns(a) ? MPI_IN_PLACE : a.send, static_cast<int>(l.blockCount()),
                        mpiType(a.dtype), a.recv, 1, block, a.comm, &req);
  // Why freeing now is safe: MPI keeps a datatype alive until the operations using it complete.
  MPI_Type_free(&block);
  HSDP_MPI_CHECK(rc);
  return req;
}

}  // namespace hsdp::mpi
