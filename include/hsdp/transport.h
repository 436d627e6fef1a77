// The transport interface: a communicator over some group of ranks and the collectives the engine
// needs on it. The engine and the hierarchical schedules only ever talk to this interface. MPI on
// host memory (collectives/mpi/), UCX (collectives/ucx/) and NCCL on device memory
// (collectives/nccl/) implement it, each registering a factory by name in the transport registry
// (hsdp/transport_registry.h). A new backend is a new folder under collectives/ and a registry
// entry, not an #if in the engine.
//
// Non-virtual interface: the public collectives of Comm are not virtual. Each one takes the
// progress lock, checks its arguments (counts, the avg of an integer type, null buffers, block
// runs, a group's independence) and enters the watchdog's trace once, here in the base class,
// and then calls the backend's protected implementation. What a transport implements: the
// nonblocking starts (startAllGather, startReduceScatter, startAllReduce), the blocking
// runBroadcast and runBarrier, split, splitByHost, scratch and abortJob; optionally the
// all-to-all (startAllToAll; the default says the transport has none), a reduce-scatter that
// reads non-contiguous blocks in place (startReduceScatterRuns; the default packs them first),
// an all-gather that lands them in place (startAllGatherRuns; the default gathers into a pack
// buffer and unpacks), its own blocking forms (runAllGather, ...; by default the start, then
// wait()), a fused group (fusesGroups, startGroup) and checks of its own (checkArgs). A
// transport overrides only what it does differently (MPI's blocking calls go to MPI's own
// blocking collectives, NCCL fuses a group into one launch).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
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

// The payload bytes one rank sends in one collective as hsdp-plan models them (docs/collectives.md,
// "Bytes sent"): what a transport counts where a library it calls runs the algorithm (MPI's
// own collectives, NCCL). All-gather, reduce-scatter and all-to-all of `count` elements per
// block: (size-1)·count elements. All-reduce: the ring's, the buffer cut into `size` chunks
// (the first count%size one element longer), rank r sending every chunk but (r+1)%size in the
// reduce-scatter half and every chunk but (r+2)%size in the all-gather half, so the group sends
// 2·(size-1)·count elements in all, as the planner's 2·(M-1)·D. Broadcast: the root sends the
// buffer to each other rank.
uint64_t blockBytesSent(int size, size_t count, DType dtype);
uint64_t allReduceBytesSent(int size, int rank, size_t count, DType dtype);
uint64_t broadcastBytesSent(int size, int rank, int root, size_t count, DType dtype);

class Comm;
// For transports built collectively over a bootstrap communicator (UCX, NCCL): every member
// learns whether every member's local step succeeded (an all-reduce over `bootstrap`), so one
// rank's failure (no usable device or transport, an allocation) fails the step on all ranks
// instead of leaving the others waiting in the next collective. Returns `local` with `what` as
// context where it failed, an Internal error naming how many ranks failed where only others did.
[[nodiscard]] Status agreeOnSuccess(Comm& bootstrap, const Status& local, const std::string& what);

// igroup's independence rule for a group on `comm_size` ranks: OK, or an InvalidArgument naming
// two operations whose buffers overlap where one of them writes.
[[nodiscard]] Status checkIndependent(std::span<const CollectiveOp> ops, int comm_size);

// Where the blocks of a reduce-scatter's input (or an all-gather's result) lie when they are not
// one contiguous range each:
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
// `what` names the collective in the message ("reduce-scatter", "all-gather").
[[nodiscard]] Status checkBlockRuns(const BlockRuns& layout, const char* what = "reduce-scatter");

