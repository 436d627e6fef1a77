// Internal to the engine: ShardedModel's state (the facade's), shared by the four files that
// implement it:
//   sharded_model.cc    create, registration, finalize (every buffer, once) and the memory
//                       report, small accessors, setParameter, gatherFullParameters, and the
//                       lifecycle's verbs, forwarded to the owners below
//   step.cc             step(): clipping, Adam per decay span, CPU offload, post-step gathers;
//                       elastic mode's join, beginStep and commit
//   checkpoint/save.cc  save / saveAsync / waitForSave (snapshot, background writer, commit),
//                       exportSafetensors
//   checkpoint/load.cc  load / loadWeights: reading pieces, installing them into the shards
// and the owners they stand on:
//   unit.h              a unit: its name, layout and optimizer state
//   param_group.h       each unit's parameters (memory, lifecycle), the gathered blocks, the
//                       copy scratch: unshard, waitForUnshard, reshard, param, copy-out
//   grad_reducer.h      each unit's gradient (memory, lifecycle) and the reductions in flight:
//                       grad, copy-in, reduceGrad
//   unit_state.h        a unit's parameter and gradient state machines, checked in one place
//   memory_space.h      the memory space the buffers live in (core/memory_space.h's seam)
//   unit_collectives.h  every collective of the engine, the route each takes, and the space's
//                       collectives (waiting for any collective goes through it)
//   optimizer_step.h    the CPU Adam, offload's worker and NUMA placement, the gradient norm,
//                       the space's step kernels and host copies (offload, snapshots)
// The fields are grouped by who owns them; each group says which file writes it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/host_buffer.h"
#include "engine/buffer_pool.h"
#include "engine/config_check.h"
#include "engine/elastic_group.h"
#include "engine/grad_reducer.h"
#include "engine/memory_space.h"
#include "engine/optimizer_step.h"
#include "engine/outer_step.h"
#include "engine/param_group.h"
#include "engine/unit.h"
#include "engine/unit_collectives.h"
#include "engine/unit_state.h"
#include "hsdp/sharded_model.h"
#include "storage/io.h"

// The checkpoint format's types the save/load methods below return (storage/format.h, included
// by the checkpoint's files only: the model's state does not depend on the format).
namespace hsdp::ckpt {
struct UnitDesc;
struct SavedUnder;
struct FilePlan;
}  // namespace hsdp::ckpt

namespace hsdp::engine {

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

  // ---- the parameters (param_group.h): each unit's, the gathered blocks, the gather path ----
  std::unique_ptr<engine::ParamGroup> params;
  // ---- the gradients (grad_reducer.h): each unit's, the reductions in flight. Declared after
  // params, whose pools it borrows ----
  std::unique_ptr<engine::GradReducer> reducer;
  // A unit's parameters and gradient (`u` is one of `units`).
  int indexOf(const Unit& u) const { return static_cast<int>(&u - units.data()); }
  engine::UnitParams& paramsOf(const Unit& u) { return params->unit(indexOf(u)); }
  const engine::UnitParams& paramsOf(const Unit& u) const { return params->unit(indexOf(u)); }
  engine::UnitGrad& gradOf(const Unit& u) { return reducer->unit(indexOf(u)); }
  const engine::UnitGrad& gradOf(const Unit& u) const { return reducer->unit(indexOf(u)); }

  // ---- the optimizer step (step.cc) ----
  int64_t step = 0;
  // gradNorm() computed the norm of the gradients step() is about to apply (reduceGrad and
  // step() clear it): step() clips with it instead of computing it again.
  bool norm_ready = false;

  // ---- semi-synchronous replicas (outer_step.h; the two methods in step.cc) ----
  std::unique_ptr<engine::OuterSync> outer;
  std::vector<engine::OuterSync::Shard> outer_due;  // outerStep()'s list, reused every step
  // Before the first inner step since finalize or load: anchors := masters.
  Status anchorOuter();
  // After inner step `step`: the due units' replica sync and outer update.
  Status outerStep();

  // ---- elastic mode (step.cc): this rank's part of its replica group; null when off ----
  std::unique_ptr<engine::ElasticGroup> elastic;
  // (Its state says whether gradNorm() already had the step committed: Committed, which step()
  // applies without voting again.)

