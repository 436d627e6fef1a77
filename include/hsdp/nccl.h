// Comm over NCCL on device buffers: the transport for GPU training, selected per mesh level with
// HSDP_TRANSPORT_INTRA=nccl / HSDP_TRANSPORT_INTER=nccl.
//
// Creation: collective over a bootstrap communicator (MPI) of the same members. Rank 0 makes an
// ncclUniqueId, the bootstrap broadcasts it (DType::kUInt8), and every rank joins with
// ncclCommInitRankConfig on its device. Sub-communicators come from ncclCommSplit (no new
// unique id, no bootstrap traffic on the NCCL side); the bootstrap is split alongside, so every
// NcclComm keeps a bootstrap of its own members for splitByHost() and abortJob(). Collectives
// never touch the bootstrap.
//
// Device: HSDP_CUDA_DEVICE when set, else the rank's index on its host (bootstrap.splitByHost())
// modulo the visible devices. Several ranks on one GPU (tests, scripts/device-check) work only
// when each rank looks like its own host to NCCL: NCCL_HOSTID per rank, NCCL_NET=Socket,
// NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1 (tests/common/per_rank_host.sh).
//
// Buffers: device (or managed) memory of this communicator's device; a host pointer is an
// InvalidArgument naming the collective (NCCL would fault on it). The engine does not yet keep
// its buffers on the device, so the engine cannot use this transport yet (docs/gpu.md).
//
// Streams and ordering: one stream per role (below). A collective first makes its role stream
// wait, through an event, for the work already queued on the caller's stream (setCallerStream;
// default: the legacy default stream), then runs on the role stream and records a completion
// event. Work::test()/wait() query that event; nothing here synchronises the device or a stream.
//
// Errors: communicators are nonblocking (ncclConfig_t::blocking = 0), so no NCCL call can hang
// the host. Every wait (creation, split, enqueue, completion) polls ncclCommGetAsyncError; on an
// asynchronous error or after NcclOptions::timeout_s seconds (HSDP_TIMEOUT_S) the communicator
// is aborted (ncclCommAbort) and the Status names the rank, the collective and NCCL's message. An
// aborted communicator fails every later call with that first error. While the watchdog runs
// (hsdp/watchdog.h) with a timeout no longer than this one, the watchdog ends the job instead,
// naming the ranks that did not arrive, like on every other transport.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>

#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace hsdp::nccl {

struct NcclOptions {
  // CUDA device; -1: the rank's index on its host modulo the visible devices.
  int device = -1;
  // Longest wait for one NCCL operation (creation, split, a collective) before the communicator
  // is aborted; <= 0 waits forever (asynchronous errors still abort).
  double timeout_s = 600;
  // HSDP_CUDA_DEVICE and HSDP_TIMEOUT_S (its old name HSDP_NCCL_TIMEOUT_S, with a warning), or
  // the defaults above.
  static StatusOr<NcclOptions> fromEnv();
};

// The roles that get their own stream. Why separate streams: a role's Work waits only on its own
// completion events, and the caller can order compute against one role (e.g. the next layer's
// forward waits on the parameter gather only) with an event on that role's stream. NCCL itself
// runs the collectives of one communicator in the order they were issued, whatever their
// streams; concurrency between roles comes from the engine giving each role its own
// communicator (the parameter gathers and the gradient reductions, Mesh::intraShardReduce()).
enum class StreamRole {
  kAllGather,      // parameter gathers (forward, backward prefetch)
  kReduceScatter,  // gradient reduce-scatter
  kAllReduce,      // replica all-reduce of gradient shards
  kControl,        // broadcast and barrier: setup-time traffic, never behind a large transfer
};
const char* streamRoleName(StreamRole role);
// The stream a collective of `kind` runs on; a group (igroup) runs on its first operation's.
StreamRole streamRoleOf(CollectiveOp::Kind kind);

class NcclComm final : public Comm {
 public:
  // Collective over `bootstrap`, which the new communicator owns from now on.
  static StatusOr<std::unique_ptr<NcclComm>> create(std::unique_ptr<Comm> bootstrap,
                                                    const NcclOptions& options);
  // Finalises the NCCL communicator (waiting at most the timeout, then aborting). Callers wait
  // for their Work before destroying the communicator.
  ~NcclComm() override;

  int rank() const override;
  int size() const override;
  const char* transportName() const override { return "nccl"; }

