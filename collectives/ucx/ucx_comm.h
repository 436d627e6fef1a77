// Comm over UCX (UCP tag matching) on host memory: the transport for the inter-node level when
// the fabric is best driven by UCX directly (InfiniBand/RoCE verbs, with GPUDirect RDMA later),
// selected per mesh level with HSDP_TRANSPORT_INTER=ucx / HSDP_TRANSPORT_INTRA=ucx.
//
// A UCX communicator is built collectively over a bootstrap communicator (MPI) of the same
// members: worker addresses travel through the bootstrap's all-gather, and the UCX communicator
// has the bootstrap's members in the bootstrap's rank order. The bootstrap is kept for split(),
// splitByHost() and abortJob(); collectives never touch it.
//
// Or, without any bootstrap (the replica level between elastic groups, which share no MPI job):
// from the members' worker addresses, published out of band (UcxWorkerAddress; elastic groups
// put it in their etcd member record), and an id the members agree on (createFromAddresses).
// Such a communicator handles peer failure on every endpoint, bounds every wait by a deadline
// without progress, and can be aborted from another thread (abort()). Its split() builds no
// endpoints: the parts share the parent's (two sets of endpoints between the same two workers
// can be paired crosswise by UCX, docs/elastic.md "The heal"), and take the ids after the
// parent's (id + 1, + 2, ... for its first, second, ... split), which the caller leaves free.
//
// Collectives are Schedules (schedule.h) run over tagged point-to-point messages: ring for large
// messages; recursive doubling (all-reduce, reduce-scatter, power-of-two all-gather) or Bruck
// (other all-gathers) at or below HSDP_UCX_SMALL_BYTES. Every collective is nonblocking
// underneath; the blocking calls start one and wait. All of them advance together on the
// process's one UCP worker (ucx_engine.h) inside Work::test()/wait().
//
// Memory: scratch comes from a small pool of page-aligned, pre-faulted HostBuffers, each
// registered with UCX once (ucp_mem_map) and reused; a pool slot is held by one collective in
// flight. User buffers may be registered once with registerMemory(); otherwise UCX registers
// them on demand (its registration cache keeps that cheap on RDMA fabrics).
//
// GPU memory (not built yet): UCX detects the memory type of a buffer when a request does not
// state it (UCS_MEMORY_TYPE_UNKNOWN) and moves CUDA memory with its cuda_copy/cuda_ipc/gdr_copy
// transports. Two things change for GPU buffers: requests stop saying "host" (kHostMemory in
// ucx_comm.cc), and the Schedule's local ops (accumulate, scale, copy) run as device kernels on a
// stream instead of CPU loops. The engine logs the memory types its context supports.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace hsdp::ucx {

class Engine;  // ucx_engine.h

struct UcxOptions {
  // Messages of at most this many bytes (all-gather, reduce-scatter: the whole n*count buffer;
  // all-reduce: the buffer) take the logarithmic algorithms; larger ones take the ring.
  size_t small_bytes = 32768;
  // HSDP_UCX_SMALL_BYTES, or the default above.
  static StatusOr<UcxOptions> fromEnv();
};

// This process's UCP worker, held open so that its address stays valid: the bytes a member
// publishes for the others to reach it. Every UCX communicator of the process shares the worker.
class UcxWorkerAddress {
 public:
  static StatusOr<UcxWorkerAddress> acquire();
  const std::vector<uint8_t>& bytes() const;

 private:
  std::shared_ptr<Engine> engine_;
};

// The members of a communicator built from addresses.
struct UcxMembers {
  int self = 0;                                 // this process's index
  std::vector<std::vector<uint8_t>> addresses;  // every member's UcxWorkerAddress::bytes()
  // Equal on every member and different from that of every earlier communicator of the same
  // processes still able to deliver a message (e.g. the quorum's step and attempt, hashed): the
  // tags carry it modulo 2^15, so a stale message of an aborted communicator never matches.
  uint64_t id = 0;
  // How errors name each member (e.g. "group 2 (host:port)"); empty: "member i (worker ...)".
  std::vector<std::string> names;
  // No collective waits longer than this without a message of it completing; <= 0: forever.
  int64_t timeout_ms = 0;
};

class UcxComm final : public Comm {
 public:
  // Collective over the members (every member calls it with the same addresses and id); ends
  // with a first barrier, so a member that does not come fails creation by the deadline, named.
  static StatusOr<std::unique_ptr<UcxComm>> createFromAddresses(const UcxMembers& members,
                                                                const UcxOptions& options);
  // Collective over `bootstrap`, which the new communicator owns from now on.
  static StatusOr<std::unique_ptr<UcxComm>> create(std::unique_ptr<Comm> bootstrap,
                                                   const UcxOptions& options);
  // Waits for nothing: collectives still in flight are cancelled with a warning (callers wait
  // for their Work before destroying the communicator).
  ~UcxComm() override;

