#include "hsdp/sharded_model.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <deque>
#include <limits>

#include "hsdp/cpu_adam.h"
#include "hsdp/env.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/host_buffer.h"
#include "hsdp/log.h"
#include "offload/step_queue.h"
#include "engine/buffer_pool.h"
#include "engine/memory_space.h"

namespace hsdp {

namespace {

struct Unit {
  std::string name;
  FlatLayout layout;
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
  int64_t step_ticket = 0;  // StepQueue ticket of this unit's pending offloaded step; 0: none
  int64_t launched_step = 0;  // the optimizer step whose job was last submitted
  // Mixed precision: the bf16 rounding of the master shard (what the all-gather sends), the
  // bf16 gradient shard the reduce-scatter lands in, and the in-flight bf16 pool blocks.
  SpaceBuffer shard16, grad16;
  // hpZ: this rank's intra-node block of the unit's parameters (J shards), kept from forward.
  SpaceBuffer hpz_block;
  bool hpz_valid = false;
  bool deferred = false;  // unshard() was rate-limited: the gather is not issued yet
  void* gathered16 = nullptr;
  void* full_grad16 = nullptr;
  float* gathered = nullptr;   // full parameters while unsharded (pool block, or the shard)
  float* full_grad = nullptr;  // full gradient while backward writes it (pool block, or shard)
  WorkHandle gather;           // the all-gather in flight between unshard() and its wait
  bool unsharded = false;
  bool grad_pending = false;   // reduceGrad() started, not yet complete
  bool grad_reduced = false;
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

}  // namespace

struct ShardedModel::Impl {
  const Mesh* mesh = nullptr;
  EngineConfig cfg;
  int shards = 1;  // shard group size used for layouts (1 in mode none)
  bool finalized = false;
  bool hierarchical = true;
  std::vector<Unit> units;
  BufferPool pool;
  // Gathers and reductions run on separate communicators (mesh.h): both are in flight at once.
  std::unique_ptr<HierarchicalCollectives> hier;         // parameter all-gathers
  std::unique_ptr<HierarchicalCollectives> hier_reduce;  // gradient reduce-scatters
  std::deque<PendingReduce> pending;
  int64_t step = 0;
  // Where every buffer lives and how the operations on them run (host or CUDA). The host
  // space waits for collectives on the calling thread and counts that as exposed time.
  std::unique_ptr<MemorySpace> space;
  bool onDevice() const { return cfg.device == Device::kCuda; }

  // Waits (host) or orders `lane` (device) for `w`, counting host waiting as exposed time.
  Status blockOn(WorkHandle& w, Lane lane = Lane::kCompute) {
    return space->reached(w, lane, /*block=*/true).status();
  }

  // The replicas of a shard. Mode none (a shard group of one) reduces over the world on the
  // host (every rank is a replica); on a device over the replica communicator, which has the
  // same members and is the engine's own (the world is the user's, with the user's streams).
  Comm& dataParallel() const {
    return shards == 1 && !onDevice() ? mesh->world() : mesh->replica();
  }
  // zero1/zero2 over a real shard group: parameters replicated, optimizer state sharded.
  bool replicatedParams() const {
    return shards > 1 && (cfg.mode == ShardMode::kZero1 || cfg.mode == ShardMode::kZero2);
  }
  // Full gradients come from the pool (and return to it after the reduce-scatter).
  bool pooledGrads() const {
    return shards > 1 && (cfg.mode == ShardMode::kZero2 || cfg.mode == ShardMode::kZero3);
  }
  float* master(Unit& u) const {
    // With bf16 parameters the whole copy holds bf16 roundings for compute, so the fp32 master
    // slice lives apart, in param_shard.
    if (replicatedParams() && cfg.param_dtype != DType::kBFloat16)
      return u.full_params.as<float>() + mesh->coords().shard_rank * u.layout.shardNumel();
    return u.param_shard.as<float>();
  }
  // Global gradient norm of the last step; on a device read back from it when first asked
  // (with clipping, in step()).
  mutable float last_grad_norm = 0;
  mutable bool norm_pending = false;
  BufferPool pool16;  // bf16 full-size blocks: gathered parameters, gradients on the wire
  int gathered_alive = 0;   // zero3 units holding a gathered block
  std::deque<int> deferred;  // rate-limited unshard() calls, in call order
  bool bf16Params() const { return shards > 1 && cfg.param_dtype == DType::kBFloat16; }
  bool bf16Reduce() const { return shards > 1 && cfg.reduce_dtype == DType::kBFloat16; }
  Status refresh16(Unit& u) {
    if (!bf16Params()) return okStatus();
    return space->castToBf16(master(u), u.shard16.as<bf16>(), u.layout.shardNumel(),
                             Lane::kCompute);
  }
  Status readNorm() const {
    if (!norm_pending) return okStatus();
    HSDP_ASSIGN_OR_RETURN(double sumsq, space->normResult());
    last_grad_norm = static_cast<float>(std::sqrt(sumsq));
    norm_pending = false;
    return okStatus();
  }
  Status issueGather(Unit& u) {
    HSDP_ASSIGN_OR_RETURN(void* block, pool.acquire(/*zero=*/false));
    u.gathered = static_cast<float*>(block);
    StatusOr<WorkHandle> w = Status(StatusCode::kInternal, "unset");
    if (u.hpz_valid) {  // hpZ: the secondary partition is re-gathered inside the node only
      w = space->iallGather(mesh->intraShard(), u.hpz_block.data(), u.gathered,
                            mesh->shape().inter_shard * u.layout.shardNumel(), DType::kFloat32);
    } else if (bf16Params()) {  // 2 bytes on the wire; upcast in waitForUnshard
      HSDP_ASSIGN_OR_RETURN(u.gathered16, pool16.acquire(/*zero=*/false));
      w = gatherAny(u.shard16.data(), u.gathered16, u.layout.shardNumel(), DType::kBFloat16);
    } else {
      w = gather(u.param_shard.as<float>(), u.gathered, u.layout.shardNumel());
    }
    if (!w.ok()) return w.status().withContext(strCat("all-gather of unit '", u.name, "'"));
    u.gather = std::move(*w);
    ++gathered_alive;
    return okStatus();
  }

  // Issues deferred gathers, oldest first, while the limit allows.
  Status issueDeferred() {
    while (!deferred.empty() && gathered_alive < cfg.max_gathered_units) {
      Unit& u = units[deferred.front()];
      deferred.pop_front();
      u.deferred = false;
      HSDP_RETURN_IF_ERROR(issueGather(u));
    }
    return okStatus();
  }

