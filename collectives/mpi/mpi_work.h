// Nonblocking operations of the MPI transport, progressed through the process-wide progress list
// (core/progress.h) by the thread that initialised MPI (MPI_THREAD_FUNNELED).
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/host_buffer.h"
#include "core/progress.h"
#include "core/scratch_pool.h"
#include "hsdp/transport.h"

namespace hsdp::mpi {

// The requests of one step of an MPI work, tested together. MPI's test calls progress the whole
// library whenever a request is incomplete, and Open MPI's TCP transport then polls every socket
// (libevent's poll on each call): with k works in flight, each pass of the progress loop polled
// k times, a quarter of the CPU of 8 ranks on 2 cores. So every live set joins one process-wide
// MPI_Testsome: a set's test() progresses MPI only if no set has done so since this set last
// looked, which is once per pass of the progress loop (and once per call for a work advanced
// alone). Used under progressLock(), like the works.
class RequestSet {
 public:
  RequestSet();
  ~RequestSet();
  RequestSet(const RequestSet&) = delete;
  RequestSet& operator=(const RequestSet&) = delete;

  // A new request slot (MPI_REQUEST_NULL) for an MPI_I* call to fill. The pointer stays valid
  // until the next add() or clear().
  MPI_Request* add();
  // Forgets completed requests (all must be complete or null).
  void clear() { reqs_.clear(); }
  // True once every request has completed (completed ones become MPI_REQUEST_NULL).
  StatusOr<bool> test();
  // Cancels and frees what is still in flight (after a failure).
  void cancel();

 private:
  friend struct Poll;
  std::vector<MPI_Request> reqs_;
  uint64_t seen_ = 0;  // the poll generation this set last saw
};

// What the reduce-scatters that receive whole blocks take (the exchange, mpi_exchange.h, and the
// cross-memory-attach one, mpi_cma.h).
struct BlockReduceArgs {
  MPI_Comm comm;
  int rank, size, tag;
  const void* send;
  void* recv;
  BlockRuns layout;
  DType dtype;  // float32 or bf16
  RedOp op;
  ScratchPool* pool;                      // `slot` goes back here when the work ends
  HostBuffer* slot;                       // the work's scratchBytes() or more
  std::atomic<uint64_t>* sent = nullptr;  // the communicator's bytesSent(): sends (or reads) add
};

// Completes one MPI request, then runs `on_complete` (e.g. averaging a sum).
class RequestWork final : public ProgressiveWork {
 public:
  RequestWork(MPI_Request req, std::function<void()> on_complete)
      : on_complete_(std::move(on_complete)) {
    *req_.add() = req;
  }
  ~RequestWork() override { waitForDestruction(); }

 private:
  void advance() override;
  RequestSet req_;
  std::function<void()> on_complete_;
};

}  // namespace hsdp::mpi
