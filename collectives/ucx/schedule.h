// Collective algorithms as data: a Schedule is a list of steps, each a set of point-to-point
// sends and receives followed by local work (copy, accumulate, scale) once all of them are done.
// The algorithms here know nothing of UCX; the UCX communicator (ucx_comm.cc) executes a
// Schedule with tagged UCP messages, and tests/collectives/ucx/schedule_test.cc executes the same
// Schedules in one process for every group size, so the algorithms are checked exhaustively
// without a network.
//
// Why steps and not callbacks: a nonblocking collective must advance whenever *any* Work on the
// worker is tested (ranks may wait for their handles in different orders, so progress must never
// depend on which handle a rank happens to wait for). A Schedule is a small state machine the
// progress loop can advance step by step, and it allocates nothing while it runs.
//
// Messages are matched by (source rank, message id): every algorithm gives each message of one
// collective a distinct id that the sender and the receiver compute the same way (a step index
// is not enough, since ranks of one algorithm may run different numbers of steps, e.g. the ranks
// folded out of recursive doubling on non-power-of-two groups).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hsdp/dtype.h"
#include "hsdp/transport.h"

namespace hsdp::ucx {

struct Transfer {
  int peer;   // rank in the communicator
  void* buf;  // a send reads it, a receive writes it
  size_t bytes;
  uint32_t msg;  // id of this message within the collective, equal on both ends
};

struct LocalOp {
  enum Kind { kCopy, kAccumulate, kScale } kind;
  void* dst;
  const void* src;  // kCopy, kAccumulate
  size_t n;         // bytes for kCopy, elements otherwise
  DType dtype;
  float factor;  // kScale
};

// Executes one LocalOp on host memory. Accumulate is dst[i] += src[i] (bf16: sum in float,
// rounded once, like a bf16 wire format; integers wrap). Scale multiplies floating types only.
void runLocalOp(const LocalOp& op);

class Schedule {
 public:
  struct Step {
    uint32_t send_begin, send_end, recv_begin, recv_end, op_begin, op_end;
  };

  void clear();
  // Builder: transfers and local ops go into the step under construction; endStep() closes it.
  // A step without transfers runs its local ops as soon as it is reached; an empty step is
  // dropped.
  void send(int peer, const void* buf, size_t bytes, uint32_t msg);
  void recv(int peer, void* buf, size_t bytes, uint32_t msg);
  void copy(void* dst, const void* src, size_t bytes);
  void accumulate(void* dst, const void* src, size_t count, DType dtype);
  void scale(void* buf, size_t count, DType dtype, float factor);
  void endStep();

  size_t numSteps() const { return steps_.size(); }
  const Step& step(size_t i) const { return steps_[i]; }
  const Transfer& sendAt(uint32_t i) const { return sends_[i]; }
  const Transfer& recvAt(uint32_t i) const { return recvs_[i]; }
  const LocalOp& opAt(uint32_t i) const { return ops_[i]; }
  // Largest message id used plus one (bounded by the tag layout of the executor).
  uint32_t numMessageIds() const { return max_msg_ + 1; }

 private:
  std::vector<Step> steps_;
  std::vector<Transfer> sends_, recvs_;
  std::vector<LocalOp> ops_;
  Step open_{0, 0, 0, 0, 0, 0};
  uint32_t max_msg_ = 0;
};

enum class Algorithm {
  kLocal,              // one rank: copies only
  kRing,               // bandwidth-optimal; n-1 (all-reduce: 2(n-1)) steps
  kRecursiveDoubling,  // log2(n) steps; non-powers of two fold the extra ranks in and out
  kBruck,              // all-gather in ceil(log2 n) steps for any n, then a local rotation
  kBinomial,           // broadcast tree
  kDissemination,      // barrier
  kPairwise,           // all-to-all: one step, a message to and from every peer
};
const char* algorithmName(Algorithm a);

// Every builder below appends to `s`, which the caller has cleared. Counts are in elements,
// `small_bytes` is the size at or below which the latency-bound (logarithmic) algorithm is used.
// `scratch` must hold the bytes the matching *ScratchBytes function returns (it may be null when
// that is 0); it must not overlap the user buffers.

// Contract of Comm::allGather; in place when send == recv + rank*count*es.
Algorithm chooseAllGather(int size, size_t count, DType dtype, size_t small_bytes);
size_t allGatherScratchBytes(Algorithm a, int size, size_t count, DType dtype);
void buildAllGather(Schedule& s, Algorithm a, int rank, int size, const void* send, void* recv,
                    size_t count, DType dtype, void* scratch);

// Contract of Comm::iallGatherRuns: the ring, each block's runs received in place, one message
// per run (kRing; no scratch). The message ids are (step, run), so (size - 1) * runs must fit the
// executor's 16-bit message field (allGatherRunsFits).
constexpr uint64_t kMaxRunMessages = 1u << 16;
bool allGatherRunsFits(int size, const BlockRuns& layout);
void buildAllGatherRuns(Schedule& s, int rank, int size, const void* send, void* recv,
                        const BlockRuns& layout, DType dtype);

// Contract of Comm::reduceScatter. The small variant runs the recursive-doubling all-reduce on a
// scratch copy of the whole input and keeps its own block: for latency-bound sizes the extra
// bytes are free, and it needs no special case for non-powers of two.
Algorithm chooseReduceScatter(int size, size_t count, DType dtype, size_t small_bytes);
size_t reduceScatterScratchBytes(Algorithm a, int size, size_t count, DType dtype);
void buildReduceScatter(Schedule& s, Algorithm a, int rank, int size, const void* send, void* recv,
                        size_t count, DType dtype, RedOp op, void* scratch);

// Contract of Comm::allReduce (in place). Every rank ends with bitwise the same values: each sum
// is formed once and copied (ring), or formed pairwise as a+b and b+a, which IEEE addition makes
// equal (recursive doubling). Replicas that all-reduce gradients therefore stay identical.
Algorithm chooseAllReduce(int size, size_t count, DType dtype, size_t small_bytes);
size_t allReduceScratchBytes(Algorithm a, int size, size_t count, DType dtype);
void buildAllReduce(Schedule& s, Algorithm a, int rank, int size, void* buf, size_t count,
                    DType dtype, RedOp op, void* scratch);

// Contract of Comm::iallToAll: one step of n-1 sends and receives (peers r+1, r+2, ... in turn)
// and the copy of our own block; no scratch.
void buildAllToAll(Schedule& s, int rank, int size, const void* send, void* recv, size_t count,
                   DType dtype);

// Binomial tree from `root`; no scratch. Broadcast is not on the engine's hot path, so large
// messages do not get a scatter + all-gather variant.
void buildBroadcast(Schedule& s, int rank, int size, void* buf, size_t bytes, int root);

// Dissemination barrier: ceil(log2 n) rounds of empty messages; `token` is any valid byte.
void buildBarrier(Schedule& s, int rank, int size, void* token);

}  // namespace hsdp::ucx
