// The transport interface: a communicator over some group of ranks and the collectives the engine
// needs on it. The engine and the hierarchical schedules only ever talk to this interface. MPI on
// host memory (collectives/mpi/), UCX (collectives/ucx/) and NCCL on device memory
// (collectives/nccl/) implement it, each registering a factory by name in the transport registry
// (hsdp/transport_registry.h). A new backend is a new folder under collectives/ and a registry
// entry, not an #if in the engine.
//
// What a transport implements: the nonblocking collectives (iallGather, ireduceScatter,
// iallReduce), broadcast, barrier, split, splitByHost, scratch and abortJob; optionally the
// all-to-all (iallToAll; the default says the transport has none) and a reduce-scatter that
// reads non-contiguous blocks in place (ireduceScatterRuns; the default packs them first). The
// blocking collectives default to the nonblocking call and wait(), and igroup to starting each
// operation in turn; a transport overrides only what it does differently (MPI's blocking calls go
// to MPI's own blocking collectives, NCCL fuses a group into one launch).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "hsdp/dtype.h"
#include "hsdp/status.h"

namespace hsdp {

class CommTrace;  // watchdog/watchdog.h: a communicator's entry in the watchdog's table

// A collective in flight. The buffers passed to the call must stay alive and untouched until the
// Work completes. Transports progress their operations inside test() and wait() (and, where they
// have one, on a progress thread).
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation completes; returns its result. Calling it again returns the same.
  [[nodiscard]] virtual Status wait() = 0;
  // Makes progress without blocking; true once complete (wait() then returns at once).
  [[nodiscard]] virtual StatusOr<bool> test() = 0;
};
using WorkHandle = std::unique_ptr<Work>;

// A Work that finished when it was created (eager transports, size-1 groups).
WorkHandle completedWork(Status status = Status());

// A Work that completes when every one of `works` has: wait() waits for all of them (also after
// a failure, so no buffer is still in use when it returns) and returns the first failure in
// order; test() is true once all are done, or returns the first failure seen.
WorkHandle allOf(std::vector<WorkHandle> works);

// One collective of a group (Comm::igroup), with the arguments and contract of the matching
// nonblocking call. For an all-reduce `recv` is the in-place buffer and `send` is unused.
struct CollectiveOp {
  enum class Kind { kAllGather, kReduceScatter, kAllReduce };
  Kind kind = Kind::kAllGather;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kFloat32;
  RedOp op = RedOp::kSum;  // reductions only

  static CollectiveOp allGather(const void* send, void* recv, size_t count, DType dtype) {
    return {Kind::kAllGather, send, recv, count, dtype, RedOp::kSum};
  }
  static CollectiveOp reduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                    RedOp op) {
    return {Kind::kReduceScatter, send, recv, count, dtype, op};
  }
  static CollectiveOp allReduce(void* buf, size_t count, DType dtype, RedOp op) {
    return {Kind::kAllReduce, nullptr, buf, count, dtype, op};
  }
};
const char* collectiveKindName(CollectiveOp::Kind kind);

// igroup's independence rule for a group on `comm_size` ranks: OK, or an InvalidArgument naming
// two operations whose buffers overlap where one of them writes.
[[nodiscard]] Status checkIndependent(std::span<const CollectiveOp> ops, int comm_size);

// Where the blocks of a reduce-scatter's input lie when they are not one contiguous range each:
// block q is `runs` runs of `run` elements, run p of block q starting at element
// (q * runs + p) * stride of the input. ireduceScatter's contiguous input of `count` elements per
// block is {count, 1, count}. The hierarchical schedules' chunk of every shard is {n, J, count}.
struct BlockRuns {
  size_t run = 0;     // elements per run
  size_t runs = 1;    // runs per block
  size_t stride = 0;  // elements from one run's start to the next one's (>= run)

