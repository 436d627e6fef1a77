// The MPI transport's exchange reduce-scatter: every rank sends block k of its input (its runs,
// read in place) to rank k and adds the n blocks of its own in rank order, in float, rounding to
// the data type once. Used for bf16 on every communicator (a ring would round the partial sum at
// each of its n-1 hops) and for float32 where the members share memory: there Open MPI moves
// each message with one copy (CMA), so a block crosses once and is added once, where the ring
// copies it n-1 times and reads and writes the partial sums at every hop (11 against 15 block
// passes of memory traffic at n = 4), and the runs need no packing copy first.
#pragma once

#include <mpi.h>

#include <vector>

#include "collectives/mpi/mpi_work.h"

namespace hsdp::mpi {

class ExchangeReduceScatterWork final : public ProgressiveWork {
 public:
  // The block is summed in segments of at most this many bytes per peer, at most two segments
  // received at a time, so the scratch stays bounded for blocks of any size.
  static constexpr size_t kSegmentBytes = size_t(4) << 20;
  // Scratch one exchange of blocks of `block_bytes` takes on `size` ranks.
  static size_t scratchBytes(size_t block_bytes, int size);

  using Args = BlockReduceArgs;  // slot: scratchBytes(blockCount * es, size) or more
  explicit ExchangeReduceScatterWork(const Args& a);
  ~ExchangeReduceScatterWork() override { waitForDestruction(); }

 private:
  // A piece of a segment inside one run: elements [off, off + len) of run `run`, at `pos` in the
  // segment.
  struct Part {
    size_t run, off, len, pos;
  };
  std::vector<Part> parts(size_t segment) const;
  // Where peer `from`'s part of segment `s` lands in the scratch.
  char* landing(size_t s, int from) const;
  void postRecvs(size_t s);
  void sumSegment(size_t s);
  void fail(Status s);
  void advance() override;

  Args a_;
  size_t es_, seg_, nseg_;  // element size, elements per segment, segments
  size_t next_ = 0;         // the next segment to sum
  RequestSet sends_;
  RequestSet recvs_[2];  // the two segments being received
};

}  // namespace hsdp::mpi