  StatusOr<WorkHandle> gatherAny(const void* shard, void* full, size_t count, DType t) {
    if (hierarchical) return hier->iallGather(shard, full, count, t);
    return space->iallGather(mesh->shardGroup(), shard, full, count, t);
  }
  // All-gathers over the shard group that move together, as one Work. The hierarchical
  // schedules keep them all in flight (pipelined in start order); otherwise one group.
  StatusOr<WorkHandle> gatherGroup(std::span<const CollectiveOp> ops) {
    if (!hierarchical) return space->igroup(mesh->shardGroup(), ops);
    std::vector<WorkHandle> works;
    works.reserve(ops.size());
    for (const CollectiveOp& o : ops) {
      HSDP_ASSIGN_OR_RETURN(WorkHandle w, hier->iallGather(o.send, o.recv, o.count, o.dtype));
      works.push_back(std::move(w));
    }
    return allOf(std::move(works));
  }
  // step()'s gathers (reused every step).
  std::vector<CollectiveOp> group_ops;
  std::vector<void*> blocks16;
  // Every shard is stepped by the SIMD CPU Adam (bitwise equal to adamStep, ~4x faster).
  std::unique_ptr<CpuAdam> cpu_adam;
  NumaTopology numa;
  std::unique_ptr<StepQueue> queue;  // offload: steps run here, off the training thread

  // Offload: queue unit u's step t (gradient scaled by `scale`) on the worker thread. The
  // gradient shard goes to host memory (on a device: a D2H copy started here), the CPU Adam
  // steps the host master, and the master comes back (on a device: an H2D copy).
  Status launchStep(Unit& u, int64_t t, float scale) {
    float* space_master = master(u);
    const size_t n = u.layout.shardNumel();
    const AdamConfig adam = cfg.adam;
    CpuAdam* opt = cpu_adam.get();
    MemorySpace* sp = space.get();
    u.launched_step = t;
    // The bf16 copy: straight into shard16 on the host; on a device into host16, then uploaded.
    bf16* out16 = !bf16Params() ? nullptr
                  : onDevice()  ? u.host16.as<bf16>()
                                : u.shard16.as<bf16>();
    bf16* up16 = bf16Params() && onDevice() ? u.shard16.as<bf16>() : nullptr;
    HSDP_RETURN_IF_ERROR(
        sp->startDownload(*u.offload, u.host_grad.data(), u.grad_shard.data(), n * sizeof(float)));
    u.step_ticket = queue->submit(
        [&u, space_master, n, adam, opt, sp, t, scale, out16, up16]() -> Status {
          HSDP_RETURN_IF_ERROR(sp->finishDownload(*u.offload, u.host_grad.data(),
                                                  u.grad_shard.data(), n * sizeof(float)));
          HSDP_RETURN_IF_ERROR(opt->step(adam, t,
                                         {u.host_master.as<float>(), u.host_grad.as<float>(),
                                          u.exp_avg.as<float>(), u.exp_avg_sq.as<float>(), n,
                                          out16},
                                         scale));
          HSDP_RETURN_IF_ERROR(
              sp->upload(*u.offload, space_master, u.host_master.data(), n * sizeof(float)));
          if (up16 != nullptr)
            HSDP_RETURN_IF_ERROR(sp->upload(*u.offload, up16, out16, n * sizeof(bf16)));
          return okStatus();
        });
    return okStatus();
  }

  // The unit's parameters are about to be read: its offloaded step must have landed (on a
  // device: the compute stream waits for the upload).
  Status waitForStep(Unit& u) {
    if (u.step_ticket == 0) return okStatus();
    HSDP_RETURN_IF_ERROR(queue->waitFor(u.step_ticket));
    u.step_ticket = 0;
    return space->awaitUpload(*u.offload);
  }

  // The unit's full gradient for this step: zero-filled at its first use (grad(), copyInGrads()).
  // `verb` and `param` name the caller in the error ("grad('u.w')", "copyInGrads('u')").
  Status ensureGrad(Unit& u, const char* verb, std::string_view param) {
    if (u.grad_pending)
      return failedPrecondition(verb, "('", u.name, param.empty() ? "" : ".", param,
                                "'): the unit's gradient is being reduced; step() first");
    if (u.full_grad != nullptr) return okStatus();
    // On a device the zero-fill is enqueued on the compute stream, after the step that read
    // the previous gradient (step() orders the compute stream after the reductions).
    if (shards == 1) {
      u.full_grad = u.grad_shard.as<float>();
      return space->zero(u.full_grad, u.grad_shard.size(), Lane::kCompute);
    }
    if (!pooledGrads()) {  // zero1: the whole gradient lives on
      u.full_grad = u.full_grad_buf.as<float>();
      return space->zero(u.full_grad, u.full_grad_buf.size(), Lane::kCompute);
    }
    HSDP_ASSIGN_OR_RETURN(void* block, pool.acquire(/*zero=*/true));
    u.full_grad = static_cast<float*>(block);
    return okStatus();
  }

  // copyOutParams / copyInGrads, in two steps so that copy-in can check everything before it
  // takes (and zeroes) the gradient buffer. checkTensors: every tensor against unit u's layout
  // and the memory space, into copy_plan; copy-out writes all of them at once, so they must not
  // overlap one another (copy-in only reads them, into disjoint parameter slices; a tensor
  // shared by tied parameters is fine).
  Status checkTensors(Unit& u, std::span<const TensorRef> tensors, const char* verb,
                      bool into_flat) {
    copy_plan.clear();
    copy_seen.assign(u.layout.params().size(), 0);
    for (size_t k = 0; k < tensors.size(); ++k) {
      const TensorRef& t = tensors[k];
      auto bad = [&](auto&&... what) {
        return invalidArgument(verb, "('", u.name, "'): tensor ", k, " '", t.name, "' ", what...);
      };
      StatusOr<size_t> i = u.layout.indexOf(t.name);
      if (!i.ok()) return i.status().withContext(strCat(verb, "('", u.name, "'): tensor ", k));
      const ParamSpec& p = u.layout.params()[*i];
      if (t.numel != p.numel())
        return bad("holds ", t.numel, " elements, the parameter ", p.numel());
      if (copy_seen[*i]++) return bad("is given twice");
      if (t.numel == 0) continue;
      if (t.data == nullptr) return bad("is a null pointer");
      Status where = space->checkPointer(t.data);
      if (!where.ok()) return bad(where.message());
      copy_plan.push_back({t.data, u.layout.offset(*i), t.numel, k});
    }
    std::sort(copy_plan.begin(), copy_plan.end(),
              [](const PlannedCopy& a, const PlannedCopy& b) { return a.user < b.user; });
    for (size_t r = 1; r < copy_plan.size() && !into_flat; ++r)
      if (copy_plan[r].user < copy_plan[r - 1].user + copy_plan[r - 1].n)
        return invalidArgument(verb, "('", u.name, "'): tensors ",
                               std::min(copy_plan[r - 1].k, copy_plan[r].k), " and ",
                               std::max(copy_plan[r - 1].k, copy_plan[r].k), " overlap");
    return okStatus();
  }

