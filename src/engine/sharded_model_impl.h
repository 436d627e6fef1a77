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
// and the owners they stand on:
//   unit_state.h        a unit's parameter and gradient state machines, checked in one place
//   memory_space.h      the memory space the buffers live in (core/memory_space.h's seam)
//   unit_collectives.h  every gather and reduction of a unit, the route each takes, and the
//                       space's collectives (waiting for any collective goes through it)
//   optimizer_step.h    the CPU Adam, offload's worker and NUMA placement, the gradient norm,
//                       the space's step kernels and host copies (offload, snapshots)
// The fields are grouped by who owns them; each group says which file writes it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/host_buffer.h"
#include "engine/buffer_pool.h"
#include "engine/elastic_group.h"
#include "engine/memory_space.h"
#include "engine/optimizer_step.h"
#include "engine/unit_collectives.h"
#include "engine/unit_state.h"
#include "hsdp/sharded_model.h"

// The checkpoint format's types the save/load methods below return (storage/format.h, included
// by the checkpoint's files only: the model's state does not depend on the format).
namespace hsdp::ckpt {
struct UnitDesc;
struct SavedUnder;
struct FilePlan;
}  // namespace hsdp::ckpt

namespace hsdp::engine {

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
  // With CPU offload on a device: host copies of the fp32 master shard and of the gradient shard
  // (the moments above are host memory too); the step's job copies grad in, steps, copies the
  // master back. On host memory the shards themselves are NUMA-placed and stepped in place.
  HostBuffer host_master, host_grad;
  // With offload on a device and bf16 parameters: the bf16 copy the CPU Adam writes, uploaded
  // into shard16 (on the host the CPU Adam writes shard16 itself).
  HostBuffer host16;
  // The space's per-unit offload state (pinned registrations, copy events; HostCopies); declared
  // after the host buffers so that it goes first (unpins before they are freed).
  std::unique_ptr<HostCopies::OffloadSlot> offload;
  // Mixed precision: the bf16 rounding of the master shard (what the all-gather sends) and the
  // bf16 gradient shard the reduce-scatter lands in.
  SpaceBuffer shard16, grad16;
  // hpZ: this rank's intra-node block of the unit's parameters (J shards), kept from forward.
  SpaceBuffer hpz_block;
  // int8/int4 parameter wire: the fp32 master shard encoded for the gathers (hsdp/quantize.h),
  // refreshed wherever the master changes (finalize, every optimizer step, setParameter, load),
  // so that all gathers of a step (zero3: forward and backward) send and decode the same codes.
  SpaceBuffer encoded_shard;
  // Error feedback of the encoded gradient wires: what this rank's encodings of the unit's
  // gradient dropped last step, added to what it sends next (zeros at first): the inter
  // reduce-scatter's (J-1 pieces of the shard) and the replica all-reduce's.
  SpaceBuffer grad_residual, replica_residual;

  // ---- the lifecycle (engine/unit_state.h): where the unit is and what that state holds ----
  ParamLifecycle params;  // unshard.cc
  GradLifecycle grads;    // reduce.cc, step.cc
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

// copyOutParams / copyInGrads scratch (unshard.cc), reused: no allocation once grown.
struct CopyScratch {
  std::vector<PlannedCopy> plan;
  std::vector<CopyPiece> pieces;
  std::vector<char> seen;  // per parameter of the unit: named by a tensor already
};

// The full-size blocks gathered parameters and full gradients live in while a unit is
// unsharded or its gradient written, and the rate limiter's count of them (unshard.cc).
struct Blocks {
  BufferPool pool;           // fp32: gathered parameters, full gradients
  BufferPool pool16;         // bf16: gathered parameters, gradients on the wire
  int gathered_alive = 0;    // zero3 units holding a gathered block
  std::deque<int> deferred;  // rate-limited unshard() calls (Deferred units), in call order
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
  bool finalized = false;
  std::vector<Unit> units;
  // Where every buffer lives and how the local operations on them run (host or CUDA). Declared
  // before coll and opt, which own the rest of the space's bundle and may refer to it (device:
  // its streams), so that it goes last.
  std::unique_ptr<MemorySpace> space;
  // Every gather and reduction of a unit, the route each takes, and the space's collectives
  // (engine/unit_collectives.h). The host space waits for collectives on the calling thread and
  // counts that as exposed time.
  std::unique_ptr<engine::UnitCollectives> coll;
  // The optimizer step: the CPU Adam, offload's worker and NUMA placement, the gradient norm,
  // the space's step kernels and host copies (engine/optimizer_step.h). Declared after coll:
  // the device's norm runs on its collectives.
  std::unique_ptr<engine::OptimizerStep> opt;