  // ncclCommSplit (and the bootstrap's split alongside); collective.
  StatusOr<std::unique_ptr<Comm>> split(int color, int key) override;
  // The bootstrap's host groups, then ncclCommSplit with one color per host.
  StatusOr<std::unique_ptr<Comm>> splitByHost() override;
  // NCCL needs no scratch from hsdp.
  Status reserveScratch(size_t bytes) override { return okStatus(); }
  size_t scratchBytes() const override { return 0; }
  // Aborts the NCCL communicator (so no kernel keeps the GPU waiting), then the job through the
  // bootstrap.
  [[noreturn]] void abortJob(int code) override;

  int device() const;
  cudaStream_t stream(StreamRole role) const;
  // The stream whose queued work every collective waits for before touching its buffers
  // (nullptr, the default: the legacy default stream).
  void setCallerStream(cudaStream_t stream);
  // Aborts the NCCL communicator now (ncclCommAbort): in-flight collectives stop and every later
  // call fails with `reason`. For fault handling and tests.
  void abort(const Status& reason);
  bool aborted() const;
  Comm& bootstrap();
  const NcclOptions& options() const;
  // Control messages on host memory go over the bootstrap (MPI).
  Comm& hostComm() override { return bootstrap(); }

  struct State;  // defined in nccl_comm.cc

 protected:
  // A usable communicator and device buffers of its device (NCCL would fault on a host pointer).
  Status checkArgs(const CallArgs& args) const override;
  // Why: NCCL collectives are launched by the caller's thread onto streams ordered after the
  // caller's stream, in program order (no progress-driven issue as in the host schedules), so
  // the fingerprint comparison blocks before the launch and cannot deadlock.
  bool comparesBeforeStart() const override { return true; }
  StatusOr<WorkHandle> startAllGather(const void* send, void* recv, size_t count,
                                      DType dtype) override;
  // ncclSend/ncclRecv of every run to and from every peer in one group on the all-gather
  // stream, each run received where it lies (this rank's runs copied device to device first).
  StatusOr<WorkHandle> startAllGatherRuns(const void* send, void* recv, const BlockRuns& layout,
                                          DType dtype, void* pack) override;
  StatusOr<WorkHandle> startReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                          RedOp op) override;
  StatusOr<WorkHandle> startAllReduce(void* buf, size_t count, DType dtype, RedOp op) override;
  // Device buffers: the default's host-side packing does not apply; Unimplemented (the schedules
  // that use it run on host memory).
  StatusOr<WorkHandle> startReduceScatterRuns(const void* send, void* recv, const BlockRuns& layout,
                                              DType dtype, RedOp op, void* pack) override;
  // ncclSend/ncclRecv to and from every rank in one group, on the reduce-scatter stream (the
  // quantized reduce-scatter exchanges its codes with it).
  StatusOr<WorkHandle> startAllToAll(const void* send, void* recv, size_t count,
                                     DType dtype) override;
  // One fused launch: ncclGroupStart, the operations in order, ncclGroupEnd, all on the stream
  // of the first operation's role (streamRoleOf), and one completion event recorded after the
  // group ended (NCCL enqueues nothing before). Every argument, and the group's independence,
  // was checked by igroup before, so nothing is started for a bad one. Groups longer than 2048
  // operations (the limit NCCL documented up to 2.11) go out as consecutive groups on that
  // stream.
  bool fusesGroups() const override { return true; }
  StatusOr<WorkHandle> startGroup(std::span<const CollectiveOp> ops) override;
  // In place on `buf`, on the control stream; returns once complete.
  Status runBroadcast(void* buf, size_t count, DType dtype, int root) override;
  // NCCL has no barrier: a one-element all-reduce on the control stream, waited for.
  Status runBarrier() override;

 private:
  // The watchdog's trace of this communicator, over its bootstrap's members.
  Status traceOverBootstrap();
  explicit NcclComm(std::shared_ptr<State> state);
  // One collective launched on its role's stream (a completed Work for zero elements).
  StatusOr<WorkHandle> startOne(const CollectiveOp& o);
  std::shared_ptr<State> s_;  // shared with the Work handles in flight
};

// Builds an NCCL communicator over the members of `bootstrap`, in its rank order. Collective over
// `bootstrap`. The first form takes a private duplicate (bootstrap.split(0, rank)) so the caller
// keeps its communicator; the others take ownership. Options come from the environment unless
// given. A rank whose CUDA set-up fails (no device, a bad HSDP_CUDA_DEVICE) makes creation fail on
// every rank, rather than leave the others waiting in NCCL's initialisation.
StatusOr<std::unique_ptr<Comm>> createNcclComm(Comm& bootstrap);
StatusOr<std::unique_ptr<Comm>> createNcclComm(std::unique_ptr<Comm> bootstrap);
StatusOr<std::unique_ptr<Comm>> createNcclComm(std::unique_ptr<Comm> bootstrap,
                                               const NcclOptions& options);

}  // namespace hsdp::nccl