  // The copies checkTensors planned, between the tensors and the flat buffer `flat` (which no
  // tensor may lie inside), in one batch; into the flat buffer it adds.
  Status runCopies(Unit& u, std::span<const TensorRef> tensors, const char* verb, float* flat,
                   bool into_flat) {
    const float* flat_end = flat + u.layout.paddedNumel();
    copy_pieces.clear();
    for (const PlannedCopy& c : copy_plan) {
      if (c.user < flat_end && flat < c.user + c.n)
        return invalidArgument(verb, "('", u.name, "'): tensor ", c.k, " '", tensors[c.k].name,
                               "' lies inside the unit's own flat buffer (a view from param() "
                               "or grad()): use the view, or a tensor of your own");
      float* f = flat + c.offset;
      copy_pieces.push_back(into_flat ? CopyPiece{c.user, f, c.n} : CopyPiece{f, c.user, c.n});
    }
    return space->batchedCopy(copy_pieces, /*accumulate=*/into_flat, Lane::kCompute);
  }
  struct PlannedCopy {
    float* user;    // the caller's tensor
    size_t offset;  // of its parameter in the flat buffer
    size_t n;
    size_t k;  // index in the caller's list, for messages
  };
  // Reused: no allocation once grown.
  std::vector<PlannedCopy> copy_plan;
  std::vector<CopyPiece> copy_pieces;
  std::vector<char> copy_seen;

  Status checkUnit(int u, const char* verb) const {
    if (!finalized) return failedPrecondition(verb, ": call finalize() first");
    if (u < 0 || u >= static_cast<int>(units.size()))
      return outOfRange(verb, ": unit ", u, " outside [0, ", units.size(), ")");
    return okStatus();
  }

  StatusOr<WorkHandle> gather(const float* shard, float* full, size_t count) {
    return gatherAny(shard, full, count, DType::kFloat32);
  }

  StatusOr<WorkHandle> reduceScatter(const void* full, void* shard, size_t count, DType t) {
    if (hierarchical) return hier_reduce->ireduceScatter(full, shard, count, t, RedOp::kAvg);
    return space->ireduceScatter(mesh->shardGroupReduce(), full, shard, count, t, RedOp::kAvg);
  }

