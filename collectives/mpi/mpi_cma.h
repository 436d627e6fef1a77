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

// What every cross-memory-attach work does around its reads: each rank sends its peers two
// words (where its buffer lies, and a flag), reads from theirs once every peer's words are in
// (read(), the subclass's), tells each peer it is done reading, and completes once every peer
// has said the same (a rank's buffer must not change before). The messages go over `tag` of
// `comm`; the reads happen inside advance(), in one pass.
class CmaWork : public ProgressiveWork {
 protected:
  CmaWork(MPI_Comm comm, int rank, int size, int tag, const CmaPeers* peers, uint64_t address,
          uint64_t flag);
  // Reads what this rank needs from every peer (their words: peerAddress, peerFlag).
  virtual Status read() = 0;
  // Returns what the work holds (a scratch slot) once it ends, failed or not.
  virtual void release() {}

  uint64_t peerAddress(int q) const { return words_[2 * static_cast<size_t>(q)]; }
  uint64_t peerFlag(int q) const { return words_[2 * static_cast<size_t>(q) + 1]; }
  // A failed or short process_vm_readv of `bytes` from rank q, naming the peer.
  Status readError(int q, size_t bytes, ssize_t got) const;

  MPI_Comm comm_;
  int rank_, size_, tag_;
  const CmaPeers* peers_;

 private:
  void fail(Status s);
  void advance() final;

  bool read_ = false;
  uint64_t mine_[2];             // our buffer's address and flag, sent to every peer
  std::vector<uint64_t> words_;  // the peers' (address, flag), by rank
  RequestSet words_in_;          // receives of the peers' words
  RequestSet rest_;              // our sends, and the peers' "done reading"
};

class CmaReduceScatterWork final : public CmaWork {
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
  Status read() override;
  void release() override;

  BlockReduceArgs a_;
  size_t es_;
};

}  // namespace hsdp::mpi
