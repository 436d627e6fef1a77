// Internal to the engine: ShardedModel's state, shared by the files that implement it, one per
// concept:
//   sharded_model.cc    create (configuration checks), registration, small accessors,
//                       setParameter, gatherFullParameters
//   allocate.cc         finalize (every buffer, once) and the memory report beside it
//   unshard.cc          unshard / waitForUnshard / reshard, param(), copy-out, the gather path
//   reduce.cc           grad(), copy-in, reduceGrad and the reductions in flight
//   step.cc             step(): clipping, Adam per decay span, CPU offload, post-step gathers
//   checkpoint/save.cc  save / saveAsync / waitForSave: snapshot, background writer, commit
//   checkpoint/load.cc  load / loadWeights: reading pieces, installing them into the shards
// The fields are grouped by who owns them; each group says which file writes it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/buffer_pool.h"
#include "engine/memory_space.h"
#include "hsdp/cpu_adam.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/host_buffer.h"
#include "hsdp/sharded_model.h"
#include "offload/step_queue.h"

// The checkpoint format's types the save/load methods below return (storage/format.h, included
// by the checkpoint's files only: the model's state does not depend on the format).
namespace hsdp::ckpt {
struct UnitDesc;
struct MeshDesc;
struct FilePlan;
}  // namespace hsdp::ckpt

namespace hsdp::engine {

// A contiguous run of a unit's shard whose parameters all take AdamW's weight decay, or all do
// not (ParamSpec::weight_decay); the shard's padding joins its neighbour. Offsets are in
// elements from the start of the shard.
struct DecaySpan {
  size_t begin = 0;
  size_t n = 0;
  bool decay = true;
};

struct Unit {
  std::string name;
  FlatLayout layout;
  bool frozen = false;  // UnitOptions::frozen: no gradient, no optimizer state, never reduced
  std::vector<DecaySpan> decay_spans;  // this rank's shard; one span when every param decays

  // ---- memory (allocate.cc), allocated once in finalize() ----
  // This rank's shard of the flat buffer: fp32 master parameters, gradient and Adam moments.
  // zero1/zero2 keep the parameters whole instead (full_params; the master shard is its slice
  // k), and zero1 keeps the whole gradient too (full_grad_buf). All in the engine's memory
  // space (host or device, engine/memory_space.h); with CPU offload the moments are host memory.
  SpaceBuffer param_shard, grad_shard, exp_avg, exp_avg_sq;
  SpaceBuffer full_params, full_grad_buf;
  // With CPU offload: the fp32 master shard and a host copy of the gradient shard (the moments
  // above are host memory too); the step's job copies grad in, steps, copies the master back.
  HostBuffer host_master, host_grad;
  // With offload on a device and bf16 parameters: the bf16 copy the CPU Adam writes, uploaded
  // into shard16 (on the host the CPU Adam writes shard16 itself).
  HostBuffer host16;
  // The space's per-unit offload state (pinned registrations, copy events); declared after the
  // host buffers so that it goes first (unpins before they are freed).
  std::unique_ptr<MemorySpace::OffloadSlot> offload;
  // Mixed precision: the bf16 rounding of the master shard (what the all-gather sends) and the
  // bf16 gradient shard the reduce-scatter lands in.
  SpaceBuffer shard16, grad16;
  // hpZ: this rank's intra-node block of the unit's parameters (J shards), kept from forward.
  SpaceBuffer hpz_block;
  // int8/int4 parameter wire: the fp32 master shard encoded for the gathers (hsdp/quantize.h),
  // refreshed after every optimizer step and setParameter (step.cc), so that all gathers of a
  // step (zero3: forward and backward) send and decode the same codes.
  SpaceBuffer encoded_shard;
  bool encoded_valid = false;
  // Error feedback of the encoded gradient wires: what this rank's encodings of the unit's
  // gradient dropped last step, added to what it sends next (zeros at first): the inter
  // reduce-scatter's (J-1 pieces of the shard) and the replica all-reduce's.
  SpaceBuffer grad_residual, replica_residual;

  // ---- the gather path (unshard.cc) ----
  bool hpz_valid = false;
  bool deferred = false;       // unshard() was rate-limited: the gather is not issued yet
  void* gathered16 = nullptr;  // in-flight bf16 pool block of the gather
  float* gathered = nullptr;   // full parameters while unsharded (pool block, or the shard)
  WorkHandle gather;           // the all-gather in flight between unshard() and its wait
  bool unsharded = false;

  // ---- the gradient path (reduce.cc) ----
  void* full_grad16 = nullptr;  // in-flight bf16 pool block of the reduce-scatter
  float* full_grad = nullptr;   // full gradient while backward writes it (pool block, or shard)
  bool grad_pending = false;    // reduceGrad() started, not yet complete
  bool grad_reduced = false;