  // Moves pending gradient reductions along without blocking (or, with `block`, to the end):
  // a finished reduce-scatter frees its full-gradient block and starts the replica all-reduce.
  Status pollReductions(bool block) {
    for (PendingReduce& p : pending) {
      Unit& u = units[p.unit];
      if (!p.scatter_done) {
        if (p.scatter) {
          // On a device this orders the reduce lane after the scatter and is true at once.
          HSDP_ASSIGN_OR_RETURN(bool done, space->reached(p.scatter, Lane::kReduce, block));
          if (!done) break;  // later ones start their all-reduce after this one: keep order
          if (pooledGrads()) HSDP_RETURN_IF_ERROR(pool.release(u.full_grad, Lane::kReduce));
          if (u.full_grad16 != nullptr) {  // bf16 reduce: upcast the shard, free the wire copy
            HSDP_RETURN_IF_ERROR(space->castToFloat(u.grad16.as<bf16>(), u.grad_shard.as<float>(),
                                                    u.layout.shardNumel(), Lane::kReduce));
            HSDP_RETURN_IF_ERROR(pool16.release(u.full_grad16, Lane::kReduce));
            u.full_grad16 = nullptr;
          }
        }
        u.full_grad = nullptr;
        p.scatter_done = true;
        Comm& dp = dataParallel();
        if (dp.size() > 1) {
          HSDP_ASSIGN_OR_RETURN(p.replicate,
                                space->iallReduce(dp, u.grad_shard.data(), u.layout.shardNumel(),
                                                  DType::kFloat32, RedOp::kAvg));
        }
      }
    }
    while (!pending.empty() && pending.front().scatter_done) {
      PendingReduce& p = pending.front();
      if (p.replicate) {
        HSDP_ASSIGN_OR_RETURN(bool done, space->reached(p.replicate, Lane::kReduce, block));
        if (!done) break;
      }
      Unit& u = units[p.unit];
      u.grad_pending = false;
      u.grad_reduced = true;
      // Offload without clipping: step this unit now, while backward goes on. (Clipping needs
      // the global norm of every gradient first, so then step() launches them all.)
      if (queue && cfg.clip_norm <= 0) HSDP_RETURN_IF_ERROR(launchStep(u, step + 1, 1.0f));
      pending.pop_front();
    }
    return okStatus();
  }
};

ShardedModel::ShardedModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardedModel::~ShardedModel() = default;

StatusOr<std::unique_ptr<ShardedModel>> ShardedModel::create(const Mesh& mesh, EngineConfig cfg) {
  HSDP_RETURN_IF_ERROR(validate(cfg.adam));
  const MeshShape& s = mesh.shape();
  if (cfg.device == Device::kCuda) {
    HSDP_RETURN_IF_ERROR(memorySpaceAvailable(Device::kCuda));  // e.g. built without CUDA
    // Device buffers move only over NCCL: the communicators the engine uses must be NCCL.
    std::vector<std::pair<const char*, Comm*>> comms = {
        {"shard-group", &mesh.shardGroup()},
        {"shard-group-reduce", &mesh.shardGroupReduce()},
        {"replica", &mesh.replica()}};
    if (cfg.hpz) comms.push_back({"intra-shard", &mesh.intraShard()});
    for (auto [role, comm] : comms)
      if (std::string_view(comm->transportName()) != "nccl")
        return invalidArgument("Device::kCuda needs NCCL communicators, but the mesh's ", role,
                               " communicator runs on '", comm->transportName(),
                               "'; build the mesh over an NCCL world "
                               "(hsdp::nccl::createNcclComm, hsdp/nccl.h)");
  }
  if (cfg.mode == ShardMode::kNone && s.shardGroupSize() != 1)
    return invalidArgument("mode none replicates everything and needs intra_shard=1 and "
                           "inter_shard=1 (got intra_shard=", s.intra_shard, ", inter_shard=",
                           s.inter_shard, "); use mode zero3 to shard");
  if (cfg.offload_cpu && cfg.mode == ShardMode::kNone)
    return invalidArgument("CPU offload needs a sharded optimizer: mode none keeps the optimizer "
                           "state with every replica; use zero1, zero2 or zero3");
  if (cfg.hpz && cfg.mode != ShardMode::kZero3)
    return invalidArgument("hpZ needs mode zero3 (got ", shardModeName(cfg.mode),
                           "): only zero3 re-gathers parameters in backward");
  if (cfg.hpz && (s.intra_shard < 2 || s.inter_shard < 2))
    return invalidArgument("hpZ needs intra_shard > 1 and inter_shard > 1 (got intra_shard=",
                           s.intra_shard, ", inter_shard=", s.inter_shard,
                           "): the secondary partition is over the node's shard ranks and only "
                           "saves traffic when the shard group spans nodes");
  for (DType t : {cfg.param_dtype, cfg.reduce_dtype})
    if (t != DType::kFloat32 && t != DType::kBFloat16)
      return invalidArgument("mixed precision dtype ", dtypeName(t), " is not float or bf16");
  auto impl = std::make_unique<Impl>();
  impl->mesh = &mesh;
  if (cfg.device == Device::kHost || cfg.offload_cpu) {  // the CPU Adam steps host shards
    CpuAdamOptions adam_opts;
    // One thread per rank unless HSDP_CPU_ADAM_THREADS says otherwise: ranks share the node's
    // cores, and the pool does not know about the other ranks.
    if (env::getString("HSDP_CPU_ADAM_THREADS").empty()) adam_opts.threads = 1;
    HSDP_ASSIGN_OR_RETURN(impl->cpu_adam, CpuAdam::create(adam_opts));
  }
  if (cfg.device == Device::kCuda) {
    HSDP_ASSIGN_OR_RETURN(impl->space, createMemorySpace(Device::kCuda, /*compute_stream=*/nullptr));
  } else {
    impl->space = hostMemorySpace(impl->cpu_adam.get());
  }
  if (cfg.offload_cpu) {
    HSDP_ASSIGN_OR_RETURN(impl->numa, NumaTopology::load());
    impl->queue = std::make_unique<StepQueue>();
  }
  impl->cfg = cfg;
  impl->shards = cfg.mode == ShardMode::kNone ? 1 : s.shardGroupSize();
  HSDP_ASSIGN_OR_RETURN(impl->hierarchical, env::getBool("HSDP_HIER"));
  if (cfg.device == Device::kCuda) {
    // The two-level schedules stage chunks with host memcpy. On a device one collective over
    // the shard group does it: NCCL runs its own intra/inter hierarchy inside a communicator.
    static bool logged = false;
    if (!logged && !env::getString("HSDP_HIER").empty()) {
      HSDP_INFO(kShard, "HSDP_HIER is ignored with Device::kCuda: parameters and gradients move "
                        "with one NCCL collective over the shard group");
      logged = true;
    }
    impl->hierarchical = false;
    // Collectives of the parameter path wait for the compute stream (the user wrote the
    // gradients, and a step updated the shards, there); the replica all-reduce of a reduced
    // shard waits for the engine's reduce lane.
    HSDP_RETURN_IF_ERROR(impl->space->bindComm(mesh.shardGroup(), Lane::kCompute, "shard-group"));
    // Reduce-scatters follow the backward kernels that wrote the gradient: the compute lane too.
    HSDP_RETURN_IF_ERROR(
        impl->space->bindComm(mesh.shardGroupReduce(), Lane::kCompute, "shard-group-reduce"));
    HSDP_RETURN_IF_ERROR(impl->space->bindComm(mesh.replica(), Lane::kReduce, "replica"));
    if (cfg.hpz)
      HSDP_RETURN_IF_ERROR(impl->space->bindComm(mesh.intraShard(), Lane::kCompute, "intra-shard"));
  }
  HierOptions hopts;
  // Unset: deep pipelines for large units, one piece for small ones (each chunk pays both levels'
  // latency). Set: exactly that many chunks, unless a minimum is set too.
  HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> chunks, env::getInt("HSDP_PIPELINE_CHUNKS", 1));
  HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> min_chunk,
                        env::getInt("HSDP_PIPELINE_MIN_CHUNK_BYTES", 0));
  hopts.chunks = chunks ? static_cast<int>(*chunks) : 32;
  hopts.min_chunk_bytes = static_cast<size_t>(min_chunk ? *min_chunk : (chunks ? 0 : 1 << 20));
  const std::string wire = env::getString("HSDP_INTER_DTYPE");
  if (!wire.empty()) {
    auto t = parseDType(wire);
    if (!t.ok()) return invalidArgument("HSDP_INTER_DTYPE='", wire, "': ", t.status().message());
    hopts.inter_dtype = *t;
  }
  impl->hier = std::make_unique<HierarchicalCollectives>(mesh.intraShard(), mesh.interShard());
  impl->hier_reduce =
      std::make_unique<HierarchicalCollectives>(mesh.intraShardReduce(), mesh.interShardReduce());
  HSDP_RETURN_IF_ERROR(impl->hier->setOptions(hopts));
  HSDP_RETURN_IF_ERROR(impl->hier_reduce->setOptions(hopts));
  return std::unique_ptr<ShardedModel>(new ShardedModel(std::move(impl)));
}

StatusOr<int> ShardedModel::addUnit(std::string name, std::vector<ParamSpec> params) {
  Impl& m = *impl_;
  if (m.finalized) return failedPrecondition("addUnit('", name, "') after finalize()");
  for (const Unit& u : m.units)
    if (u.name == name) return invalidArgument("duplicate unit name '", name, "'");
  HSDP_ASSIGN_OR_RETURN(FlatLayout layout, FlatLayout::create(std::move(params), m.shards));
  Unit u;
  u.name = std::move(name);
  u.layout = std::move(layout);
  m.units.push_back(std::move(u));
  return static_cast<int>(m.units.size()) - 1;
}