// What one call hands to a backend's own argument checks (Comm::checkArgs): the call's name in
// messages ("allGather", "iallGather", "reduceScatter", "allReduce", "allToAll", "broadcast",
// "barrier"), its buffers (null where it has none; for all-reduce and broadcast `recv` is the
// in-place buffer), `count` elements per block and `total` elements in its largest buffer
// (size() * count for gathers, reduce-scatters and all-to-all; count otherwise).
struct CallArgs {
  const char* what;
  const void* send;
  const void* recv;
  size_t count;
  size_t total;
  DType dtype;
};

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
  [[nodiscard]] StatusOr<WorkHandle> iallGather(const void* send, void* recv, size_t count,
                                                DType dtype);
  // iallGatherRuns: iallGather into a result whose blocks are runs (BlockRuns): rank q's
  // layout.blockCount() elements land run after run, run p at recv + layout.offset(q, p). In
  // place when send == recv + layout.offset(rank(), 0) * dtypeSize(dtype): this rank's block
  // already lies in its runs. The pipelined hierarchical all-gather lands each chunk's pieces
  // in the caller's buffer with it. `pack` (size() * blockCount() elements, host memory) is where
  // the default gathers contiguously (iallGather) and then unpacks into the runs when the
  // gather completes; a transport that writes the runs in place leaves it untouched.
  [[nodiscard]] StatusOr<WorkHandle> iallGatherRuns(const void* send, void* recv,
                                                    const BlockRuns& layout, DType dtype,
                                                    void* pack);
  // ireduceScatter: `send` holds size()*count elements; `recv` (count elements, not overlapping
  // `send`) receives the reduction over all ranks of block rank(). kAvg divides the sum by
  // size().
  [[nodiscard]] StatusOr<WorkHandle> ireduceScatter(const void* send, void* recv, size_t count,
                                                    DType dtype, RedOp op);
  // ireduceScatterRuns: ireduceScatter of an input whose blocks are runs (BlockRuns): `recv`
  // (not overlapping `send`) receives the layout.blockCount() reduced elements of block rank(),
  // run after run. The hierarchical schedules reduce a chunk of every shard with it straight from
  // the caller's buffer. `pack` (size() * blockCount() elements, host memory) is where the
  // default gathers the runs into ireduceScatter's layout before calling it; a transport that
  // reads the runs in place (MPI on shared memory) leaves it untouched.
  [[nodiscard]] StatusOr<WorkHandle> ireduceScatterRuns(const void* send, void* recv,
                                                        const BlockRuns& layout, DType dtype,
                                                        RedOp op, void* pack);
  // iallReduce: in-place all-reduce of `count` elements.
  [[nodiscard]] StatusOr<WorkHandle> iallReduce(void* buf, size_t count, DType dtype, RedOp op);

  // iallToAll: `send` holds size()*count elements, block j for rank j; `recv` (size()*count
  // elements, not overlapping `send`) receives rank j's block for this rank at j*count (its own
  // block copied). Used by the quantized reduce-scatter (collectives/hier/), which exchanges
  // encoded pieces instead of summing partial sums hop by hop. Unimplemented, naming the
  // transport, where it has none: such a transport cannot carry an int8/int4 reduce wire.
  [[nodiscard]] StatusOr<WorkHandle> iallToAll(const void* send, void* recv, size_t count,
                                               DType dtype);

  // Blocking forms, same contracts: by default the nonblocking call, then wait().
  [[nodiscard]] Status allGather(const void* send, void* recv, size_t count, DType dtype);
  [[nodiscard]] Status reduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                     RedOp op);
  [[nodiscard]] Status allReduce(void* buf, size_t count, DType dtype, RedOp op);

  // Several independent collectives started together, where several buffers move at once (the
  // zero1/zero2 parameter gathers after a step): one Work that completes when all of them have.
  // Each operation has its single call's contract, and they are all in flight at once, in no
  // particular order (NCCL fuses the group into one launch with ncclGroupStart/End and may run
  // its operations concurrently, largest first; the default starts each in turn): so no
  // operation may write bytes another one reads or writes (an operation's own in-place use is
  // fine). Such a group, like any bad argument, is an InvalidArgument naming the operation, and
  // nothing is started. An empty group is a completed Work. Every rank passes the same kinds,
  // counts and types in the same order, as for single calls.
  [[nodiscard]] StatusOr<WorkHandle> igroup(std::span<const CollectiveOp> ops);

  [[nodiscard]] Status broadcast(void* buf, size_t count, DType dtype, int root);
  [[nodiscard]] Status barrier();

  // Ranks with equal `color` form a new communicator, ordered by `key` (ties by current rank).
  [[nodiscard]] virtual StatusOr<std::unique_ptr<Comm>> split(int color, int key) = 0;

  // Ranks that share memory (one host, or one container) form a new communicator.
  [[nodiscard]] virtual StatusOr<std::unique_ptr<Comm>> splitByHost() = 0;

  // Grows the transport's scratch space so that collectives up to `bytes` per rank-block never
  // allocate on the hot path. Scratch is allocated once, pre-faulted and reused.
  [[nodiscard]] virtual Status reserveScratch(size_t bytes) = 0;
  virtual size_t scratchBytes() const = 0;

  // A communicator of the same members, in the same order, whose collectives take host memory:
  // control messages (agreement on errors, signatures) of a program whose data moves on a
  // device. A host transport is its own; a device transport returns its host bootstrap.
  virtual Comm& hostComm() { return *this; }

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

  // The payload bytes this rank has sent on this communicator since it was made (a relaxed
  // atomic: any thread may read it; the engine takes differences per step). Where the library
  // moves the bytes itself (MPI's ring and exchange reduce-scatters, the cross-memory-attach
  // paths, every UCX schedule) the transport counts its real sends (a cross-memory read counts
  // for the reader); where a foreign library runs the algorithm (MPI_Iallgather,
  // MPI_Iallreduce, NCCL) it counts the nominal bytes above, as hsdp-plan models them.
  uint64_t bytesSent() const { return bytes_sent_.load(std::memory_order_relaxed); }

 protected:
  // Adds to bytesSent(): one relaxed add per send (or per call), nothing else on the hot path.
  void countSent(uint64_t bytes) { bytes_sent_.fetch_add(bytes, std::memory_order_relaxed); }
  // False (the default): the public calls count each call's nominal bytes (above) themselves.
  // True: the transport counts every byte it sends (MPI, UCX), through countSent or the counter.
  virtual bool countsOwnSends() const { return false; }
  std::atomic<uint64_t> bytes_sent_{0};

  // ---- what a backend implements (see the top of this file) ----
  // Called with the arguments checked (the shared checks and checkArgs), the call entered in the
  // trace, and progressLock() (core/progress.h) held; same contracts as the public calls.
  [[nodiscard]] virtual StatusOr<WorkHandle> startAllGather(const void* send, void* recv,
                                                            size_t count, DType dtype) = 0;
  [[nodiscard]] virtual StatusOr<WorkHandle> startReduceScatter(const void* send, void* recv,
                                                                size_t count, DType dtype,
                                                                RedOp op) = 0;
  [[nodiscard]] virtual StatusOr<WorkHandle> startAllReduce(void* buf, size_t count, DType dtype,
                                                            RedOp op) = 0;
  // Default: Unimplemented, naming the transport.
  [[nodiscard]] virtual StatusOr<WorkHandle> startAllToAll(const void* send, void* recv,
                                                           size_t count, DType dtype);
  // Default: the runs gathered into `pack` (host memory), then startReduceScatter on it.
  [[nodiscard]] virtual StatusOr<WorkHandle> startReduceScatterRuns(const void* send, void* recv,
                                                                    const BlockRuns& layout,
                                                                    DType dtype, RedOp op,
                                                                    void* pack);
  // Default: startAllGather into `pack` (host memory), unpacked into the runs when it completes.
  // The one place a transport that cannot land runs in place gets them unpacked.
  [[nodiscard]] virtual StatusOr<WorkHandle> startAllGatherRuns(const void* send, void* recv,
                                                                const BlockRuns& layout,
                                                                DType dtype, void* pack);
  // Blocking forms. Default: the start, then wait().
  [[nodiscard]] virtual Status runAllGather(const void* send, void* recv, size_t count,
                                            DType dtype);
  [[nodiscard]] virtual Status runReduceScatter(const void* send, void* recv, size_t count,
                                                DType dtype, RedOp op);
  [[nodiscard]] virtual Status runAllReduce(void* buf, size_t count, DType dtype, RedOp op);
  [[nodiscard]] virtual Status runBroadcast(void* buf, size_t count, DType dtype, int root) = 0;
  [[nodiscard]] virtual Status runBarrier() = 0;
  // A group as one operation (fusesGroups() true: traced once as a group, then startGroup);
  // otherwise every operation is traced and started as its single call.
  virtual bool fusesGroups() const { return false; }
  [[nodiscard]] virtual StatusOr<WorkHandle> startGroup(std::span<const CollectiveOp> ops);

  // The backend's own checks of one call, after the shared ones and before anything is traced
  // or started (MPI: counts that fit an int; NCCL: a usable communicator, device buffers).
  [[nodiscard]] virtual Status checkArgs(const CallArgs& args) const;
  // Why a backend may need it: with HSDP_CHECK_COLLECTIVES a nonblocking call's start waits, by
  // default, for the fingerprint comparison and then runs from the progress loop. A transport
  // whose operations must be issued by the caller's thread in program order (NCCL: onto the
  // caller's streams) compares before it starts instead (true).
  virtual bool comparesBeforeStart() const { return false; }
  // The name of a blocking call's wait in the watchdog's reports ("MPI_Allgather"); by default
  // the call's own ("allGather", "broadcast", "barrier").
  virtual const char* waitName(const char* call) const { return call; }

  std::shared_ptr<CommTrace> trace_;

 private:
  // `r`, after counting `nominal` bytes when it succeeded and the transport does not count its
  // own sends.
  template <typename R>
  R counted(R r, uint64_t nominal) {
    if (r.ok() && !countsOwnSends()) countSent(nominal);
    return r;
  }
  std::string name_;
};

}  // namespace hsdp
