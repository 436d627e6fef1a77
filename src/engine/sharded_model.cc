// ShardedModel, the facade: creation (engine/config_check.h refuses what cannot run), unit
// registration, the small accessors, setParameter and gatherFullParameters, the lifecycle's
// verbs (unshard ... reshard and the copies: the ParamGroup's, engine/param_group.h; grad,
// copyInGrads, reduceGrad: the GradReducer's, engine/grad_reducer.h), and finalize() with the
// memory report beside it. The step and the checkpoints live beside it (sharded_model_impl.h).
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "engine/config_check.h"
#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"
#include "storage/format.h"

namespace hsdp {

using engine::Unit;

Status ShardedModel::Impl::checkUnit(int u, const char* verb) const {
  if (!finalized) return failedPrecondition(verb, ": call finalize() first");
  if (u < 0 || u >= static_cast<int>(units.size()))
    return outOfRange(verb, ": unit ", u, " outside [0, ", units.size(), ")");
  return okStatus();
}

ShardedModel::ShardedModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardedModel::~ShardedModel() {
  if (!impl_ || !impl_->coll) return;
  Status s = impl_->coll->tracer().write();
  if (!s.ok()) HSDP_WARN(kShard, "writing the trace failed: ", s.message());
}

StatusOr<std::unique_ptr<ShardedModel>> ShardedModel::create(const Mesh& mesh,
                                                             EngineConfig config) {
  HSDP_ASSIGN_OR_RETURN(EngineConfig cfg, resolveEngineConfig(std::move(config)));
  HSDP_RETURN_IF_ERROR(engine::checkConfig(mesh, cfg));
  HSDP_RETURN_IF_ERROR(watchdog::setTimeout(*cfg.failure.timeout_s));
  auto impl = std::make_unique<Impl>();
  impl->mesh = &mesh;
  HSDP_ASSIGN_OR_RETURN(impl->opt, engine::OptimizerStep::create(cfg));
  SpaceBundle space;
  if (cfg.device == Device::kHost) {  // host shards are stepped by the SIMD CPU Adam
    space = hostMemorySpace(
        [adam = impl->opt->cpuAdam()](const AdamConfig& c, int64_t t, const AdamShard& s,
                                      float scale) { return adam->step(c, t, s, scale); });
  } else {
    HSDP_ASSIGN_OR_RETURN(space, createMemorySpace(cfg.device, /*compute_stream=*/nullptr));
  }
  impl->space = std::move(space.memory);
  impl->opt->setSpace(std::move(space.kernels), std::move(space.host_copies));
  impl->cfg = cfg;
  impl->shards = cfg.mode == ShardMode::kNone ? 1 : mesh.shape().shardGroupSize();
  bool hierarchical = *cfg.pipeline.hierarchical;
  // The two-level schedules stage chunks with host memcpy. On a device one collective over the
  // shard group does it: NCCL runs its own intra/inter hierarchy inside a communicator (and
  // UnitCollectives binds the communicators to the space's lanes).
  if (cfg.device != Device::kHost) hierarchical = false;
  engine::UnitCollectives::Options copt;
  copt.shards = impl->shards;
  copt.hierarchical = hierarchical;
  copt.on_device = impl->onDevice();
  copt.hpz = cfg.hpz;
  copt.gather.chunks = copt.reduce.chunks = *cfg.pipeline.chunks;
  copt.gather.min_chunk_bytes = copt.reduce.min_chunk_bytes = *cfg.pipeline.min_chunk_bytes;
  // The wires per direction (inter_dtype, their shorthand, is already resolved into them).
  copt.gather.gather_wire = {*cfg.wires.inter_param_wire, *cfg.wires.quant_block};
  copt.reduce.reduce_wire = {*cfg.wires.inter_grad_wire, *cfg.wires.quant_block};
  copt.replica_wire = {*cfg.wires.replica_wire, *cfg.wires.quant_block};
  HSDP_ASSIGN_OR_RETURN(impl->coll,
                        engine::UnitCollectives::create(mesh, std::move(space.collectives), copt));
  engine::ParamGroup::Options popt;
  popt.shards = impl->shards;
  popt.replicated = impl->replicatedParams();
  popt.bf16 = impl->bf16Params();
  popt.encoded = impl->encodedParams();
  popt.hpz = cfg.hpz;
  popt.max_gathered = cfg.pipeline.max_gathered_units;
  popt.inter_shard = mesh.shape().inter_shard;
  popt.intra_idx = mesh.coords().intra_idx;
  impl->params = std::make_unique<engine::ParamGroup>(impl->units, *impl->space, *impl->coll, popt);
  engine::GradReducer::Options ropt;
  ropt.shards = impl->shards;
  ropt.pooled = impl->pooledGrads();
  ropt.bf16 = impl->bf16Reduce();
  ropt.replica_average = cfg.replica_sync.policy == ReplicaPolicy::kSync;
  impl->outer = std::make_unique<engine::OuterSync>(cfg.replica_sync, *impl->coll);
  Impl* m = impl.get();
  impl->reducer = std::make_unique<engine::GradReducer>(
      impl->units, *impl->space, *impl->coll, impl->params->pool(), impl->params->pool16(), ropt,
      [m](int unit) { return m->onReduced(unit); });
  return std::unique_ptr<ShardedModel>(new ShardedModel(std::move(impl)));
}

StatusOr<int> ShardedModel::addUnit(std::string name, std::vector<ParamSpec> params,
                                    UnitOptions options) {
  Impl& m = *impl_;
  if (m.finalized) return failedPrecondition("addUnit('", name, "') after finalize()");
  for (size_t i = 0; i < m.units.size(); ++i)
    if (m.units[i].name == name)
      return invalidArgument("addUnit('", name, "'): duplicate unit name '", name, "' (unit ", i,
                             " has it)");
  StatusOr<FlatLayout> created = FlatLayout::create(std::move(params), m.shards);
  if (!created.ok()) return created.status().withContext(strCat("addUnit('", name, "')"));
  FlatLayout layout = std::move(*created);
  // Checkpoints and safetensors name tensors "<unit>.<param>": no two may join to one name.
  std::vector<ckpt::UnitDesc> descs = m.unitDescs();
  ckpt::UnitDesc mine{name, options.frozen, {}};
  for (const ParamSpec& p : layout.params()) mine.params.push_back({p.name, p.shape});
  descs.push_back(std::move(mine));
  HSDP_RETURN_IF_ERROR(ckpt::checkTensorNames(descs, strCat("addUnit('", name, "')")));
  Unit u;
  u.name = std::move(name);
  u.layout = std::move(layout);
  u.frozen = options.frozen;
  m.units.push_back(std::move(u));
  m.params->addUnit();
  m.reducer->addUnit();
  return static_cast<int>(m.units.size()) - 1;
}

int ShardedModel::numUnits() const { return static_cast<int>(impl_->units.size()); }
const std::string& ShardedModel::unitName(int u) const { return impl_->units.at(u).name; }
const FlatLayout& ShardedModel::layout(int u) const { return impl_->units.at(u).layout; }
bool ShardedModel::frozen(int u) const { return impl_->units.at(u).frozen; }
const EngineConfig& ShardedModel::config() const { return impl_->cfg; }
int64_t ShardedModel::stepCount() const { return impl_->step; }
ShardMode ShardedModel::mode() const { return impl_->cfg.mode; }
int ShardedModel::shardCount() const { return impl_->shards; }
bool ShardedModel::hierarchical() const { return impl_->coll->hierarchical(); }
Device ShardedModel::device() const { return impl_->cfg.device; }
void ShardedModel::setComputeStream(void* cuda_stream) {
  impl_->space->setComputeStream(cuda_stream);
}

Status ShardedModel::setParameter(int unit, std::string_view name, const float* full,
                                  size_t numel) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "setParameter"));
  // Streaming's delay: the unit's outer update, when it lands, would overwrite the value.
  HSDP_RETURN_IF_ERROR(m.outer->checkIdle("setParameter", m.step, m.units, unit));
  Unit& u = m.units[unit];
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  const ParamSpec& p = u.layout.params()[i];
  if (numel != p.numel())
    return invalidArgument("setParameter('", u.name, ".", name, "'): ", numel,
                           " values for a parameter of ", p.numel());
  HSDP_RETURN_IF_ERROR(m.waitForStep(u));
  HSDP_RETURN_IF_ERROR(m.waitForSnapshot());  // a save in flight may still read the shard
  MemorySpace& sp = *m.space;                 // `full` is host memory; the buffers are the space's
  // Our slice of the parameter, exact, into the fp32 master shard.
  auto copySlice = [&]() -> Status {
    auto [sb, se] = u.layout.shardRange(m.shardIndex());
    const size_t pb = u.layout.offset(i), pe = pb + p.numel();
    const size_t b = std::max(sb, pb), e = std::min(se, pe);
    if (b >= e) return okStatus();
    return sp.copyFromHost(m.paramsOf(u).shard.as<float>() + (b - sb), full + (b - pb),
                           (e - b) * sizeof(float));
  };
  if (m.replicatedParams()) {  // every rank holds the whole parameter
    float* dst = m.paramsOf(u).whole.as<float>() + u.layout.offset(i);
    if (m.bf16Params()) {
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
  if (m.stagedOffload() && !u.frozen)  // the host master mirrors the shard
    HSDP_RETURN_IF_ERROR(
        sp.copyToHost(u.host_master.data(), m.master(u), u.layout.shardNumel() * sizeof(float)));
  // Semi-sync (diloco): the unit's anchor follows (the whole unit's shard; before the first step
  // the anchors are taken then).
  if (m.outer->anchored() && !u.frozen) m.outer->capture(unit, m.master(u), u.layout.shardNumel());
  HSDP_RETURN_IF_ERROR(m.refreshEncoded(u));
  return m.refresh16(u);
}

Status ShardedModel::gatherFullParameters(int unit, std::vector<float>* out) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "gatherFullParameters"));
  Unit& u = m.units[unit];
  HSDP_RETURN_IF_ERROR(m.waitForStep(u));
  out->resize(u.layout.numel());
  // `out` is host memory: on a device the host waits here for the data (copyToHost).
  if (m.shards == 1 || (m.replicatedParams() && !m.bf16Params())) {
    const engine::UnitParams& p = m.paramsOf(u);
    const void* src = m.shards == 1 ? p.shard.data() : p.whole.data();
    return m.space->copyToHost(out->data(), src, u.layout.numel() * sizeof(float));
  }
  HSDP_ASSIGN_OR_RETURN(void* block, m.params->pool().acquire(/*zero=*/false));
  // The fp32 masters (with bf16 parameters the gathered compute copies are roundings; an
  // int8/int4 parameter wire is bypassed: this gather is exact).
  watchdog::Label label(u.name, "shard group");
  auto w = m.coll->gatherExact(m.master(u), block, u.layout.shardNumel());
  watchdog::WaitScope wait("gatherFullParameters", u.name);
  Status s = w.ok()
                 ? m.coll->reached(*w, Lane::kCompute, /*block=*/true, /*exposed=*/false).status()
                 : w.status();
  if (s.ok()) s = m.space->copyToHost(out->data(), block, u.layout.numel() * sizeof(float));
  HSDP_RETURN_IF_ERROR(m.params->pool().release(block));
  return s;
}