  // ---- the optimizer step (step.cc) ----
  int64_t step_ticket = 0;    // StepQueue ticket of this unit's pending offloaded step; 0: none
  int64_t launched_step = 0;  // the optimizer step whose job was last submitted
};

// A gradient on its way to the shard: reduce-scatter over the shard group, then all-reduce over
// the replicas. Kept in reduceGrad() order; the replica all-reduces are started in that order
// too, so every rank issues them identically on the replica communicator.
struct PendingReduce {
  int unit = 0;
  WorkHandle scatter;    // full gradient -> shard (shard group), null in mode none
  WorkHandle replicate;  // shard all-reduce over the data-parallel replicas
  bool scatter_done = false;
};

// One piece of copyOutParams / copyInGrads as checkTensors planned it.
struct PlannedCopy {
  float* user;    // the caller's tensor
  size_t offset;  // of its parameter in the flat buffer
  size_t n;
  size_t k;  // index in the caller's list, for messages
};

// EngineConfig::clip_norm's check (finite, >= 0): create() and load (a checkpoint's) use it.
[[nodiscard]] Status checkClipNorm(float clip_norm);

// The checkpoint writer's state (engine/checkpoint/save.cc): the snapshot buffer, allocated once
// and reused by every save (and as staging by load), and the background writer thread.
struct Saver;
struct SaverDeleter {
  void operator()(Saver* s) const;  // joins the writer
};

}  // namespace hsdp::engine

namespace hsdp {

struct ShardedModel::Impl {
  using Unit = engine::Unit;

  // ---- configuration (sharded_model.cc: create) ----
  const Mesh* mesh = nullptr;
  EngineConfig cfg;  // resolved: every optional has its value
  int shards = 1;    // shard group size used for layouts (1 in mode none)
  bool hierarchical = true;
  bool finalized = false;
  std::vector<Unit> units;
  // Where every buffer lives and how the operations on them run (host or CUDA). The host
  // space waits for collectives on the calling thread and counts that as exposed time.
  std::unique_ptr<MemorySpace> space;
  // Gathers and reductions run on separate communicators (mesh.h): both are in flight at once.
  std::unique_ptr<HierarchicalCollectives> hier;         // parameter all-gathers
  std::unique_ptr<HierarchicalCollectives> hier_reduce;  // gradient reduce-scatters
  // An encoded replica wire (replica_wire bf16/int8/int4): the replica all-reduce as the
  // schedules' encoded all-reduce over the data-parallel communicator split by node (the
  // replicas on this node; one per node); built by finalize().
  std::unique_ptr<Comm> replica_intra, replica_inter;
  std::unique_ptr<HierarchicalCollectives> replica_coll;
  // Every host shard is stepped by the SIMD CPU Adam (bitwise equal to adamStep, ~4x faster).
  std::unique_ptr<CpuAdam> cpu_adam;
  NumaTopology numa;
  std::unique_ptr<StepQueue> queue;  // offload: steps run here, off the training thread

  // ---- the gather path (unshard.cc) ----
  BufferPool pool;           // fp32 full-size blocks: gathered parameters, full gradients
  BufferPool pool16;         // bf16 full-size blocks: gathered parameters, gradients on the wire
  int gathered_alive = 0;    // zero3 units holding a gathered block
  std::deque<int> deferred;  // rate-limited unshard() calls, in call order
  // copyOutParams / copyInGrads scratch, reused: no allocation once grown.
  std::vector<engine::PlannedCopy> copy_plan;
  std::vector<CopyPiece> copy_pieces;
  std::vector<char> copy_seen;

  // ---- the gradient path (reduce.cc) ----
  std::deque<engine::PendingReduce> pending;

  // ---- the optimizer step (step.cc) ----
  int64_t step = 0;
  // Global gradient norm of the last step; on a device read back from it when first asked
  // (with clipping, in step()).
  mutable float last_grad_norm = 0;
  mutable bool norm_pending = false;
  std::vector<CollectiveOp> group_ops;  // step()'s post-step gathers, reused every step
  std::vector<void*> blocks16;
  std::vector<int> group_units;  // the unit of each of them

  // ---- checkpoints (checkpoint/save.cc, checkpoint/load.cc) ----
  // Declared last: destroyed first, so the writer thread is joined while everything it may
  // touch (the memory space its pinned snapshot belongs to) is alive.
  std::unique_ptr<engine::Saver, engine::SaverDeleter> saver;
  bool job_marker_agreed = false;  // files::setJobMarker called with rank 0's marker (save.cc)