  // ---- checkpoints (checkpoint/save.cc, checkpoint/load.cc) ----
  // Declared last: destroyed first, so the writer thread is joined while everything it may
  // touch (the memory space its pinned snapshot belongs to) is alive.
  std::unique_ptr<engine::Saver, engine::SaverDeleter> saver;
  bool job_marker_agreed = false;  // files::setJobMarker called with rank 0's marker (save.cc)
  // Elastic mode: the save of a group that is not the writer (save.cc: saveAsync), returned by
  // the next waitForSave.
  std::optional<SaveResult> skipped_save;

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
  // roundings for compute, so the master slice lives apart, in the unit's parameter shard.
  float* master(const Unit& u) const {
    const engine::UnitParams& p = paramsOf(u);
    if (replicatedParams() && cfg.precision.param_dtype != DType::kBFloat16)
      return p.whole.as<float>() + mesh->coords().shard_rank * u.layout.shardNumel();
    return p.shard.as<float>();
  }

  Status checkUnit(int u, const char* verb) const;
  // sharded_model.cc (finalize)
  Status allocateResiduals(Unit& u);
  // Waits (host) or orders `lane` (device) for `w`, counting host waiting as exposed time.
  Status blockOn(WorkHandle& w, Lane lane = Lane::kCompute) {
    return coll->reached(w, lane, /*block=*/true).status();
  }

  // step.cc: a unit's gradient reductions landed (GradReducer::OnReduced).
  Status onReduced(int unit);

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

  // step.cc: elastic mode
  // finalize(): joins the elastic job (when configured) with the model's fingerprint.
  Status startElastic(uint64_t signature);
  // step() or gradNorm(), once per step: the replica average over the groups and the quorum's
  // decision. OK: committed (the group is Committed); kAborted: not committed, every unit's
  // gradient dropped (the loop runs the step again from beginStep()).
  Status elasticCommit(const char* what);

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
  // Elastic mode: the group that writes a checkpoint of the current state (save.cc); -1 when off.
  int checkpointWriter() const;
  // How many replicas split a shard's piece of a checkpoint: all of them (sync: each writes 1/R),
  // or 1 with a semi-synchronous policy (each replica writes its own state whole).
  int pieceReplicas() const { return outer->active() ? 1 : mesh->shape().replicas(); }
  // The model's chunks this rank loads and installs (indexed by unitDescs()'s tensors).
  ckpt::FilePlan myPlan() const;
  // ---- semi-synchronous checkpoints (the end of checkpoint/load.cc; docs/checkpoint.md) ----
  // The units a checkpoint holds: unitDescs(), or (local_sgd, diloco) the model's once per
  // replica, then (diloco) the outer anchor and momentum of every trainable unit.
  std::vector<ckpt::UnitDesc> checkpointUnits() const;
  // The data file of the rank at (shard, replica), indexed by checkpointUnits()'s tensors: sync,
  // its piece; semi-sync, its replica's whole shard, then (replica 0, diloco) the outer state's.
  ckpt::FilePlan savePlan(int shard, int replica) const;
  // Tensor `t` of checkpointUnits(): its unit's shard buffer (`host`: in host memory), `*unit`.
  const float* saveSource(const ckpt::TensorDesc& t, bool* host, const engine::Unit** unit);
  // The manifest's `replica_sync` (semi-sync), and load's check of a manifest's against the
  // model's: another policy, H, F, outer lr or momentum, or replica count is InvalidArgument
  // naming the value.
  ckpt::ReplicaSyncDesc replicaSyncDesc() const;
  [[nodiscard]] Status checkSavedPolicy(const ckpt::Manifest& m, const std::string& dir) const;
  // Load (diloco): the requests that read this rank's shard of the outer state into `staged`
  // (per unit), and installing it once every rank's read succeeded.
  struct OuterStaged {
    std::vector<std::vector<float>> anchor, momentum;
  };
  std::vector<ckpt::TensorReader::Request> outerRequests(const ckpt::Manifest& m,
                                                         OuterStaged* staged) const;
  void installOuter(const OuterStaged& staged);
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