Status ShardedModel::finalize() {
  Impl& m = *impl_;
  if (m.finalized) return failedPrecondition("finalize() called twice");
  // Every rank must hold the same units, or the collectives below would pair different buffers
  // and hang or corrupt. Compare a signature of all names and shapes across the world.
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  for (const Unit& u : m.units) {
    XXH64_update(st, u.name.data(), u.name.size() + 1);
    for (const ParamSpec& p : u.layout.params()) {
      XXH64_update(st, p.name.data(), p.name.size() + 1);
      XXH64_update(st, p.shape.data(), p.shape.size() * sizeof(int64_t));
      int64_t sep = -1;
      XXH64_update(st, &sep, sizeof(sep));
    }
  }
  int64_t mine[2] = {static_cast<int64_t>(m.units.size()),
                     static_cast<int64_t>(XXH64_digest(st))};
  XXH64_freeState(st);
  Comm& world = m.mesh->world();
  std::vector<int64_t> all(2 * world.size());
  HSDP_RETURN_IF_ERROR(m.space->allGatherHost(world, mine, all.data(), 2, DType::kInt64));
  for (int r = 1; r < world.size(); ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      return invalidArgument("unit registrations differ across ranks: rank 0 registered ", all[0],
                             " units (signature ", std::hex, static_cast<uint64_t>(all[1]),
                             std::dec, "), rank ", r, " registered ", all[2 * r],
                             " units (signature ", std::hex, static_cast<uint64_t>(all[2 * r + 1]),
                             std::dec, "); every rank must add the same units and parameters");
  }
  if (m.units.empty()) return failedPrecondition("finalize(): no units registered");

  size_t max_shard = 0, max_padded = 0;
  for (Unit& u : m.units) {
    const size_t bytes = u.layout.shardNumel() * sizeof(float);
    const size_t full_bytes = u.layout.paddedNumel() * sizeof(float);
    MemorySpace& sp = *m.space;
    if (m.replicatedParams()) {
      HSDP_ASSIGN_OR_RETURN(u.full_params, sp.allocate(full_bytes));
      if (m.cfg.param_dtype == DType::kBFloat16) {
        HSDP_ASSIGN_OR_RETURN(u.param_shard, sp.allocate(bytes));
      }
      if (m.cfg.mode == ShardMode::kZero1) {
        HSDP_ASSIGN_OR_RETURN(u.full_grad_buf, sp.allocate(full_bytes));
      }
    } else {
      HSDP_ASSIGN_OR_RETURN(u.param_shard, sp.allocate(bytes));
    }
    HSDP_ASSIGN_OR_RETURN(u.grad_shard, sp.allocate(bytes));
    if (m.queue) {  // offload (host space only): optimizer state in NUMA-local host memory
      HSDP_ASSIGN_OR_RETURN(HostBuffer ea, HostBuffer::allocateNuma(bytes, m.numa));
      HSDP_ASSIGN_OR_RETURN(HostBuffer eas, HostBuffer::allocateNuma(bytes, m.numa));
      u.exp_avg = SpaceBuffer::wrap(std::move(ea));
      u.exp_avg_sq = SpaceBuffer::wrap(std::move(eas));
      HSDP_ASSIGN_OR_RETURN(u.host_master, HostBuffer::allocateNuma(bytes, m.numa));
      HSDP_ASSIGN_OR_RETURN(u.host_grad, HostBuffer::allocateNuma(bytes, m.numa));
      if (m.bf16Params() && m.onDevice()) {
        HSDP_ASSIGN_OR_RETURN(u.host16, HostBuffer::allocateNuma(u.layout.shardNumel() * 2, m.numa));
      }
      HSDP_ASSIGN_OR_RETURN(u.offload, sp.offloadSlot({{u.host_grad.data(), u.host_grad.size()},
                                                       {u.host_master.data(), u.host_master.size()},
                                                       {u.host16.data(), u.host16.size()}}));
    } else {
      HSDP_ASSIGN_OR_RETURN(u.exp_avg, sp.allocate(bytes));
      HSDP_ASSIGN_OR_RETURN(u.exp_avg_sq, sp.allocate(bytes));
    }
    if (m.bf16Params()) {
      HSDP_ASSIGN_OR_RETURN(u.shard16, sp.allocate(u.layout.shardNumel() * 2));
    }
    if (m.cfg.hpz) {
      HSDP_ASSIGN_OR_RETURN(u.hpz_block, sp.allocate(m.mesh->shape().inter_shard * bytes));
    }
    if (m.bf16Reduce()) {
      HSDP_ASSIGN_OR_RETURN(u.grad16, sp.allocate(u.layout.shardNumel() * 2));
    }
    max_shard = std::max(max_shard, u.layout.shardNumel());
    max_padded = std::max(max_padded, u.layout.paddedNumel());
  }
  if (m.bf16Params() || m.bf16Reduce()) {
    HSDP_RETURN_IF_ERROR(m.pool16.init(m.space.get(), max_padded * 2, 4));
    if (m.hierarchical) {
      HSDP_RETURN_IF_ERROR(m.hier->reserve(max_shard, DType::kBFloat16));
      HSDP_RETURN_IF_ERROR(m.hier_reduce->reserve(max_shard, DType::kBFloat16));
    }
  }
  if (m.shards > 1) {
    // zero3: four blocks: in backward the current unit's parameters, the prefetched next unit's,
    // the gradient being written and one still being reduce-scattered. zero2: the last two.
    // zero1 holds whole gradients and needs none.
    const int blocks = m.cfg.mode == ShardMode::kZero3 ? 4 : m.cfg.mode == ShardMode::kZero2 ? 2 : 0;
    HSDP_RETURN_IF_ERROR(m.pool.init(m.space.get(), max_padded * sizeof(float), blocks));
    if (m.hierarchical) {
      HSDP_RETURN_IF_ERROR(m.hier->reserve(max_shard, DType::kFloat32));
      HSDP_RETURN_IF_ERROR(m.hier_reduce->reserve(max_shard, DType::kFloat32));
    } else {
      // The reduce-scatter's ring scratch; the gathers need none.
      HSDP_RETURN_IF_ERROR(m.mesh->shardGroupReduce().reserveScratch(max_shard * sizeof(float)));
    }
  }
  m.group_ops.reserve(m.units.size());
  m.blocks16.reserve(m.units.size());
  m.finalized = true;
  HSDP_INFO(kShard, "finalized ", m.units.size(), " units, mode ", shardModeName(m.cfg.mode),
            ", device ", deviceName(m.cfg.device),
            ", shard group ", m.shards, ", largest unit ", max_padded, " elements (padded)");
  return okStatus();
}