// ---- the parameters' verbs (engine/param_group.h) ----

Status ShardedModel::unshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "unshard"));
  HSDP_RETURN_IF_ERROR(m.params->checkUnshard(unit));
  HSDP_RETURN_IF_ERROR(m.reducer->poll(/*block=*/false));
  HSDP_RETURN_IF_ERROR(m.waitForStep(m.units[unit]));  // never gather before the step lands
  return m.params->unshard(unit);
}

Status ShardedModel::waitForUnshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "waitForUnshard"));
  HSDP_RETURN_IF_ERROR(m.params->waitForUnshard(unit));
  return m.reducer->poll(/*block=*/false);
}

Status ShardedModel::reshard(int unit) {
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "reshard"));
  return impl_->params->reshard(unit);
}

StatusOr<ParamView> ShardedModel::param(int unit, std::string_view name) {
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "param"));
  return impl_->params->param(unit, name);
}

Status ShardedModel::copyOutParams(int unit, std::span<const TensorRef> tensors) {
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "copyOutParams"));
  return impl_->params->copyOut(unit, tensors);
}

// ---- the gradient's verbs (engine/grad_reducer.h) ----

StatusOr<ParamView> ShardedModel::grad(int unit, std::string_view name) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "grad"));
  Unit& u = m.units[unit];
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  HSDP_RETURN_IF_ERROR(m.reducer->ensure(unit, "grad", name));
  const ParamSpec& p = u.layout.params()[i];
  return ParamView{m.gradOf(u).life.full + u.layout.offset(i), p.shape, p.numel()};
}