  // ---- mode policy (here: one line each) ----
  bool onDevice() const { return cfg.device == Device::kCuda; }
  // zero1/zero2 over a real shard group: parameters replicated, optimizer state sharded.
  bool replicatedParams() const {
    return shards > 1 && (cfg.mode == ShardMode::kZero1 || cfg.mode == ShardMode::kZero2);
  }
  // Full gradients come from the pool (and return to it after the reduce-scatter).
  bool pooledGrads() const {
    return shards > 1 && (cfg.mode == ShardMode::kZero2 || cfg.mode == ShardMode::kZero3);
  }
  bool bf16Params() const { return shards > 1 && cfg.param_dtype == DType::kBFloat16; }
  // Gathers move the encoded master shard (int8/int4 parameter wire across nodes, zero3).
  bool encodedParams() const {
    return shards > 1 && hierarchical && cfg.mode == ShardMode::kZero3 && hier->gatherQuantizes();
  }
  WireFormat paramWire() const { return {*cfg.inter_param_wire, *cfg.quant_block}; }
  bool bf16Reduce() const { return shards > 1 && cfg.reduce_dtype == DType::kBFloat16; }
  // This rank's shard index in every unit's layout.
  int shardIndex() const { return shards == 1 ? 0 : mesh->coords().shard_rank; }
  // The replicas of a shard. Mode none (a shard group of one) reduces over the world on the
  // host (every rank is a replica); on a device over the replica communicator, which has the
  // same members and is the engine's own (the world is the user's, with the user's streams).
  Comm& dataParallel() const {
    return shards == 1 && !onDevice() ? mesh->world() : mesh->replica();
  }
  // The fp32 master shard: with bf16 parameters in zero1/zero2 the whole copy holds bf16
  // roundings for compute, so the master slice lives apart, in param_shard.
  float* master(Unit& u) const {
    if (replicatedParams() && cfg.param_dtype != DType::kBFloat16)
      return u.full_params.as<float>() + mesh->coords().shard_rank * u.layout.shardNumel();
    return u.param_shard.as<float>();
  }

  Status checkUnit(int u, const char* verb) const;
  // allocate.cc
  Status createReplicaWire();
  Status allocateResiduals(Unit& u);
  // Waits (host) or orders `lane` (device) for `w`, counting host waiting as exposed time.
  Status blockOn(WorkHandle& w, Lane lane = Lane::kCompute) {
    return space->reached(w, lane, /*block=*/true).status();
  }

  // unshard.cc
  Status issueGather(Unit& u);
  Status issueDeferred();
  StatusOr<WorkHandle> gatherAny(const void* shard, void* full, size_t count, DType t);
  // The all-gathers `ops` of the units `op_units` (one per op), as one Work.
  StatusOr<WorkHandle> gatherGroup(std::span<const CollectiveOp> ops,
                                   std::span<const int> op_units);
  Status checkTensors(Unit& u, std::span<const TensorRef> tensors, const char* verb,
                      bool into_flat);
  Status runCopies(Unit& u, std::span<const TensorRef> tensors, const char* verb, float* flat,
                   bool into_flat);

  // reduce.cc
  Status ensureGrad(Unit& u, const char* verb, std::string_view param);
  StatusOr<WorkHandle> reduceScatter(Unit& u, const void* full, void* shard, DType t);
  StatusOr<WorkHandle> replicaAllReduce(Unit& u);
  Status pollReductions(bool block);

  // step.cc
  // zero1/zero2: all-gathers every unit's updated master slices back into the whole parameters
  // (bf16: the roundings); frozen units too with `frozen_too` (after a load).
  Status gatherReplicated(bool frozen_too);
  Status refresh16(Unit& u);
  Status refreshEncoded(Unit& u);
  Status readNorm() const;
  Status launchStep(Unit& u, int64_t t, float scale);
  Status waitForStep(Unit& u);

  // checkpoint/save.cc, checkpoint/load.cc
  // OK between step() and the next forward: no unit unsharded, no reduction in flight.
  Status checkIdle(const char* verb) const;
  // Collective over the world: every rank's `local`; the first failure (lowest rank) on every
  // rank, the same message everywhere.
  // Every rank's outcome, the same on all: the first error by rank, preferring a cause over a
  // consequence (`secondary`: this rank failed because another did, e.g. rank 0's commit that
  // saw a peer's write fail), so every rank names the root cause.
  Status agree(const Status& local, bool secondary = false);
  // Sets every rank's files::jobMarker() to rank 0's (a world collective).
  Status agreeJobMarker();
  std::vector<ckpt::UnitDesc> unitDescs() const;
  ckpt::MeshDesc meshDesc() const;
  int pieceReplicas() const { return mesh->shape().replicas(); }
  ckpt::FilePlan myPlan() const;
  // The snapshot/staging buffer, sized for myPlan() (allocated on first use, then reused).
  Status ensureSaver();
  // Returns once the save in flight (if any) has copied what it reads from the training state
  // (host memory: its copier thread; device memory is ordered by the copy stream): called by
  // whatever changes that state (step, an offloaded unit's step, setParameter).
  Status waitForSnapshot();
  void* stagingData() const;
  // Fills the staging buffer's chunks of states < `states` through `read`, then (collective)
  // all-gathers them over the replicas into the engine's shards and refreshes what derives from
  // them. `read` fills `count` elements from `start` of parameter `param` of unit `unit`.
  Status installFromStaging(int states);
};

}  // namespace hsdp
