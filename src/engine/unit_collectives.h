// The one owner of a unit's collectives: it holds the hierarchical schedules of the parameter
// gathers and the gradient reductions, the encoded replica wire (its communicators and its
// schedule), and decides every route: the two-level host schedules or one collective over the
// shard group through the space's collectives, the exact or the encoded wire, the hpZ node group,
// the data-parallel communicator of the replicas. The engine's files ask for a gather, a
// reduce-scatter or a replica reduction and never pick a route themselves. It owns the space's
// collectives (SpaceCollectives, core/memory_space.h: on a device the NCCL collectives and the
// events a lane waits on), binds the mesh's communicators to their lanes, and is where the
// engine waits for any collective (reached, poll). The engine's other collectives come this way
// too: the control plane's small blocking ones on host memory (agreement on an outcome, the
// registration check, an elastic group's decisions), the communicator the gradient norm is summed
// over, and the average over elastic replica groups.
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/memory_space.h"
#include "engine/trace.h"
#include "hsdp/config.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"

namespace hsdp::engine {

class ElasticGroup;
class ReduceChain;

class UnitCollectives {
 public:
  struct Options {
    int shards = 1;              // shard group size of the layouts (1 in mode none)
    bool hierarchical = true;    // the two-level host schedules (false on a device)
    bool on_device = false;      // the replica all-reduce of mode none runs on mesh.replica()
    bool hpz = false;            // hpZ's node gathers run on mesh.intraShard() (bound on a device)
    HierOptions gather, reduce;  // the schedules' options per direction (wires, pipelining)
    WireFormat replica_wire;     // fp32: the transport's exact all-reduce
  };
  // Builds the schedules over the mesh's communicators and, on a device, binds the communicators
  // the space's collectives run on to their lanes; nothing collective yet.
  static StatusOr<std::unique_ptr<UnitCollectives>> create(const Mesh& mesh,
                                                           std::unique_ptr<SpaceCollectives> space,
                                                           const Options& options);

  // finalize(), collective over the replicas: the encoded replica wire's communicators, the
  // replicas on this node (reduced in fp32) and one per node (where the encoded bytes cross),
  // so that bytes cross nodes once per node as in a hierarchical all-reduce.
  [[nodiscard]] Status connectReplicas();
  // finalize(): every schedule's scratch for shards of up to `max_shard` elements (bf16 ones
  // too with `bf16`), so that no collective allocates while training.
  [[nodiscard]] Status reserve(size_t max_shard, bool bf16);

  bool hierarchical() const { return opt_.hierarchical; }
  // Gathers of the encoded master (int8/int4 parameter wire across nodes).
  bool gatherQuantizes() const { return opt_.hierarchical && hier_->gatherQuantizes(); }
  // Error-feedback residual sizes of a shard of `n` elements (0: none needed).
  size_t gradResidualCount(size_t n) const;
  size_t replicaResidualCount(size_t n) const;
  // The replicas of a shard. Mode none (a shard group of one) reduces over the world on the
  // host (every rank is a replica); on a device over the replica communicator, which has the
  // same members and is the engine's own (the world is the user's, with the user's streams).
  Comm& dataParallel() const;
  bool hasReplicas() const { return dataParallel().size() > 1; }
  // Scratch of the schedules and of every mesh communicator (the memory report's comm bytes).
  size_t scratchBytes() const;

  // ---- parameters ----
  // `shard` (count elements) of every shard-group rank into `full`.
  StatusOr<WorkHandle> gather(const void* shard, void* full, size_t count, DType t);
  // The fp32 master, exactly, whatever the parameter wire (gatherFullParameters).
  StatusOr<WorkHandle> gatherExact(const float* master, void* full, size_t count);
  // The master encoded for the int8/int4 wire (gatherQuantizes()), decoded into `full`.
  StatusOr<WorkHandle> gatherEncoded(const void* codes, float* full, size_t count);
  // hpZ: the node blocks of `count` elements, re-gathered inside the node only.
  StatusOr<WorkHandle> gatherNodeBlock(const void* block, float* full, size_t count);
  // zero1/zero2's gathers of the updated parameters after step(), one per unit, filled by the
  // caller (clear(), then one entry per unit); reused every step: no allocation once grown.
  struct Group {
    std::vector<CollectiveOp> ops;
    std::vector<std::string_view> labels;  // the unit of each, named for the watchdog
    std::vector<int> units;                // the unit of each
    std::vector<void*> blocks16;           // bf16 parameters: the pool block of each
    void clear();
    void reserve(size_t n);
  };
  Group& group() { return group_; }
  // The group's all-gathers, as one Work. The host schedules keep them all in flight
  // (pipelined in start order); otherwise one group (on a device one fused NCCL launch).
  StatusOr<WorkHandle> gatherGroup();