Status ShardedModel::copyInGrads(int unit, std::span<const TensorRef> tensors) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "copyInGrads"));
  Unit& u = m.units[unit];
  // Checked before the gradient buffer is taken (and zeroed), so a bad call changes nothing.
  HSDP_RETURN_IF_ERROR(m.params->checkTensors(unit, tensors, "copyInGrads", /*into_flat=*/true));
  HSDP_RETURN_IF_ERROR(m.reducer->ensure(unit, "copyInGrads", {}));
  return m.params->runCopies(unit, tensors, "copyInGrads", m.gradOf(u).life.full,
                             /*into_flat=*/true);
}

Status ShardedModel::reduceGrad(int unit) {
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "reduceGrad"));
  impl_->norm_ready = false;  // the gradient changes: a norm computed before is stale
  return impl_->reducer->reduce(unit);
}

// ---- finalize(): every buffer the engine will use, allocated once (and pre-faulted by the
// memory space), and the memory report that counts exactly those buffers, side by side so that
// the two cannot drift apart ----
namespace {

// Every rank must hold the same units, or the collectives would pair different buffers and hang
// or corrupt: a signature of all names, shapes and per-unit settings, compared across the world.
uint64_t registrationSignature(const std::vector<Unit>& units) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  for (const Unit& u : units) {
    XXH64_update(st, u.name.data(), u.name.size() + 1);
    const char frozen = u.frozen ? 1 : 0;
    XXH64_update(st, &frozen, 1);
    for (const ParamSpec& p : u.layout.params()) {
      XXH64_update(st, p.name.data(), p.name.size() + 1);
      XXH64_update(st, p.shape.data(), p.shape.size() * sizeof(int64_t));
      const char decay = p.weight_decay ? 1 : 0;
      XXH64_update(st, &decay, 1);
      int64_t sep = -1;
      XXH64_update(st, &sep, sizeof(sep));
    }
  }
  const uint64_t sig = XXH64_digest(st);
  XXH64_freeState(st);
  return sig;
}

}  // namespace

