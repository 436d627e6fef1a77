#include "collectives/mpi/mpi_cma.h"

#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "collectives/mpi/mpi_check.h"
#include "collectives/mpi/mpi_sum.h"

namespace hsdp::mpi {
namespace {

// The word every rank publishes for the capability probe.
const uint64_t kProbeWord = 0x68736470636d6121ull;  // "hsdpcma!"

}  // namespace

StatusOr<bool> crossMemoryAttach(MPI_Comm comm, int rank, int size, CmaPeers* peers) {
  std::vector<pid_t>* pids = &peers->pids;
#ifdef PR_SET_PTRACER
  prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);  // no Yama on a host: EINVAL, harmless
#endif
  const uint64_t mine[2] = {static_cast<uint64_t>(getpid()),
                            reinterpret_cast<uintptr_t>(&kProbeWord)};
  std::vector<uint64_t> all(2 * static_cast<size_t>(size));
  HSDP_MPI_CHECK(MPI_Allgather(mine, 2, MPI_UINT64_T, all.data(), 2, MPI_UINT64_T, comm));
  pids->resize(static_cast<size_t>(size));
  for (int q = 0; q < size; ++q) (*pids)[q] = static_cast<pid_t>(all[2 * q]);
  MPI_Group group, world;
  HSDP_MPI_CHECK(MPI_Comm_group(comm, &group));
  HSDP_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int q = 0; q < size; ++q) ranks[q] = q;
  peers->world.resize(static_cast<size_t>(size));
  const int rc = MPI_Group_translate_ranks(group, size, ranks.data(), world, peers->world.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  HSDP_MPI_CHECK(rc);
  // Each rank reads its right neighbour's word; every pair of ranks is one host's processes of
  // one user, so one read per rank tells whether this host allows it.
  const int right = (rank + 1) % size;
  uint64_t word = 0;
  iovec local{&word, sizeof word};
  iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(all[2 * right + 1])), sizeof word};
  const ssize_t got = process_vm_readv((*pids)[right], &local, 1, &remote, 1, 0);
  int ok = got == static_cast<ssize_t>(sizeof word) && word == kProbeWord ? 1 : 0, all_ok = 0;
  HSDP_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm));
  return all_ok == 1;
}

CmaWork::CmaWork(MPI_Comm comm, int rank, int size, int tag, const CmaPeers* peers,
                 uint64_t address, uint64_t flag)
    : comm_(comm),
      rank_(rank),
      size_(size),
      tag_(tag),
      peers_(peers),
      mine_{address, flag},
      words_(2 * static_cast<size_t>(size), 0) {
  // From every peer, in this order on one tag: its words, then its "done reading ours" (MPI
  // matches one source's messages of one tag in the order they were sent).
  const int n = size_, r = rank_;
  for (int i = 1; i < n; ++i) {
    const int from = (r - i + n) % n, to = (r + i) % n;
    int rc = MPI_Irecv(&words_[2 * static_cast<size_t>(from)], 2, MPI_UINT64_T, from, tag_, comm_,
                       words_in_.add());
    if (rc == MPI_SUCCESS) rc = MPI_Irecv(nullptr, 0, MPI_BYTE, from, tag_, comm_, rest_.add());
    if (rc == MPI_SUCCESS) rc = MPI_Isend(mine_, 2, MPI_UINT64_T, to, tag_, comm_, rest_.add());
    if (rc != MPI_SUCCESS) {
      fail(mpiError(rc, "MPI_Irecv/Isend", __FILE__, __LINE__));
      return;
    }
  }
}

Status CmaWork::readError(int q, size_t bytes, ssize_t got) const {
  return internalError(
      "process_vm_readv of ", bytes, " bytes from rank ", q, " (world rank ", peers_->world[q],
      ") failed: ", got < 0 ? std::strerror(errno) : "short read", " (pid ", peers_->pids[q], ")");
}

void CmaWork::fail(Status s) {
  words_in_.cancel();
  rest_.cancel();
  release();
  finish(std::move(s));
}

void CmaWork::advance() {
  if (!read_) {
    StatusOr<bool> flag = words_in_.test();
    if (!flag.ok()) return fail(flag.status());
    if (!*flag) return;
    if (Status s = read(); !s.ok()) return fail(std::move(s));
    read_ = true;
    const int n = size_;
    for (int i = 1; i < n; ++i) {  // the peers may reuse their buffers once we are done reading
      const int rc = MPI_Isend(nullptr, 0, MPI_BYTE, (rank_ - i + n) % n, tag_, comm_, rest_.add());
      if (rc != MPI_SUCCESS) return fail(mpiError(rc, "MPI_Isend", __FILE__, __LINE__));
    }
  }
  StatusOr<bool> flag = rest_.test();
  if (!flag.ok()) return fail(flag.status());
  if (!*flag) return;
  release();
  finish(Status());
}

CmaReduceScatterWork::CmaReduceScatterWork(const BlockReduceArgs& a, const CmaPeers* peers)
    : CmaWork(a.comm, a.rank, a.size, a.tag, peers, reinterpret_cast<uintptr_t>(a.send), 0),
      a_(a),
      es_(dtypeSize(a.dtype)) {
  if (done()) release();  // failed while posting (the base cannot call our release() then)
}

Status CmaReduceScatterWork::read() {
  const int n = a_.size, r = a_.rank;
  const size_t tile = std::max<size_t>(1, kTileBytes / es_), run = a_.layout.run;
  const float scale = a_.op == RedOp::kAvg ? 1.0f / static_cast<float>(n) : 1.0f;
  const auto* in = static_cast<const char*>(a_.send);
  auto* out = static_cast<char*>(a_.recv);
  std::vector<const void*> src(static_cast<size_t>(n));
  for (size_t p = 0; p < a_.layout.runs; ++p) {
    for (size_t t = 0; t < run; t += tile) {
      const size_t len = std::min(tile, run - t), bytes = len * es_;
      const size_t at = (a_.layout.offset(r, p) + t) * es_;  // the same in every rank's input
      for (int q = 0; q < n; ++q) {
        if (q == r) {
          src[q] = in + at;
          continue;
        }
        char* buf = a_.slot->as<char>() + static_cast<size_t>((q - r - 1 + n) % n) * kTileBytes;
        iovec local{buf, bytes};
        iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(peerAddress(q) + at)), bytes};
        const ssize_t got = process_vm_readv(peers_->pids[q], &local, 1, &remote, 1, 0);
        if (got != static_cast<ssize_t>(bytes)) return readError(q, bytes, got);  // died: ESRCH
        if (a_.sent != nullptr) a_.sent->fetch_add(bytes, std::memory_order_relaxed);
        src[q] = buf;
      }
      sumBlocks(a_.dtype, src.data(), n, len, scale, out + (p * run + t) * es_);
    }
  }
  return okStatus();
}

void CmaReduceScatterWork::release() {
  if (a_.slot != nullptr) a_.pool->release(a_.slot);
  a_.slot = nullptr;
}

}  // namespace hsdp::mpi