  // load: `count` elements of every replica into `recv`, fp32, on the replica communicator.
  StatusOr<WorkHandle> replicaGather(const void* send, void* recv, size_t count);

  // ---- waiting (SpaceCollectives::reached, poll) ----
  // Whether work on `lane` may use the result of `w` (host: with `block`, waits, counting the
  // wait as exposed communication when `exposed`; device: `lane` waits for it, true at once).
  StatusOr<bool> reached(WorkHandle& w, Lane lane, bool block, bool exposed = true) {
    return space_->reached(w, lane, block, exposed);
  }
  // Surfaces errors of collectives reached earlier.
  [[nodiscard]] Status poll() { return space_->poll(); }
  double takeExposedSeconds() { return space_->takeExposedSeconds(); }

  // ---- the control plane: small blocking collectives on host memory over the mesh's control
  // communicator (Mesh::control(): the world, or its host bootstrap on a device transport) ----
  int controlRank() const { return mesh_.control().rank(); }
  int controlSize() const { return mesh_.control().size(); }
  // Every rank's outcome, the same on all: the first error by rank, preferring a cause over a
  // consequence (`secondary`: this rank failed because another did, e.g. rank 0's commit that
  // saw a peer's write fail), so every rank names the root cause.
  [[nodiscard]] Status agree(const Status& local, bool secondary = false);
  // Every rank's `count` elements at `mine`, in rank order, into `all`.
  [[nodiscard]] Status controlAllGather(const void* mine, void* all, size_t count, DType t);
  // Rank `root`'s `count` elements at `buf` on every rank.
  [[nodiscard]] Status controlBroadcast(void* buf, size_t count, DType t, int root);
  // `values` summed over every rank, in place.
  [[nodiscard]] Status controlSum(int64_t* values, size_t count);

  // ---- the trace and the step's accounting (trace.h): every event of a collective goes here ----
  Tracer& tracer() { return tracer_; }
  // finalize(), collective over the control communicator: each rank's clock offset to rank 0's
  // (the median over rounds of the exit of an all-gather), then the tracer's ring (off with "").
  [[nodiscard]] Status startTrace(const std::string& dir);
  // The links a unit's gather and reduce-scatter cross (intra, inter or both), the hpZ node
  // group's (intra).
  TraceLevel shardLevel() const { return shard_level_; }
  // The bytes this rank sent on each level (StepAccounting's bytes_*) since the last call, or
  // since startTrace() (finalize) for the first.
  void takeLevelBytes(StepAccounting* a);
  // With the trace on, after the tracer's endStep(): the step's bytes per level as "bytes sent"
  // events (intra, inter, replica, and the shard-group route as intra+inter).
  void traceLevelBytes();

  // ---- the gradient norm ----
  // What step()'s squared gradient norm is summed over (StepKernels::normReduce): the shard
  // group, whose shards make up the gradient (the replicas hold the same ones); null with a
  // shard group of one.
  Comm* normGroup() const { return opt_.shards > 1 ? &mesh_.shardGroup() : nullptr; }