// Error feedback buffers of the unit's encoded gradient wires, zeroed once.
Status ShardedModel::Impl::allocateResiduals(Unit& u) {
  if (!*cfg.wires.grad_error_feedback || u.frozen) return okStatus();
  const size_t n = u.layout.shardNumel();
  const size_t inter = coll->gradResidualCount(n);
  const size_t replica = coll->replicaResidualCount(n);
  engine::UnitGrad& g = gradOf(u);
  if (inter > 0) {
    HSDP_ASSIGN_OR_RETURN(g.residual, space->allocate(inter * sizeof(float)));
    HSDP_RETURN_IF_ERROR(space->zero(g.residual.data(), inter * sizeof(float), Lane::kCompute));
  }
  if (replica > 0) {
    HSDP_ASSIGN_OR_RETURN(g.replica_residual, space->allocate(replica * sizeof(float)));
    HSDP_RETURN_IF_ERROR(
        space->zero(g.replica_residual.data(), replica * sizeof(float), Lane::kCompute));
  }
  return okStatus();
}

Status ShardedModel::finalize() {
  Impl& m = *impl_;
  if (m.finalized) return failedPrecondition("finalize() called twice");
  int64_t mine[2] = {static_cast<int64_t>(m.units.size()),
                     static_cast<int64_t>(registrationSignature(m.units))};
  std::vector<int64_t> all(2 * m.coll->controlSize());
  HSDP_RETURN_IF_ERROR(m.coll->controlAllGather(mine, all.data(), 2, DType::kInt64));
  for (int r = 1; r < m.coll->controlSize(); ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      return invalidArgument("unit registrations differ across ranks: rank 0 registered ", all[0],
                             " units (signature ", std::hex, static_cast<uint64_t>(all[1]),
                             std::dec, "), rank ", r, " registered ", all[2 * r],
                             " units (signature ", std::hex, static_cast<uint64_t>(all[2 * r + 1]),
                             std::dec, "); every rank must add the same units and parameters");
  }
  if (m.units.empty()) return failedPrecondition("finalize(): no units registered");
  HSDP_RETURN_IF_ERROR(engine::checkReplicaSync(m.cfg.replica_sync, m.mesh->shape().replicas(),
                                                static_cast<int>(m.units.size())));
  HSDP_RETURN_IF_ERROR(m.coll->connectReplicas());

  size_t max_shard = 0, max_padded = 0;
  MemorySpace& sp = *m.space;
  // What the CPU Adam steps in place (offload on host memory: the master and the gradient
  // shard) is NUMA-placed host memory, as the moments; everything else comes from the space.
  auto allocateStepped = [&](bool stepped, size_t bytes) -> StatusOr<SpaceBuffer> {
    if (!stepped || !m.opt->offloaded() || m.onDevice()) return sp.allocate(bytes);
    HSDP_ASSIGN_OR_RETURN(HostBuffer b, HostBuffer::allocateNuma(bytes, m.opt->numa()));
    return SpaceBuffer::wrap(std::move(b));
  };
  for (Unit& u : m.units) {
    const size_t n = u.layout.shardNumel();
    const size_t bytes = n * sizeof(float);
    const size_t full_bytes = u.layout.paddedNumel() * sizeof(float);
    u.decay_spans = engine::decaySpans(u.layout, m.shardIndex());
    engine::UnitParams& p = m.paramsOf(u);
    const bool bf16_whole = m.cfg.precision.param_dtype == DType::kBFloat16;
    if (m.replicatedParams()) {  // the master is a slice of the whole, or apart with bf16
      HSDP_ASSIGN_OR_RETURN(p.whole, allocateStepped(!u.frozen && !bf16_whole, full_bytes));
      if (bf16_whole) {
        HSDP_ASSIGN_OR_RETURN(p.shard, allocateStepped(!u.frozen, bytes));
      }
      if (m.cfg.mode == ShardMode::kZero1 && !u.frozen) {
        HSDP_ASSIGN_OR_RETURN(m.gradOf(u).whole, sp.allocate(full_bytes));
      }
    } else {
      HSDP_ASSIGN_OR_RETURN(p.shard, allocateStepped(!u.frozen, bytes));
    }
    if (m.bf16Params()) {
      HSDP_ASSIGN_OR_RETURN(p.shard16, sp.allocate(n * sizeof(bf16)));
    }
    if (m.cfg.hpz) {
      HSDP_ASSIGN_OR_RETURN(p.node_block, sp.allocate(m.mesh->shape().inter_shard * bytes));
    }
    if (m.encodedParams()) {
      HSDP_ASSIGN_OR_RETURN(p.encoded, sp.allocate(encodedBytes(m.paramWire(), n)));
    }
    max_shard = std::max(max_shard, n);
    max_padded = std::max(max_padded, u.layout.paddedNumel());
    if (u.frozen) continue;  // no gradient, no optimizer state
    HSDP_ASSIGN_OR_RETURN(m.gradOf(u).shard, allocateStepped(true, bytes));
    if (m.opt->offloaded()) {  // offload: optimizer state in NUMA-local host memory
      HSDP_ASSIGN_OR_RETURN(HostBuffer ea, HostBuffer::allocateNuma(bytes, m.opt->numa()));
      HSDP_ASSIGN_OR_RETURN(HostBuffer eas, HostBuffer::allocateNuma(bytes, m.opt->numa()));
      u.exp_avg = SpaceBuffer::wrap(std::move(ea));
      u.exp_avg_sq = SpaceBuffer::wrap(std::move(eas));
      if (m.stagedOffload()) {  // on a device: the host copies the CPU Adam steps
        HSDP_ASSIGN_OR_RETURN(u.host_master, HostBuffer::allocateNuma(bytes, m.opt->numa()));
        HSDP_ASSIGN_OR_RETURN(u.host_grad, HostBuffer::allocateNuma(bytes, m.opt->numa()));
      }
      if (m.bf16Params() && m.stagedOffload()) {
        HSDP_ASSIGN_OR_RETURN(u.host16, HostBuffer::allocateNuma(n * sizeof(bf16), m.opt->numa()));
      }
      HSDP_ASSIGN_OR_RETURN(
          u.offload, m.opt->hostCopies().offloadSlot({{u.host_grad.data(), u.host_grad.size()},
                                                      {u.host_master.data(), u.host_master.size()},
                                                      {u.host16.data(), u.host16.size()}}));
    } else {
      HSDP_ASSIGN_OR_RETURN(u.exp_avg, sp.allocate(bytes));
      HSDP_ASSIGN_OR_RETURN(u.exp_avg_sq, sp.allocate(bytes));
    }
    if (m.bf16Reduce()) {
      HSDP_ASSIGN_OR_RETURN(m.gradOf(u).shard16, sp.allocate(n * sizeof(bf16)));
    }
    HSDP_RETURN_IF_ERROR(m.allocateResiduals(u));
  }
  m.outer->allocate(m.units);
  // The encoded master starts current (zeros, or what setParameter/load write next).
  for (Unit& u : m.units) HSDP_RETURN_IF_ERROR(m.refreshEncoded(u));
  if (m.bf16Params() || m.bf16Reduce()) {
    HSDP_RETURN_IF_ERROR(m.params->pool16().init(m.space.get(), max_padded * sizeof(bf16), 4));
  }
  if (m.shards > 1) {
    // zero3: four blocks: in backward the current unit's parameters, the prefetched next unit's,
    // the gradient being written and one still being reduce-scattered. zero2: the last two.
    // zero1 holds whole gradients and needs none.
    const int blocks = m.cfg.mode == ShardMode::kZero3   ? 4
                       : m.cfg.mode == ShardMode::kZero2 ? 2
                                                         : 0;
    HSDP_RETURN_IF_ERROR(m.params->pool().init(m.space.get(), max_padded * sizeof(float), blocks));
  }
  HSDP_RETURN_IF_ERROR(m.coll->reserve(max_shard, m.bf16Params() || m.bf16Reduce()));
  m.coll->group().reserve(m.units.size());
  // The trace (docs/trace.md): the clock offsets to rank 0, the ring, its directory made.
  HSDP_RETURN_IF_ERROR(m.agree(m.coll->startTrace(engine::Tracer::directory(m.cfg.trace_dir))));
  HSDP_RETURN_IF_ERROR(m.startElastic(registrationSignature(m.units)));
  m.finalized = true;
  HSDP_INFO(kShard, "finalized ", m.units.size(), " units, mode ", shardModeName(m.cfg.mode),
            ", device ", deviceName(m.cfg.device), ", shard group ", m.shards, ", largest unit ",
            max_padded, " elements (padded)");
  return okStatus();
}