int ShardedModel::numUnits() const { return static_cast<int>(impl_->units.size()); }
const std::string& ShardedModel::unitName(int u) const { return impl_->units.at(u).name; }
const FlatLayout& ShardedModel::layout(int u) const { return impl_->units.at(u).layout; }
int64_t ShardedModel::stepCount() const { return impl_->step; }
ShardMode ShardedModel::mode() const { return impl_->cfg.mode; }
int ShardedModel::shardCount() const { return impl_->shards; }
bool ShardedModel::hierarchical() const { return impl_->hierarchical; }
Device ShardedModel::device() const { return impl_->cfg.device; }
void ShardedModel::setComputeStream(void* cuda_stream) {
  impl_->space->setComputeStream(cuda_stream);
}

Status ShardedModel::setParameter(int unit, std::string_view name, const float* full,
                                  size_t numel) {
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "setParameter"));
  Unit& u = impl_->units[unit];
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  const ParamSpec& p = u.layout.params()[i];
  if (numel != p.numel())
    return invalidArgument("setParameter('", u.name, ".", name, "'): ", numel,
                           " values for a parameter of ", p.numel());
  HSDP_RETURN_IF_ERROR(impl_->waitForStep(u));
  MemorySpace& sp = *impl_->space;  // `full` is host memory; the buffers are the space's
  // Our slice of the parameter, exact, into the fp32 master shard.
  auto copySlice = [&]() -> Status {
    const int k = impl_->shards == 1 ? 0 : impl_->mesh->coords().shard_rank;
    auto [sb, se] = u.layout.shardRange(k);
    const size_t pb = u.layout.offset(i), pe = pb + p.numel();
    const size_t b = std::max(sb, pb), e = std::min(se, pe);
    if (b >= e) return okStatus();
    return sp.copyFromHost(u.param_shard.as<float>() + (b - sb), full + (b - pb), (e - b) * 4);
  };
  if (impl_->replicatedParams()) {  // every rank holds the whole parameter
    float* dst = u.full_params.as<float>() + u.layout.offset(i);
    if (impl_->bf16Params()) {
      // Keep our slice exact in the fp32 master, and the compute copy as the bf16 rounding.
      HSDP_RETURN_IF_ERROR(copySlice());
      std::vector<float> rounded(full, full + numel);
      for (float& x : rounded) x = toFloat(toBf16(x));
      HSDP_RETURN_IF_ERROR(sp.copyFromHost(dst, rounded.data(), numel * sizeof(float)));
    } else {
      HSDP_RETURN_IF_ERROR(sp.copyFromHost(dst, full, numel * sizeof(float)));
    }
  } else {
    HSDP_RETURN_IF_ERROR(copySlice());
  }
  if (impl_->queue)  // the host master mirrors the shard
    HSDP_RETURN_IF_ERROR(sp.copyToHost(u.host_master.data(), impl_->master(u),
                                       u.layout.shardNumel() * sizeof(float)));
  return impl_->refresh16(u);
}

Status ShardedModel::unshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "unshard"));
  Unit& u = m.units[unit];
  if (u.unsharded) return failedPrecondition("unshard: unit '", u.name, "' is already unsharded");
  HSDP_RETURN_IF_ERROR(m.pollReductions(/*block=*/false));
  HSDP_RETURN_IF_ERROR(m.waitForStep(u));  // never gather parameters before their step lands
  if (m.shards == 1) {
    u.gathered = u.param_shard.as<float>();
  } else if (m.replicatedParams()) {
    u.gathered = u.full_params.as<float>();  // zero1/zero2: always whole, nothing to gather
  } else if (m.cfg.max_gathered_units > 0 && m.gathered_alive >= m.cfg.max_gathered_units) {
    // Rate limit: issue this gather when an earlier unit is resharded (or when waited for).
    u.deferred = true;
    m.deferred.push_back(unit);
  } else {
    HSDP_RETURN_IF_ERROR(m.issueGather(u));
  }
  u.unsharded = true;
  return okStatus();
}

Status ShardedModel::waitForUnshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "waitForUnshard"));
  Unit& u = m.units[unit];
  if (!u.unsharded)
    return failedPrecondition("waitForUnshard: unit '", u.name, "' was not unsharded");
  if (u.deferred) {  // waited for before a slot freed up: issue it past the limit
    HSDP_INFO(kShard, "gather of unit '", u.name, "' issued past the limit of ",
              m.cfg.max_gathered_units, " gathered units: it is waited for");
    m.deferred.erase(std::find(m.deferred.begin(), m.deferred.end(), unit));
    u.deferred = false;
    HSDP_RETURN_IF_ERROR(m.issueGather(u));
  }
  if (u.gather) {  // on a device: the compute stream waits for the gather, the host does not
    HSDP_RETURN_IF_ERROR(
        m.blockOn(u.gather).withContext(strCat("all-gather of unit '", u.name, "'")));
    u.gather.reset();
  }
  if (u.gathered16 != nullptr) {  // compute runs in fp32 on the bf16-rounded parameters
    HSDP_RETURN_IF_ERROR(m.space->castToFloat(static_cast<const bf16*>(u.gathered16), u.gathered,
                                              u.layout.paddedNumel(), Lane::kCompute));
    HSDP_RETURN_IF_ERROR(m.pool16.release(u.gathered16));
    u.gathered16 = nullptr;
  }
  return m.pollReductions(/*block=*/false);
}

Status ShardedModel::reshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "reshard"));
  Unit& u = m.units[unit];
  if (!u.unsharded) return failedPrecondition("reshard: unit '", u.name, "' is not unsharded");
  if (u.gather) {  // resharding a unit whose gather is still in flight: let it land first
    HSDP_RETURN_IF_ERROR(m.blockOn(u.gather));
    u.gather.reset();
  }
  if (u.gathered16 != nullptr) {
    HSDP_RETURN_IF_ERROR(m.pool16.release(u.gathered16));
    u.gathered16 = nullptr;
  }
  if (m.cfg.hpz && !u.hpz_valid && !u.deferred) {  // a deferred gather never landed
    // Keep our intra-node block (shards intra_idx*J .. intra_idx*J + J-1) until step().
    const size_t n = m.mesh->shape().inter_shard * u.layout.shardNumel();
    HSDP_RETURN_IF_ERROR(m.space->copy(u.hpz_block.data(), u.gathered + m.mesh->coords().intra_idx * n,
                                       n * sizeof(float), Lane::kCompute));
    u.hpz_valid = true;
  }
  if (u.deferred) {  // never issued: nothing to free
    m.deferred.erase(std::find(m.deferred.begin(), m.deferred.end(), unit));
    u.deferred = false;
    u.unsharded = false;
    return okStatus();
  }
  if (m.shards > 1 && !m.replicatedParams()) {
    HSDP_RETURN_IF_ERROR(m.pool.release(u.gathered));
    --m.gathered_alive;
  }
  u.gathered = nullptr;
  u.unsharded = false;
  if (m.cfg.max_gathered_units > 0) HSDP_RETURN_IF_ERROR(m.issueDeferred());
  return okStatus();
}

