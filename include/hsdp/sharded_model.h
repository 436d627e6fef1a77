// The sharding engine. A model is a list of units (layers); each unit registers named parameters
// and keeps them in one flat, padded buffer of which this rank owns one shard (flat_layout.h).
// The unit lifecycle in one training step, FSDP2's verbs:
//
//   forward  unit i:  unshard(i) -> waitForUnshard(i) -> param(i, name) ... -> reshard(i)
//   backward unit i:  unshard(i) -> waitForUnshard(i) -> user writes grad(i, name)
//                     -> reduceGrad(i) -> reshard(i)
//   then              step()   (Adam/AdamW on every shard)
//
// Modes (S = the mesh's shard group): kZero3 shards parameters, gradients and optimizer state
// over S; unshard all-gathers (inter then intra), reduceGrad reduce-scatters (intra then inter)
// and then averages the shard across replicas. kZero2 keeps parameters whole (unshard gathers
// nothing), reduce-scatters gradients to the shard and frees the whole gradient; step() updates
// this rank's slice of the parameters and all-gathers them back. kZero1 is kZero2 that also keeps
// the whole gradient buffer for the step. kNone is plain data parallel and needs S = 1: reduceGrad
// all-reduces over the world.
//
// Gradient accumulation (no_sync): grad() returns the same zero-initialised buffer until
// reduceGrad(), so micro-steps add (+=) into it and only the last one calls reduceGrad(). The
// whole gradient of each unit then lives across the micro-steps (zero2/zero3 included): less
// communication, more memory than reducing every micro-step into the shard.
//
// Device (EngineConfig::device). With Device::kCuda (a CUDA build; otherwise create() fails with
// FailedPrecondition saying "built without CUDA") every parameter shard, gradient shard,
// optimizer moment, gathered unit and full gradient lives in device memory of the CUDA device
// current when create() is called, allocated once (finalize(), and the gather pool when it grows
// to a new peak) and reused every step. The mesh's communicators must be NCCL: build the mesh
// over an NCCL world, e.g.
//     auto nccl_world = hsdp::nccl::createNcclComm(mpi_world);   // hsdp/nccl.h
//     auto layout = hsdp::groupRanksIntoNodes(mpi_world);
//     auto mesh = hsdp::Mesh::create(**nccl_world, *layout, spec);
// (create() returns InvalidArgument naming the transport when a communicator is not "nccl").
// Parameters and gradients move with one collective over the shard group (NCCL runs its own
// intra/inter hierarchy inside a communicator); HSDP_HIER is ignored and hierarchical() is false.
//  * param(unit, name) / grad(unit, name): ParamView.data is a DEVICE pointer.
//  * setParameter(unit, name, full, numel): `full` is HOST memory (the whole value, same on every
//    rank).
//  * gatherFullParameters(unit, out): fills a HOST std::vector<float> (the host waits).
//  * lastGradNorm(), memoryReport(), takeExposedCommSeconds(): as on the host (MemoryReport
//    counts device bytes).
// Ordering with the user's compute: the user runs forward/backward on one CUDA stream and names
// it with setComputeStream() (default: the legacy default stream).
//  * waitForUnshard(unit): on return the compute stream is ordered after the gather
//    (cudaStreamWaitEvent; the host does not wait for the device), so kernels enqueued next on
//    the compute stream see the full parameters.
//  * grad(): the first call of a step zero-fills the gradient buffer with cudaMemsetAsync on the
//    compute stream.
//  * reduceGrad(unit): the reduction is ordered after everything already enqueued on the compute
//    stream (the backward kernels that wrote the gradient).
//  * reshard(unit): the gathered buffer is reused only after the compute stream's work enqueued
//    so far (an event recorded on the compute stream).
//  * step(): returns when the update is enqueued and ordered before later work on the compute
//    stream. With clipping the host needs the norm first: it waits once per step for the compute
//    stream up to the norm kernel (the backward, the reductions, the norm). Without clipping it
//    does not wait; lastGradNorm() then waits for that norm when first called after the step.
// hpZ works on a device as on the host (the intra-shard communicator must be NCCL too). CPU
// offload on a device: each reduced gradient shard goes down to pinned (registered, NUMA-bound)
// host memory on a copy stream, the CPU Adam steps it on the offload worker, and the updated
// master (and bf16 copy) comes back on another copy stream; the compute stream waits for that
// upload before the unit's parameters are read again, and the worker waits for the download.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "hsdp/checkpoint.h"
#include "hsdp/config.h"
#include "hsdp/flat_layout.h"
#include "hsdp/mesh.h"