  size_t blockCount() const { return run * runs; }
  size_t offset(size_t block, size_t r) const { return (block * runs + r) * stride; }
};
// OK, or an InvalidArgument naming the layout: no runs, or runs that overlap (stride < run).
[[nodiscard]] Status checkBlockRuns(const BlockRuns& layout);

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* transportName() const = 0;

  // The three collectives the engine overlaps with compute, started and returned as a Work.
  // Operations on one Comm must be started in the same order on every rank; they may complete
  // in any order. A transport that cannot overlap may finish the work inside the call and return
  // completedWork().
  //
  // iallGather: every rank contributes `count` elements; `recv` receives size()*count elements
  // in rank order. In place when send == recv + rank()*count*dtypeSize(dtype).
  [[nodiscard]] virtual StatusOr<WorkHandle> iallGather(const void* send, void* recv, size_t count,
                                                        DType dtype) = 0;
  // ireduceScatter: `send` holds size()*count elements; `recv` (count elements, not overlapping
  // `send`) receives the reduction over all ranks of block rank(). kAvg divides the sum by
  // size().
  [[nodiscard]] virtual StatusOr<WorkHandle> ireduceScatter(const void* send, void* recv,
                                                            size_t count, DType dtype,
                                                            RedOp op) = 0;
  // ireduceScatterRuns: ireduceScatter of an input whose blocks are runs (BlockRuns): `recv`
  // (not overlapping `send`) receives the layout.blockCount() reduced elements of block rank(),
  // run after run. The hierarchical schedules reduce a chunk of every shard with it straight from
  // the caller's buffer. `pack` (size() * blockCount() elements, host memory) is where the
  // default gathers the runs into ireduceScatter's layout before calling it; a transport that
  // reads the runs in place (MPI on shared memory) leaves it untouched.
  [[nodiscard]] virtual StatusOr<WorkHandle> ireduceScatterRuns(const void* send, void* recv,
                                                                const BlockRuns& layout,
                                                                DType dtype, RedOp op, void* pack);
  // iallReduce: in-place all-reduce of `count` elements.
  [[nodiscard]] virtual StatusOr<WorkHandle> iallReduce(void* buf, size_t count, DType dtype,
                                                        RedOp op) = 0;

  // iallToAll: `send` holds size()*count elements, block j for rank j; `recv` (size()*count
  // elements, not overlapping `send`) receives rank j's block for this rank at j*count (its own
  // block copied). Used by the quantized reduce-scatter (collectives/hier/), which exchanges
  // encoded pieces instead of summing partial sums hop by hop. The default is Unimplemented,
  // naming the transport: a transport without one cannot carry an int8/int4 reduce wire.
  [[nodiscard]] virtual StatusOr<WorkHandle> iallToAll(const void* send, void* recv, size_t count,
                                                       DType dtype);

  // Blocking forms, same contracts: by default the nonblocking call, then wait().
  [[nodiscard]] virtual Status allGather(const void* send, void* recv, size_t count, DType dtype);
  [[nodiscard]] virtual Status reduceScatter(const void* send, void* recv, size_t count,
                                             DType dtype, RedOp op);
  [[nodiscard]] virtual Status allReduce(void* buf, size_t count, DType dtype, RedOp op);

  // Several independent collectives started together, where several buffers move at once (the
  // zero1/zero2 parameter gathers after a step): one Work that completes when all of them have.
  // Each operation has its single call's contract, and they are all in flight at once, in no
  // particular order (NCCL fuses the group into one launch with ncclGroupStart/End and may run
  // its operations concurrently, largest first; the default starts each in turn): so no
  // operation may write bytes another one reads or writes (an operation's own in-place use is
  // fine). Such a group, like any bad argument, is an InvalidArgument naming the operation, and
  // nothing is started. An empty group is a completed Work. Every rank passes the same kinds,
  // counts and types in the same order, as for single calls.
  [[nodiscard]] virtual StatusOr<WorkHandle> igroup(std::span<const CollectiveOp> ops);

  [[nodiscard]] virtual Status broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  [[nodiscard]] virtual Status barrier() = 0;

  // Ranks with equal `color` form a new communicator, ordered by `key` (ties by current rank).
  [[nodiscard]] virtual StatusOr<std::unique_ptr<Comm>> split(int color, int key) = 0;

  // Ranks that share memory (one host, or one container) form a new communicator.
  [[nodiscard]] virtual StatusOr<std::unique_ptr<Comm>> splitByHost() = 0;

  // Grows the transport's scratch space so that collectives up to `bytes` per rank-block never
  // allocate on the hot path. Scratch is allocated once, pre-faulted and reused.
  [[nodiscard]] virtual Status reserveScratch(size_t bytes) = 0;
  virtual size_t scratchBytes() const = 0;

  // Ends the whole job from any rank: for errors after which ranks can no longer agree
  // (a failed collective). Bad input is reported with a Status instead, on every rank.
  [[noreturn]] virtual void abortJob(int code) = 0;

  // The communicator's name in messages and in the watchdog's reports ("world", "inter level";
  // the Mesh names the ones it builds). Empty until set.
  void setName(std::string name);
  const std::string& name() const { return name_; }
  // The watchdog's record of this communicator's collectives (hsdp/watchdog.h): every
  // collective's sequence number and fingerprint. Null when untraced (the watchdog is off, or
  // the communicator has one rank). Transports make it when they build the communicator.
  CommTrace* trace() const { return trace_.get(); }

 protected:
  std::shared_ptr<CommTrace> trace_;

 private:
  std::string name_;
};

}  // namespace hsdp