StatusOr<ParamView> ShardedModel::param(int unit, std::string_view name) {
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "param"));
  Unit& u = impl_->units[unit];
  if (!u.unsharded)
    return failedPrecondition("param('", u.name, ".", name, "'): unit is sharded; unshard first");
  if (u.gather || u.deferred)
    return failedPrecondition("param('", u.name, ".", name,
                              "'): the unit's all-gather is in flight; waitForUnshard first");
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  const ParamSpec& p = u.layout.params()[i];
  return ParamView{u.gathered + u.layout.offset(i), p.shape, p.numel()};
}

StatusOr<ParamView> ShardedModel::grad(int unit, std::string_view name) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "grad"));
  Unit& u = m.units[unit];
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  HSDP_RETURN_IF_ERROR(m.ensureGrad(u, "grad", name));
  const ParamSpec& p = u.layout.params()[i];
  return ParamView{u.full_grad + u.layout.offset(i), p.shape, p.numel()};
}

Status ShardedModel::copyOutParams(int unit, std::span<const TensorRef> tensors) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "copyOutParams"));
  Unit& u = m.units[unit];
  if (!u.unsharded)
    return failedPrecondition("copyOutParams('", u.name, "'): unit is sharded; unshard first");
  if (u.gather || u.deferred)
    return failedPrecondition("copyOutParams('", u.name,
                              "'): the unit's all-gather is in flight; waitForUnshard first");
  HSDP_RETURN_IF_ERROR(m.checkTensors(u, tensors, "copyOutParams", /*into_flat=*/false));
  return m.runCopies(u, tensors, "copyOutParams", u.gathered, /*into_flat=*/false);
}

Status ShardedModel::copyInGrads(int unit, std::span<const TensorRef> tensors) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "copyInGrads"));
  Unit& u = m.units[unit];
  // Checked before the gradient buffer is taken (and zeroed), so a bad call changes nothing.
  HSDP_RETURN_IF_ERROR(m.checkTensors(u, tensors, "copyInGrads", /*into_flat=*/true));
  HSDP_RETURN_IF_ERROR(m.ensureGrad(u, "copyInGrads", {}));
  return m.runCopies(u, tensors, "copyInGrads", u.full_grad, /*into_flat=*/true);
}

Status ShardedModel::reduceGrad(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "reduceGrad"));
  Unit& u = m.units[unit];
  if (u.full_grad == nullptr)
    return failedPrecondition("reduceGrad: unit '", u.name, "' has no gradient; write grad() first");
  PendingReduce p;
  p.unit = unit;
  if (m.shards > 1) {
    // Average over the shard group into our shard; the replica average follows once it lands.
    StatusOr<WorkHandle> w = Status(StatusCode::kInternal, "unset");
    // On a device the scatter waits for the compute stream: the backward kernels that wrote
    // the gradient (and the bf16 rounding below) come first.
    if (m.bf16Reduce()) {  // round the whole gradient to bf16 and reduce 2-byte data
      HSDP_ASSIGN_OR_RETURN(u.full_grad16, m.pool16.acquire(/*zero=*/false));
      bf16* g16 = static_cast<bf16*>(u.full_grad16);
      HSDP_RETURN_IF_ERROR(
          m.space->castToBf16(u.full_grad, g16, u.layout.paddedNumel(), Lane::kCompute));
      w = m.reduceScatter(g16, u.grad16.data(), u.layout.shardNumel(), DType::kBFloat16);
    } else {
      w = m.reduceScatter(u.full_grad, u.grad_shard.data(), u.layout.shardNumel(),
                          DType::kFloat32);
    }
    if (!w.ok()) return w.status().withContext(strCat("reduce-scatter of unit '", u.name, "'"));
    p.scatter = std::move(*w);
  }
  // Mode none all-reduces the gradient where backward wrote it: the reduce lane (the replica
  // all-reduce's caller) must come after the compute stream's work so far. Zero1-3 need it
  // too: the bf16 upcast on the reduce lane overwrites the shard the last step read.
  HSDP_RETURN_IF_ERROR(m.space->order(Lane::kReduce, Lane::kCompute));
  u.grad_pending = true;
  m.pending.push_back(std::move(p));
  return m.pollReductions(/*block=*/false);
}

float ShardedModel::lastGradNorm() const {
  // On a device without clipping the norm is still on its way back from the last step.
  Status s = impl_->readNorm();
  if (!s.ok()) {
    HSDP_WARN(kShard, "lastGradNorm: reading the norm back failed: ", s.message());
    return std::numeric_limits<float>::quiet_NaN();
  }
  return impl_->last_grad_norm;
}

void ShardedModel::takeOptimizerSeconds(double* total, double* exposed) {
  *total = *exposed = 0;
  if (impl_->queue) impl_->queue->takeSeconds(total, exposed);
}

double ShardedModel::takeExposedCommSeconds() { return impl_->space->takeExposedSeconds(); }