namespace hsdp {

struct ParamView {
  float* data = nullptr;
  std::vector<int64_t> shape;
  size_t numel = 0;
};

// A tensor of the caller's own holding one registered parameter (or its gradient): numel floats
// in the engine's memory space (device memory with Device::kCuda). For copyOutParams/copyInGrads.
struct TensorRef {
  std::string_view name;
  float* data = nullptr;
  size_t numel = 0;
};

// Per-rank bytes held by model state, from the engine's own allocations.
struct MemoryReport {
  size_t param_bytes = 0;              // fp32 parameter shards
  size_t grad_bytes = 0;               // fp32 gradient shards
  size_t optim_bytes = 0;              // Adam moments (2 x shard)
  size_t gathered_peak_bytes = 0;      // most bytes of gathered params + full grads alive at once
  size_t gathered_capacity_bytes = 0;  // bytes the gather pool holds (>= peak)
  size_t comm_bytes = 0;               // transport and schedule scratch
  // With CPU offload: host memory of the optimizer (master, moments, gradient). The moments are
  // also counted in optim_bytes; on host memory the master and gradient are the shards
  // themselves, stepped in place (also in param_bytes and grad_bytes), on a device host copies.
  size_t offload_host_bytes = 0;
  size_t hpz_bytes = 0;  // hpZ secondary partitions (1/I of every unit)
  size_t total() const {
    return param_bytes + grad_bytes + optim_bytes + hpz_bytes + gathered_capacity_bytes +
           comm_bytes;
  }
};

// How a unit takes part in training.
struct UnitOptions {
  // A frozen unit's parameters are sharded and gathered like any other (forward and backward
  // read them), but it has no gradient and no optimizer state, is never reduced and never
  // stepped: grad(), copyInGrads() and reduceGrad() on it are FailedPrecondition, step() skips
  // it, and the memory report counts its parameters only (fine-tuning with a frozen backbone,
  // embeddings loaded from elsewhere).
  bool frozen = false;
};

// What beginStep() tells the training loop about the step it is to run (docs/elastic.md).
// Without elastic mode: step = stepCount(), one group, slot 0 of 1.
struct StepStart {
  int64_t step = 0;          // the step to run: stepCount(), the steps the job committed
  int64_t attempt = 0;       // elastic: the step's attempt (a repeated step has a new one)
  int group = 0;             // elastic: this group's index
  std::vector<int> present;  // elastic: the indexes of the groups in this step's quorum
  // The data to train on: slice `slot` of `slots` equal parts of the step's global batch
  // (EngineConfig::elastic.data: keep = the group's index of the job's groups; redistribute = its
  // place among the groups present).
  int slot = 0, slots = 1;
  bool healed = false;    // this group received its state before this step ...
  int healed_from = -1;   // ... from this group
  size_t heal_bytes = 0;  // bytes this rank received (healed) or sent (donor) for heals
  double heal_seconds = 0;
};

// One rank's step, split by what its caller's thread did (ShardedModel::takeStepAccounting;
// docs/trace.md): seconds blocked on each kind of collective and in the optimizer step. The rest
// of the step is the caller's own compute. The same waits are the trace's events.
struct StepAccounting {
  double wait_gather_s = 0;   // waitForUnshard / reshard (and zero1/2's post-step gathers)
  double wait_reduce_s = 0;   // step() waiting for reduce-scatters
  double wait_replica_s = 0;  // step() waiting for replica all-reduces (elastic: the groups')
  double optimizer_s = 0;     // step(): the norm, Adam inline, or the wait for offloaded steps
  // Payload bytes this rank sent on each level since the last take (Comm::bytesSent of the
  // level's communicators; docs/collectives.md, "Bytes sent"): intra, the intra-node phase of the
  // shard group (gathers, reduce-scatters, hpZ's node gathers); inter, its inter-node phase;
  // replica, the replica all-reduces (mode none on the host: the world, with whatever else the
  // caller sends on it); shard, the one-level route over the whole shard group (HSDP_HIER=0, a
  // device) and the gradient norm's sum. hsdp-plan predicts the first three (its "per level").
  uint64_t bytes_intra = 0, bytes_inter = 0, bytes_replica = 0, bytes_shard = 0;
  double waits() const { return wait_gather_s + wait_reduce_s + wait_replica_s; }
};

class ShardedModel {
 public:
  // `mesh` must outlive the model. Errors: invalid optimizer settings; kNone with a shard group
  // larger than 1.
  static StatusOr<std::unique_ptr<ShardedModel>> create(const Mesh& mesh, EngineConfig cfg);
  ~ShardedModel();

  // Device::kCuda: the CUDA stream (a cudaStream_t) the user's forward and backward kernels run
  // on; nullptr (the default) is the legacy default stream. The engine orders its gathers,
  // reductions and optimizer step against this stream with events (see the header comment).
  // Ignored with Device::kHost. Call it between steps, not while units are unsharded.
  void setComputeStream(void* cuda_stream);
  Device device() const;

  // Registers a unit; returns its index. Only before finalize().
  StatusOr<int> addUnit(std::string name, std::vector<ParamSpec> params, UnitOptions options = {});

