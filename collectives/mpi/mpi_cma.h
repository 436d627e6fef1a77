// The MPI transport's reduce-scatter where the members share a host and may read each other's
// memory (Linux cross-memory attach, process_vm_readv, as Open MPI's shared-memory transport uses
// it): every rank tells its peers where its input lies, reads its own block of every peer's input
// a tile at a time into a small buffer that stays in cache, and adds the tiles in rank order
// straight into `recv`. Each block crosses once and nothing is staged in memory: against the
// exchange (mpi_exchange.h), which copies the n-1 peer blocks into scratch and then reads them
// again to add them, it moves 2.5 instead of 5.5 block sizes of memory traffic per rank at
// n = 4. The messages are small: each rank's address, then "done reading" (a rank's input must
// not change until every peer has read its block). Same sums, same bits as the exchange.
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <vector>

#include "collectives/mpi/mpi_work.h"

namespace hsdp::mpi {

// The members of a communicator as cross-memory attach needs them, by rank: process ids, and world
// ranks for messages (a peer that died is named as the watchdog and UCX name it).
struct CmaPeers {
  std::vector<pid_t> pids;
  std::vector<int> world;
};

// Whether every member of `comm` can read every other member's memory (process_vm_readv of a word
// each rank publishes): collective over `comm`. Lets any process read this one first
// (PR_SET_PTRACER, as Open MPI does), for hosts whose Yama policy asks for it. Fills `peers`.
StatusOr<bool> crossMemoryAttach(MPI_Comm comm, int rank, int size, CmaPeers* peers);

class CmaReduceScatterWork final : public ProgressiveWork {
 public:
  // Bytes of each peer's block read and added at a time.
  static constexpr size_t kTileBytes = size_t(64) << 10;
  static size_t scratchBytes(int size) {
    return size < 2 ? 0 : static_cast<size_t>(size - 1) * kTileBytes;
  }

  // slot: scratchBytes(size) or more, one tile per peer.
  CmaReduceScatterWork(const BlockReduceArgs& a, const CmaPeers* peers);
  ~CmaReduceScatterWork() override { waitForDestruction(); }

 private:
  // Reads our block of every peer's input and adds it into `recv`.
  Status reduce();
  void fail(Status s);
  void advance() override;

  BlockReduceArgs a_;
  const CmaPeers* peers_;
  size_t es_;
  bool reduced_ = false;
  uint64_t mine_;               // our input's address, sent to every peer
  std::vector<uint64_t> addr_;  // the peers' input addresses, by rank
  RequestSet addrs_;            // receives of the peers' addresses
  RequestSet rest_;             // our sends, and the peers' "done reading"
};

}  // namespace hsdp::mpi