MemoryReport ShardedModel::memoryReport() const {
  const Impl& m = *impl_;
  MemoryReport r;
  for (const Unit& u : m.units) {
    const engine::UnitParams& p = m.paramsOf(u);
    const engine::UnitGrad& g = m.gradOf(u);
    r.param_bytes += p.shard.size() + p.whole.size();
    r.grad_bytes += g.shard.size() + g.whole.size();
    r.optim_bytes += u.exp_avg.size() + u.exp_avg_sq.size();
    // With offload, the host memory the CPU Adam steps: the moments, and the master and the
    // gradient shard: on a device their host copies; on host memory the shards themselves,
    // stepped in place (one buffer each, in param_bytes/grad_bytes too; total() counts it once).
    if (m.cfg.offload.cpu && !u.frozen) {
      const size_t stepped = m.stagedOffload()
                                 ? u.host_master.size() + u.host_grad.size() + u.host16.size()
                                 : u.layout.shardNumel() * sizeof(float) + g.shard.size();
      r.offload_host_bytes += u.exp_avg.size() + u.exp_avg_sq.size() + stepped;
    }
    r.hpz_bytes += p.node_block.size();
    // The encoded wires' per-unit state counts as communication memory.
    r.comm_bytes += p.encoded.size() + g.residual.size() + g.replica_residual.size();
  }
  r.gathered_peak_bytes = m.params->pool().peakBytes();
  r.gathered_capacity_bytes = m.params->pool().capacityBytes();
  r.comm_bytes += m.coll->scratchBytes();
  return r;
}

}  // namespace hsdp