  // Collective: checks that every rank registered the same units (names and shapes) and
  // allocates shards, optimizer state and communication buffers once.
  [[nodiscard]] Status finalize();

  int numUnits() const;
  const std::string& unitName(int unit) const;
  const FlatLayout& layout(int unit) const;
  bool frozen(int unit) const;
  // The configuration this model runs with: every optional filled (resolveEngineConfig).
  const EngineConfig& config() const;

  // Copies this rank's part of a parameter from its full value (same on every rank).
  [[nodiscard]] Status setParameter(int unit, std::string_view name, const float* full,
                                    size_t numel);

  // Collective over the shard group: starts gathering the unit's full parameters and returns
  // (the gather runs while the caller computes; issue it for unit i+1 before computing unit i to
  // prefetch).
  [[nodiscard]] Status unshard(int unit);
  // Blocks until the gather started by unshard() has landed; param() is valid after it.
  [[nodiscard]] Status waitForUnshard(int unit);
  // Frees the gathered parameters (returns the buffer to the pool).
  [[nodiscard]] Status reshard(int unit);

  // Full parameter (after waitForUnshard) and full gradient (zeroed on first use in a step).
  StatusOr<ParamView> param(int unit, std::string_view name);
  StatusOr<ParamView> grad(int unit, std::string_view name);

  // FSDP2's copy-out and copy-in, for a model whose parameters and gradients live in tensors of
  // its own rather than in the views param() and grad() return. Each TensorRef names one
  // registered parameter of the unit; any subset of the unit's parameters, in any order, each
  // once. One batched copy on the compute stream (CUDA: one kernel launch per 64 tensors), no
  // host wait. Every tensor is checked before anything is copied; errors name the unit and the
  // tensor: an unknown name (NotFound), a wrong numel, a null pointer, a name given twice
  // (InvalidArgument), and param()'s / grad()'s lifecycle errors (FailedPrecondition).
  // After waitForUnshard(unit): the unit's full parameters into the tensors.
  [[nodiscard]] Status copyOutParams(int unit, std::span<const TensorRef> tensors);
  // Adds the tensors into the unit's full gradient, the buffer grad() returns (zeroed at its
  // first use in a step, so micro-steps accumulate); reduceGrad(unit) follows as usual.
  [[nodiscard]] Status copyInGrads(int unit, std::span<const TensorRef> tensors);

  // Collective: starts reducing the unit's full gradient to this rank's shard, averaged over all
  // data-parallel ranks (reduce-scatter over the shard group, then all-reduce over replicas);
  // it completes in the background and frees the full gradient when the scatter lands.
  [[nodiscard]] Status reduceGrad(int unit);

  // Waits for the pending reductions, then the optimizer step on every shard; every unit that is
  // not frozen must have had reduceGrad since the last step.
  // Elastic mode: first averages every gradient shard over the groups of the step's quorum and
  // votes; when the quorum does not commit (a group failed or vanished), nothing is applied,
  // every unit's gradient is dropped and step() returns kAborted: run the step again from
  // beginStep() (the next attempt's quorum).
  [[nodiscard]] Status step();

  // Collective over the group, before a step's first unshard. Elastic mode: joins the step's
  // quorum (waiting out an attempt this group is not in), connects the replica transport, and
  // when this group must heal (it (re)joined, or missed a committed step) copies every unit's
  // shards, both Adam moments and the step count from a healthy group; returns the step to run
  // and the data slot to train on. Without elastic mode: {stepCount(), slot 0 of 1}, no
  // communication.
  StatusOr<StepStart> beginStep();
  bool elastic() const;
  // Elastic mode, collective over the group: the group indexes of the quorum that committed
  // each of steps [from, steps), read from etcd (what a reference replays). A job resumed from a
  // checkpoint at step N has records from N on (the steps before are the saving job's).
  StatusOr<std::vector<std::vector<int>>> elasticMembership(int64_t steps, int64_t from = 0);

  // The learning rate of the next step() (a schedule's warm-up and decay). Errors: not finite or
  // <= 0 (InvalidArgument naming it); with CPU offload and no clipping, units step during
  // backward, as soon as their gradient is reduced, so after the step's first reduceGrad the
  // rate can no longer change (FailedPrecondition: set it before the step's backward).
  [[nodiscard]] Status setLearningRate(float lr);
  float learningRate() const;
  // The global gradient norm the next step() clips to (EngineConfig::clip_norm; 0: no clipping).
  // Errors: not finite or < 0 (InvalidArgument naming it); as setLearningRate, it cannot change
  // once the step's first unit started stepping (CPU offload without clipping steps during
  // backward).
  [[nodiscard]] Status setClipNorm(float clip_norm);