  // ---- the gather path (unshard.cc) ----
  engine::Blocks blocks;
  engine::CopyScratch copies;

  // ---- the gradient path (reduce.cc) ----
  std::deque<engine::PendingReduce> pending;

  // ---- the optimizer step (step.cc) ----
  int64_t step = 0;
  // gradNorm() computed the norm of the gradients step() is about to apply (reduceGrad and
  // step() clear it): step() clips with it instead of computing it again.
  bool norm_ready = false;

  // ---- elastic mode (elastic.cc): this rank's part of its replica group; null when off ----
  std::unique_ptr<engine::ElasticGroup> elastic;

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
  // CPU offload with the shards in device memory: the CPU Adam steps host copies of the master
  // and gradient (host_master, host_grad). On host memory it steps the shards in place.
  bool stagedOffload() const { return opt->offloaded() && onDevice(); }
  bool bf16Params() const { return shards > 1 && cfg.precision.param_dtype == DType::kBFloat16; }
  // Gathers move the encoded master shard (int8/int4 parameter wire across nodes, zero3).
  bool encodedParams() const {
    return shards > 1 && cfg.mode == ShardMode::kZero3 && coll->gatherQuantizes();
  }
  WireFormat paramWire() const { return {*cfg.wires.inter_param_wire, *cfg.wires.quant_block}; }
  bool bf16Reduce() const { return shards > 1 && cfg.precision.reduce_dtype == DType::kBFloat16; }
  // This rank's shard index in every unit's layout.
  int shardIndex() const { return shards == 1 ? 0 : mesh->coords().shard_rank; }
  // The fp32 master shard: with bf16 parameters in zero1/zero2 the whole copy holds bf16
  // roundings for compute, so the master slice lives apart, in param_shard.
  float* master(Unit& u) const {
    if (replicatedParams() && cfg.precision.param_dtype != DType::kBFloat16)
      return u.full_params.as<float>() + mesh->coords().shard_rank * u.layout.shardNumel();
    return u.param_shard.as<float>();
  }

  Status checkUnit(int u, const char* verb) const;
  // allocate.cc
  Status allocateResiduals(Unit& u);
  // Waits (host) or orders `lane` (device) for `w`, counting host waiting as exposed time.
  Status blockOn(WorkHandle& w, Lane lane = Lane::kCompute) {
    return coll->reached(w, lane, /*block=*/true).status();
  }

  // unshard.cc
  // Names `verb` in its state error.
  Status issueGather(Unit& u, std::string_view verb);
  Status issueDeferred();
  Status checkTensors(Unit& u, std::span<const TensorRef> tensors, const char* verb,
                      bool into_flat);
  Status runCopies(Unit& u, std::span<const TensorRef> tensors, const char* verb, float* flat,
                   bool into_flat);

  // reduce.cc
  Status ensureGrad(Unit& u, const char* verb, std::string_view param);
  Status pollReductions(bool block);

  // step.cc
  // zero1/zero2: all-gathers every unit's updated master slices back into the whole parameters
  // (bf16: the roundings); frozen units too with `frozen_too` (after a load).
  Status gatherReplicated(bool frozen_too);
  Status refresh16(Unit& u);
  Status refreshEncoded(Unit& u);
  engine::ShardStep shardStep(Unit& u);
  Status launchStep(Unit& u, int64_t t, float scale);
  // Waits for the reductions, checks every trainable unit has its reduced gradient (`what`
  // names the caller), and computes the global gradient norm unless norm_ready (step.cc).
  Status reducedGradients(const char* what);
  Status computeNorm();
  Status waitForStep(Unit& u);

  // elastic.cc
  // finalize(): joins the elastic job (when configured) with the model's fingerprint.
  Status startElastic(uint64_t signature);
  // step(): the replica average over the groups and the quorum's decision (true: apply).
  StatusOr<bool> elasticCommit();

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
  ckpt::SavedUnder savedUnder() const;
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