  // ---- gradients ----
  // `full` -> this rank's `shard` (count elements), averaged over the shard group; `residual`:
  // the unit's error feedback of an int8/int4 inter wire (gradResidualCount floats) or null.
  StatusOr<WorkHandle> reduceScatter(const void* full, void* shard, size_t count, DType t,
                                     float* residual);
  // The fp32 shard averaged in place over the replicas: the transport's exact all-reduce, or
  // the encoded replica wire (with `residual`, replicaResidualCount floats, for error feedback).
  StatusOr<WorkHandle> replicaReduce(void* shard, size_t count, float* residual);
  // Whether reduceThenReplicate() is the gradient's road: fp32 shards on the host with replicas,
  // outside elastic mode (a device orders its lanes instead; bf16 upcasts and the elastic
  // average run between the two on the caller's thread).
  bool chainsReplica() const {
    return opt_.shards > 1 && !opt_.on_device && groups_ == nullptr && hasReplicas();
  }
  // The reduce-scatter of `full` into `shard` and, once it lands, the shard's replica all-reduce
  // in chunks of HSDP_REPLICA_CHUNK_BYTES, as one Work the progress loop drives
  // (engine/reduce_chain.h).
  StatusOr<std::unique_ptr<ReduceChain>> reduceThenReplicate(const float* full, float* shard,
                                                             size_t count, float* residual,
                                                             float* replica_residual,
                                                             std::string_view label);
  // The chains' turns on the replica communicator (call order, the same on every rank).
  bool replicaTurn(uint64_t seq) const { return seq == replica_turn_; }
  void replicaIssued(uint64_t seq) { replica_turn_ = seq + 1; }
  // A gather of the parameter path that crosses nodes (`cross_node`) is wrapped in a Work that
  // is listed until it is destroyed; crossNodeGatherInFlight(): one of them has not landed (the
  // chains hold their next chunk).
  void trackGather(WorkHandle& w, bool cross_node);
  void untrackGather(Work* w);  // the wrapper's destructor
  bool crossNodeGatherInFlight();
  // Elastic mode: the replica groups (ElasticGroup, not owned; it goes before this object).
  void attachGroups(ElasticGroup* groups) { groups_ = groups; }
  // The fp32 shard averaged over the elastic replica groups, started on the group's replica
  // worker in call order (reduceGrad's, the same on every group); nothing when none attached.
  [[nodiscard]] Status startGroupAverage(float* shard, size_t count);
  // The group's own collectives on a peer-transport Comm it built from the quorum's addresses
  // (hsdp/transport_registry.h), issued here like every other collective:
  // the fp32 shard averaged in place over `peers` (the step's replica Comm), started;
  StatusOr<WorkHandle> peerAverage(Comm& peers, float* shard, size_t count);
  // member `root`'s `buffers`, one after the other, on every member of `peers` (a heal: the
  // donor, then the groups it heals), in pieces of at most `piece_bytes`, so that the transport's
  // deadline without progress bounds one piece rather than the whole state. Returns the bytes.
  StatusOr<size_t> peerBroadcast(Comm& peers, std::span<const std::span<char>> buffers, int root,
                                 size_t piece_bytes);

 private:
  UnitCollectives(const Mesh& mesh, std::unique_ptr<SpaceCollectives> space,
                  const Options& options);

  const Mesh& mesh_;
  std::unique_ptr<SpaceCollectives> space_;
  Options opt_;
  // Gathers and reductions run on separate communicators (mesh.h): both are in flight at once.
  std::unique_ptr<HierarchicalCollectives> hier_;         // parameter all-gathers
  std::unique_ptr<HierarchicalCollectives> hier_reduce_;  // gradient reduce-scatters
  // The encoded replica wire (replica_wire bf16/int8/int4): the schedules' encoded all-reduce
  // over the data-parallel communicator split by node; built by finalize().
  std::unique_ptr<Comm> replica_intra_, replica_inter_;
  std::unique_ptr<HierarchicalCollectives> replica_;
  Group group_;
  ElasticGroup* groups_ = nullptr;
  Tracer tracer_;
  // The replica chains (guarded by progressLock(): the progress thread reads them).
  size_t replica_chunk_ = 0;  // elements per replica chunk (finalize(): HSDP_REPLICA_CHUNK_BYTES)
  uint64_t replica_next_ = 0, replica_turn_ = 0;
  std::vector<Work*> gathers_;  // the wrapped gathers' own works, alive
  TraceLevel shard_level_ = TraceLevel::kNone;
  // Comm::bytesSent() of the levels (intra, inter, replica, shard) at the last take.
  struct LevelBytes {
    uint64_t intra = 0, inter = 0, replica = 0, shard = 0;
  };
  LevelBytes levelBytes() const;
  LevelBytes level_base_, trace_base_;  // the accounting's and the trace's last readings
};

}  // namespace hsdp::engine
