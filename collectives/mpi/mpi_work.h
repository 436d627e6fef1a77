// Nonblocking operations of the MPI transport, progressed through the process-wide progress list
// (core/progress.h) by the thread that initialised MPI (MPI_THREAD_FUNNELED).
#pragma once

#include <mpi.h>

#include <functional>
#include <vector>

#include "core/progress.h"
#include "core/scratch_pool.h"
#include "hsdp/host_buffer.h"
#include "hsdp/transport.h"

namespace hsdp::mpi {

// Completes one MPI request, then runs `on_complete` (e.g. averaging a sum).
class RequestWork final : public ProgressiveWork {
 public:
  RequestWork(MPI_Request req, std::function<void()> on_complete)
      : req_(req), on_complete_(std::move(on_complete)) {}
  ~RequestWork() override { waitForDestruction(); }

 private:
  void advance() override;
  MPI_Request req_;
  std::function<void()> on_complete_;
};

}  // namespace hsdp::mpi