  int rank() const override;
  int size() const override;
  const char* transportName() const override { return "ucx"; }

  // Splits the bootstrap and builds a UCX communicator over each part (collective, like the
  // bootstrap's split). Built from addresses: the parts over the parent's own endpoints
  // (splitAddressed).
  StatusOr<std::unique_ptr<Comm>> split(int color, int key) override;
  // The split of a communicator built from addresses: collective over its members (an
  // all-gather of color and key on it); each part shares the parent's endpoints to its members
  // (held as long as either lives), its deadline, names and abort (an aborted part closes the
  // endpoints to its members, which the parent's later collectives to them then report).
  StatusOr<std::unique_ptr<UcxComm>> splitAddressed(int color, int key);
  StatusOr<std::unique_ptr<Comm>> splitByHost() override;
  // Sizes the scratch pool's slots for reduce-scatters of up to `bytes` per rank-block (two
  // blocks per slot, like the MPI transport's ring); slots are registered once and reused.
  Status reserveScratch(size_t bytes) override;
  size_t scratchBytes() const override;
  // Without a bootstrap: logs and aborts this process only.
  [[noreturn]] void abortJob(int code) override;

  // Thread-safe, returns at once: the collective in flight (being waited for) and every later
  // one fail with kAborted and `reason` (the first one given). For a coordinator that already
  // knows a member is gone; the communicator is finished afterwards.
  void abort(const std::string& reason);
  bool aborted() const;
  // The members this communicator found failed (their endpoint failed: dead, reset), sorted. Not
  // those a deadline waited for: in a ring or butterfly, the member after a stopped one stalls
  // too, and its successors would name it.
  std::vector<int> suspects() const;

  // Registers [p, p+bytes) with UCX once, for the communicator's lifetime or until
  // deregisterMemory(p): transfers inside it then skip per-call registration. The memory must
  // stay allocated while registered. Long-lived engine buffers (shards, gathered blocks) are the
  // intended use.
  Status registerMemory(const void* p, size_t bytes);
  Status deregisterMemory(const void* p);

  Comm& bootstrap();  // not for communicators built from addresses
  const UcxOptions& options() const;
  // This communicator's id in the message tags (equal on every member).
  uint32_t id() const;

  struct State;  // defined in ucx_comm.cc

 protected:
  StatusOr<WorkHandle> startAllGather(const void* send, void* recv, size_t count,
                                      DType dtype) override;
  // The ring with receives posted at each run of `recv` (schedule.h, buildAllGatherRuns): no
  // staging. Small gathers (at most UcxOptions::small_bytes, where the logarithmic algorithms
  // win) pack and unpack (the default).
  StatusOr<WorkHandle> startAllGatherRuns(const void* send, void* recv, const BlockRuns& layout,
                                          DType dtype, void* pack) override;
  StatusOr<WorkHandle> startReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                          RedOp op) override;
  StatusOr<WorkHandle> startAllReduce(void* buf, size_t count, DType dtype, RedOp op) override;
  StatusOr<WorkHandle> startAllToAll(const void* send, void* recv, size_t count,
                                     DType dtype) override;
  Status runBroadcast(void* buf, size_t count, DType dtype, int root) override;
  Status runBarrier() override;
  const char* waitName(const char* call) const override;
  // Every send its schedules post counts (ucx_collective_op.h), whatever the algorithm.
  bool countsOwnSends() const override { return true; }

 private:
  explicit UcxComm(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

// Builds a UCX communicator over the members of `bootstrap`, in its rank order. Collective over
// `bootstrap`. The first form takes a private duplicate of `bootstrap` (bootstrap.split(0, rank))
// so the caller keeps its communicator; the second takes ownership. Options come from the
// environment (UcxOptions::fromEnv) unless given. Failures are reported on every member: a member
// whose UCX setup fails makes creation fail everywhere, rather than leave the others waiting.
StatusOr<std::unique_ptr<Comm>> createUcxComm(Comm& bootstrap);
StatusOr<std::unique_ptr<Comm>> createUcxComm(std::unique_ptr<Comm> bootstrap);
StatusOr<std::unique_ptr<Comm>> createUcxComm(std::unique_ptr<Comm> bootstrap,
                                              const UcxOptions& options);

}  // namespace hsdp::ucx