Status ShardedModel::step() {
  Impl& m = *impl_;
  if (!m.finalized) return failedPrecondition("step: call finalize() first");
  HSDP_RETURN_IF_ERROR(m.pollReductions(/*block=*/true));
  for (const Unit& u : m.units)
    if (!u.grad_reduced)
      return failedPrecondition("step: unit '", u.name, "' has no reduced gradient; call "
                                "reduceGrad for every unit before step");
  // On a device: the compute stream (norm, optimizer) comes after every reduction.
  HSDP_RETURN_IF_ERROR(m.space->order(Lane::kCompute, Lane::kReduce));
  HSDP_RETURN_IF_ERROR(m.space->poll());
  ++m.step;
  for (Unit& u : m.units) u.hpz_valid = false;  // parameters change: the next gather is full
  // Global-norm clipping: the squared norm of every shard, summed over the shard group (the
  // replicas hold identical shards, so they are not added again).
  HSDP_RETURN_IF_ERROR(m.space->normBegin());
  for (Unit& u : m.units)
    HSDP_RETURN_IF_ERROR(m.space->normAccumulate(u.grad_shard.as<float>(), u.layout.shardNumel()));
  HSDP_RETURN_IF_ERROR(m.space->normReduce(m.shards > 1 ? &m.mesh->shardGroup() : nullptr));
  m.norm_pending = true;
  // The host needs the norm now only to clip; otherwise a device reads it back when asked.
  if (m.cfg.clip_norm > 0 || !m.onDevice()) HSDP_RETURN_IF_ERROR(m.readNorm());
  // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is < 1;
  // the scale is fused into the Adam pass.
  float coef = 1.0f;
  if (m.cfg.clip_norm > 0) coef = std::min(1.0f, m.cfg.clip_norm / (m.last_grad_norm + 1e-6f));
  for (Unit& u : m.units) {
    if (m.queue) {
      if (u.launched_step != m.step)  // not launched early
        HSDP_RETURN_IF_ERROR(m.launchStep(u, m.step, coef));
    } else {
      HSDP_RETURN_IF_ERROR(m.space->adamStep(
          m.cfg.adam, m.step,
          {m.master(u), u.grad_shard.as<float>(), u.exp_avg.as<float>(), u.exp_avg_sq.as<float>(),
           u.layout.shardNumel(), m.bf16Params() ? u.shard16.as<bf16>() : nullptr},
          coef));
    }
    u.grad_reduced = false;
  }
  if (m.queue) {
    // What backward did not hide of the offloaded steps is waited for here.
    HSDP_RETURN_IF_ERROR(m.queue->waitAll());
    for (Unit& u : m.units) {
      u.step_ticket = 0;
      HSDP_RETURN_IF_ERROR(m.space->awaitUpload(*u.offload));
    }
  }
  if (m.replicatedParams()) {
    // zero1/zero2: every rank stepped its slice of the whole parameters; gather them back, in
    // place, all units together: several buffers that move at once, so one group (on a device
    // one fused NCCL launch instead of a launch per unit).
    m.group_ops.clear();
    m.blocks16.clear();
    for (Unit& u : m.units) {
      const size_t n = u.layout.shardNumel();
      if (m.bf16Params()) {  // bf16 on the wire, upcast into the fp32 compute copy below
        HSDP_ASSIGN_OR_RETURN(void* b16, m.pool16.acquire(/*zero=*/false));
        m.blocks16.push_back(b16);
        m.group_ops.push_back(CollectiveOp::allGather(u.shard16.data(), b16, n, DType::kBFloat16));
      } else {
        m.group_ops.push_back(
            CollectiveOp::allGather(m.master(u), u.full_params.data(), n, DType::kFloat32));
      }
    }
    HSDP_ASSIGN_OR_RETURN(WorkHandle gathers, m.gatherGroup(m.group_ops));
    // On a device the compute stream waits for them: step() returns without the host waiting.
    HSDP_RETURN_IF_ERROR(m.blockOn(gathers).withContext("parameter all-gathers after the step"));
    for (size_t k = 0; k < m.blocks16.size(); ++k) {
      Unit& u = m.units[k];
      // The compute copy holds the bf16 rounding, as every other rank's; our own slice of the
      // fp32 master is the host/shard master, untouched by this.
      HSDP_RETURN_IF_ERROR(m.space->castToFloat(static_cast<const bf16*>(m.blocks16[k]),
                                                u.full_params.as<float>(), u.layout.paddedNumel(),
                                                Lane::kCompute));
      HSDP_RETURN_IF_ERROR(m.pool16.release(m.blocks16[k]));
    }
  }
  return okStatus();
}

Status ShardedModel::gatherFullParameters(int unit, std::vector<float>* out) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "gatherFullParameters"));
  Unit& u = m.units[unit];
  HSDP_RETURN_IF_ERROR(m.waitForStep(u));
  out->resize(u.layout.numel());
  // `out` is host memory: on a device the host waits here for the data (copyToHost).
  if (m.shards == 1 || (m.replicatedParams() && !m.bf16Params())) {
    const void* src = m.shards == 1 ? u.param_shard.data() : u.full_params.data();
    return m.space->copyToHost(out->data(), src, u.layout.numel() * sizeof(float));
  }
  HSDP_ASSIGN_OR_RETURN(void* block, m.pool.acquire(/*zero=*/false));
  // The fp32 masters (with bf16 parameters the gathered compute copies are roundings).
  auto w = m.gather(m.master(u), static_cast<float*>(block), u.layout.shardNumel());
  Status s = w.ok() ? m.space->reached(*w, Lane::kCompute, /*block=*/true, /*exposed=*/false)
                          .status()
                    : w.status();
  if (s.ok()) s = m.space->copyToHost(out->data(), block, u.layout.numel() * sizeof(float));
  HSDP_RETURN_IF_ERROR(m.pool.release(block));
  return s;
}

MemoryReport ShardedModel::memoryReport() const {
  const Impl& m = *impl_;
  MemoryReport r;
  for (const Unit& u : m.units) {
    r.param_bytes += u.param_shard.size() + u.full_params.size();
    r.grad_bytes += u.grad_shard.size() + u.full_grad_buf.size();
    r.optim_bytes += u.exp_avg.size() + u.exp_avg_sq.size();
    if (m.cfg.offload_cpu)  // the moments are host memory only then
      r.offload_host_bytes += u.exp_avg.size() + u.exp_avg_sq.size() + u.host_master.size() +
                              u.host_grad.size() + u.host16.size();
    r.hpz_bytes += u.hpz_block.size();
  }
  r.gathered_peak_bytes = m.pool.peakBytes();
  r.gathered_capacity_bytes = m.pool.capacityBytes();
  const Mesh& mesh = *m.mesh;
  r.comm_bytes = m.hier->scratchBytes() + m.hier_reduce->scratchBytes() +
                 mesh.intraShard().scratchBytes() + mesh.interShard().scratchBytes() +
                 mesh.intraShardReduce().scratchBytes() + mesh.interShardReduce().scratchBytes() +
                 mesh.shardGroup().scratchBytes() + mesh.shardGroupReduce().scratchBytes() +
                 mesh.replica().scratchBytes() + mesh.world().scratchBytes();
  return r;
}

}  // namespace hsdp
