// The MPI transport's all-gather into runs (Comm::iallGatherRuns), landing every block in place.
//
// On one host, by cross-memory attach (process_vm_readv), the mirror of the reduce-scatter in
// mpi_cma.h: every rank tells its peers where its block lies (contiguous, or already in its own
// runs), reads each peer's block with one scatter read straight into that peer's runs of `recv`
// (the kernel copies once, nothing is staged), then tells the peers it is done reading (a rank's
// block must not change until every peer has read it). Between hosts, MPI_Iallgather with a
// derived datatype that places each block's runs: MPI unpacks as it receives.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "collectives/mpi/mpi_cma.h"
#include "collectives/mpi/mpi_work.h"

namespace hsdp::mpi {

struct GatherRunsArgs {
  MPI_Comm comm;
  int rank, size, tag;
  const void* send;  // blockCount() elements, or recv + offset(rank, 0): already in its runs
  void* recv;
  BlockRuns layout;
  DType dtype;
  std::atomic<uint64_t>* sent = nullptr;  // the communicator's bytesSent(): bytes read add to it
};

class CmaAllGatherWork final : public CmaWork {
 public:
  CmaAllGatherWork(const GatherRunsArgs& a, const CmaPeers* peers);
  ~CmaAllGatherWork() override { waitForDestruction(); }

 private:
  // Reads every peer's block into its runs (the peer's flag: its block lies in its own runs).
  Status read() override;

  GatherRunsArgs a_;
  size_t es_;
};

// MPI_Iallgather into the runs through a derived datatype (one block = `runs` runs of `run`
// elements `stride` apart, resized so block q starts at offset(q, 0)).
StatusOr<MPI_Request> startDatatypeAllGather(const GatherRunsArgs& a);

}  // namespace hsdp::mpi