  // Seconds spent blocked on communication (waitForUnshard, reshard of an in-flight unit, the
  // reductions step() waits for) since the last call: the communication not hidden by compute.
  double takeExposedCommSeconds();
  // The split of the caller's time since the last call (StepAccounting), from the same waits
  // the trace records.
  StepAccounting takeStepAccounting();
  // With a trace directory (EngineConfig::trace_dir, HSDP_TRACE): writes this rank's events so
  // far to DIR/trace.rank<N>.json (docs/trace.md); nothing otherwise. The destructor writes
  // it too (a failure there is a warning).
  [[nodiscard]] Status writeTrace();

  // Global L2 norm of the averaged gradient at the last step() (before clipping).
  float lastGradNorm() const;
  // Collective over the shard group, after every trainable unit's reduceGrad and before step():
  // waits for the pending reductions and returns the global L2 norm of the averaged gradient
  // the next step() applies (before clipping; the same value on every rank), as
  // torch.nn.utils.clip_grad_norm_ returns it. step() then clips with this norm rather than
  // computing it again. Errors: a unit without its reduced gradient (FailedPrecondition naming
  // it). Elastic mode: the norm of the quorum's average gradient, so gradNorm() first waits for
  // the replica average and the quorum's decision (what step() would do; step() then applies
  // without voting again): a step the quorum did not commit is kAborted here, its gradients
  // dropped, and the loop runs it again from beginStep().
  StatusOr<float> gradNorm();

  // With CPU offload, since the last call: seconds the optimizer worker spent stepping, and
  // seconds step() waited for it (the part backward did not hide). Zero without offload.
  void takeOptimizerSeconds(double* total, double* exposed);

  // Collective over the shard group: the unit's whole flat parameter vector (unpadded); with an
  // int8/int4 parameter wire the exact fp32 masters (this gather does not quantize).
  [[nodiscard]] Status gatherFullParameters(int unit, std::vector<float>* out);

  // ---- checkpoints (hsdp/checkpoint.h: what is saved, the commit, the format) ----
  // Every call below is collective over the world and runs between step() and the next forward
  // (no unit unsharded, no reduction in flight; FailedPrecondition otherwise). Errors are the
  // same on every rank and name the file.
  //
  // Saves the parameters (fp32 masters), Adam's moments, the step count, the optimizer settings
  // and options.user into <root>/<name> (SaveOptions::name) and points <root>/latest at it;
  // returns once committed. save() is saveAsync() then waitForSave(). Elastic mode: one group
  // writes (the lowest group index of the quorum that committed the state); on the others the
  // save writes nothing and returns at once (SaveResult::written false; docs/elastic.md).
  StatusOr<SaveResult> save(const std::string& root, const SaveOptions& options = {});
  // Starts copying this rank's part of the state into a host snapshot (allocated once, reused;
  // pinned on a device, where the copy runs on a copy stream of its own and the next step waits
  // for it on the device, not on the host; state in host memory is copied by a background
  // thread, and what changes that state next, step() or setParameter(), waits for that copy)
  // and returns; a background thread writes it and rank 0 commits it while training goes on. A save
  // still in flight is waited for first (its error, if any, is returned and the new save does not
  // start).
  [[nodiscard]] Status saveAsync(const std::string& root, const SaveOptions& options = {});
  // Waits for the save in flight (FailedPrecondition when there is none) and returns its result.
  StatusOr<SaveResult> waitForSave();
  bool saveInFlight() const;
  // Loads a checkpoint (a checkpoint directory, or a root whose `latest` names one), saved on
  // any mesh and mode, into this model: every unit and parameter must match by name and shape
  // (else InvalidArgument naming the first difference). Waits for a save in flight first. On
  // error the model's state is unchanged. Elastic mode: before the group's first beginStep(); the
  // group then joins the job's first quorum ready for the loaded step.
  StatusOr<LoadResult> load(const std::string& path, const LoadOptions& options = {});
  // Parameters from full safetensors weights (hsdp/checkpoint.h: loadWeights options).
  [[nodiscard]] Status loadWeights(const std::string& path, const LoadWeightsOptions& options = {});
  // The full parameters as safetensors, written by rank 0 (hsdp/checkpoint.h: ExportOptions).
  StatusOr<std::vector<std::string>> exportSafetensors(const std::string& out,
                                                       const ExportOptions& options = {});

  MemoryReport memoryReport() const;
  int64_t stepCount() const;
  ShardMode mode() const;
  int shardCount() const;  // shard group size used for the flat layouts
  // Whether gradients and parameters move through the two-level schedules (intra, then inter:
  // HSDP_HIER=1, the default) or through one collective over the shard group (HSDP_HIER=0). With
  // a bf16 reduce dtype this decides where the partial sums are rounded (docs/design.md).
  bool hierarchical() const;

 private:
  struct Impl;
  explicit ShardedModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hsdp
