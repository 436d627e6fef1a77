// The optimizer step: the global gradient norm and clipping, Adam/AdamW on every shard (per
// weight-decay span), CPU offload (each unit's step on the worker thread, launched as soon as its
// gradient is reduced when nothing needs the global norm first), the learning-rate setter, and
// zero1/zero2's gathers of the updated parameters; and elastic mode's part of the model (the
// job joined at finalize, beginStep, the commit inside step).
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <limits>

#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"

namespace hsdp {

using engine::GradState;
using engine::Unit;

Status ShardedModel::Impl::refresh16(Unit& u) {
  if (!bf16Params()) return okStatus();
  return space->castToBf16(master(u), paramsOf(u).shard16.as<bf16>(), u.layout.shardNumel(),
                           Lane::kCompute);
}

// The int8/int4 parameter wire: encode the master shard once, for every gather until it changes
// again. (Host only: the quantized wires run in the host schedules.)
Status ShardedModel::Impl::refreshEncoded(Unit& u) {
  if (!encodedParams()) return okStatus();
  wireEncode(paramWire(), master(u), u.layout.shardNumel(), paramsOf(u).encoded.data());
  return okStatus();
}

// Unit u's shard as the optimizer steps it: the master and gradient in place, or (offload on a
// device) their host copies and the trip there and back; the bf16 rounding and the encoded
// master it refreshes.
engine::ShardStep ShardedModel::Impl::shardStep(Unit& u) {
  engine::ShardStep s;
  engine::UnitParams& p = paramsOf(u);
  const bool staged = stagedOffload();
  s.master = staged ? u.host_master.as<float>() : master(u);
  s.grad = staged ? u.host_grad.as<float>() : gradOf(u).shard.as<float>();
  s.exp_avg = u.exp_avg.as<float>();
  s.exp_avg_sq = u.exp_avg_sq.as<float>();
  s.n = u.layout.shardNumel();
  s.spans = u.decay_spans;
  // The bf16 copy: straight into shard16 on the host; on a device into host16, then uploaded.
  if (bf16Params()) s.out16 = staged ? u.host16.as<bf16>() : p.shard16.as<bf16>();
  if (encodedParams()) {  // int8/int4 parameter wire: encoded once per step, while warm
    s.wire = paramWire();
    s.encoded = p.encoded.data();
  }
  if (staged) {
    s.slot = u.offload.get();
    s.space_master = master(u);
    s.space_grad = gradOf(u).shard.data();
    if (bf16Params()) s.space16 = p.shard16.as<bf16>();
  }
  return s;
}

// Offload: queue unit u's step t (gradient scaled by `scale`) on the worker; Reduced ->
// Stepping. On host memory the CPU Adam steps the shards in place (NUMA-placed host memory);
// on a device, host copies (a D2H copy of the gradient started here, the master back after).
Status ShardedModel::Impl::launchStep(Unit& u, int64_t t, float scale) {
  engine::GradLifecycle& g = gradOf(u).life;
  const std::initializer_list<GradState> from = {GradState::kReduced};
  HSDP_RETURN_IF_ERROR(require(u.name, g.state, "offloaded optimizer step", from));
  HSDP_RETURN_IF_ERROR(waitForSnapshot());  // the step writes what a save in flight may read
  HSDP_ASSIGN_OR_RETURN(g.ticket, opt->launch(cfg.adam, t, shardStep(u), scale));
  return transition(u.name, g.state, GradState::kStepping, "offloaded optimizer step", from);
}

// A unit's reductions landed. Offload without clipping: step it now, while backward goes on.
// (Clipping needs the global norm of every gradient first, so then step() launches them all.)
// (Elastic mode: not before the quorum commits the step.)
Status ShardedModel::Impl::onReduced(int unit) {
  HSDP_RETURN_IF_ERROR(anchorOuter());  // semi-sync: the anchor before the first inner step
  if (opt->offloaded() && cfg.clip_norm <= 0 && !elastic)
    return launchStep(units[unit], step + 1, 1.0f);
  return okStatus();
}

// The unit's parameters are about to be read: its offloaded step must have landed (on a device:
// the compute stream waits for the upload). Stepping -> Stepped.
Status ShardedModel::Impl::waitForStep(Unit& u) {
  engine::GradLifecycle& g = gradOf(u).life;
  if (g.state != GradState::kStepping) return okStatus();
  watchdog::WaitScope wait("offloaded optimizer step", u.name);
  HSDP_RETURN_IF_ERROR(opt->wait(g.ticket));
  g.ticket = 0;
  HSDP_RETURN_IF_ERROR(transition(u.name, g.state, GradState::kStepped, "offloaded optimizer step",
                                  {GradState::kStepping}));
  return opt->hostCopies().awaitUpload(*u.offload);
}

float ShardedModel::lastGradNorm() const {
  // On a device without clipping the norm is still on its way back from the last step.
  Status s = impl_->opt->readNorm();
  if (!s.ok()) {
    HSDP_WARN(kShard, "lastGradNorm: reading the norm back failed: ", s.message());
    return std::numeric_limits<float>::quiet_NaN();
  }
  return impl_->opt->lastNorm();
}

void ShardedModel::takeOptimizerSeconds(double* total, double* exposed) {
  impl_->opt->takeSeconds(total, exposed);
}

double ShardedModel::takeExposedCommSeconds() { return impl_->coll->takeExposedSeconds(); }

StepAccounting ShardedModel::takeStepAccounting() {
  StepAccounting a = impl_->coll->tracer().take();
  impl_->coll->takeLevelBytes(&a);
  return a;
}

Status ShardedModel::writeTrace() { return impl_->coll->tracer().write(); }

// setLearningRate and setClipNorm: with CPU offload and no clipping a unit steps as soon as its
// gradient is reduced, so neither setting may change once the step's first unit started.
static Status checkNotStepping(const std::vector<Unit>& units, const engine::GradReducer& grads,
                               int64_t step, const char* what, const std::string& has) {
  for (size_t k = 0; k < units.size(); ++k) {
    const Unit& u = units[k];
    const GradState state = grads.unit(static_cast<int>(k)).life.state;
    if (state == GradState::kStepping || state == GradState::kStepped)
      return failedPrecondition(what, ": unit '", u.name, "' is ", stateName(state),
                                ": it already started step ", step + 1, " with ", has,
                                " (CPU offload steps units during backward); set it before the "
                                "step's first reduceGrad");
  }
  return okStatus();
}

Status ShardedModel::setLearningRate(float lr) {
  Impl& m = *impl_;
  if (!std::isfinite(lr) || lr <= 0)
    return invalidArgument("setLearningRate: lr=", lr, " must be finite and > 0");
  HSDP_RETURN_IF_ERROR(checkNotStepping(m.units, *m.reducer, m.step, "setLearningRate",
                                        strCat("lr ", m.cfg.adam.lr)));
  m.cfg.adam.lr = lr;
  return okStatus();
}

Status ShardedModel::setClipNorm(float clip_norm) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(engine::checkClipNorm(clip_norm).withContext("setClipNorm"));
  HSDP_RETURN_IF_ERROR(checkNotStepping(m.units, *m.reducer, m.step, "setClipNorm",
                                        strCat("clip_norm ", m.cfg.clip_norm)));
  m.cfg.clip_norm = clip_norm;
  return okStatus();
}

float ShardedModel::learningRate() const { return impl_->cfg.adam.lr; }

// zero1/zero2: every rank stepped its slice of the whole parameters; gather them back, in
// place, all units together: several buffers that move at once, so one group (on a device one
// fused NCCL launch instead of a launch per unit). Frozen units did not change in a step.
Status ShardedModel::Impl::gatherReplicated(bool frozen_too) {
  engine::UnitCollectives::Group& g = coll->group();
  g.clear();
  for (size_t k = 0; k < units.size(); ++k) {
    Unit& u = units[k];
    if (u.frozen && !frozen_too) continue;
    const size_t n = u.layout.shardNumel();
    g.units.push_back(static_cast<int>(k));
    g.labels.push_back(u.name);
    if (bf16Params()) {  // bf16 on the wire, upcast into the fp32 compute copy below
      HSDP_ASSIGN_OR_RETURN(void* b16, params->pool16().acquire(/*zero=*/false));
      g.blocks16.push_back(b16);
      g.ops.push_back(
          CollectiveOp::allGather(paramsOf(u).shard16.data(), b16, n, DType::kBFloat16));
    } else {
      g.ops.push_back(
          CollectiveOp::allGather(master(u), paramsOf(u).whole.data(), n, DType::kFloat32));
    }
  }
  const int64_t issued = engine::Tracer::nowUs();
  HSDP_ASSIGN_OR_RETURN(WorkHandle gathers, coll->gatherGroup());
  // On a device the compute stream waits for them: step() returns without the host waiting.
  watchdog::WaitScope wait("step: parameter all-gathers");
  HSDP_RETURN_IF_ERROR(blockOn(gathers).withContext("parameter all-gathers after the step"));
  engine::Tracer& tr = coll->tracer();
  tr.wait(engine::TraceKind::kWaitGather, -1, issued);
  uint64_t bytes = 0;
  for (const CollectiveOp& o : g.ops) bytes += o.count * dtypeSize(o.dtype) * shards;
  tr.collective(engine::TraceKind::kGather, coll->shardLevel(), -1, bytes, issued);
  for (size_t k = 0; k < g.blocks16.size(); ++k) {
    Unit& u = units[g.units[k]];
    // The compute copy holds the bf16 rounding, as every other rank's; our own slice of the
    // fp32 master is the host/shard master, untouched by this.
    HSDP_RETURN_IF_ERROR(space->castToFloat(static_cast<const bf16*>(g.blocks16[k]),
                                            paramsOf(u).whole.as<float>(), u.layout.paddedNumel(),
                                            Lane::kCompute));
    HSDP_RETURN_IF_ERROR(params->pool16().release(g.blocks16[k]));
  }
  return okStatus();
}

Status ShardedModel::Impl::reducedGradients(const char* what) {
  HSDP_RETURN_IF_ERROR(reducer->poll(/*block=*/true));
  for (const Unit& u : units)
    if (!u.frozen)
      HSDP_RETURN_IF_ERROR(require(u.name, gradOf(u).life.state, what,
                                   {GradState::kReduced, GradState::kStepping, GradState::kStepped},
                                   strCat("it has no reduced gradient; call reduceGrad for every "
                                          "unit before ",
                                          what)));
  // On a device: the compute stream (norm, optimizer) comes after every reduction.
  HSDP_RETURN_IF_ERROR(space->order(Lane::kCompute, Lane::kReduce));
  return coll->poll();
}

// Global-norm clipping: the squared norm of every shard, summed over the shard group (the
// replicas hold identical shards, so they are not added again).
Status ShardedModel::Impl::computeNorm() {
  std::vector<std::pair<const float*, size_t>> grads;
  grads.reserve(units.size());
  for (Unit& u : units)
    if (!u.frozen) grads.push_back({gradOf(u).shard.as<float>(), u.layout.shardNumel()});
  {
    watchdog::Label label("gradient norm", "shard group");
    HSDP_RETURN_IF_ERROR(opt->beginNorm(grads, coll->normGroup()));
  }
  // The host needs the norm now only to clip; otherwise a device reads it back when asked.
  if (cfg.clip_norm > 0 || !onDevice()) HSDP_RETURN_IF_ERROR(opt->readNorm());
  return okStatus();
}

StatusOr<float> ShardedModel::gradNorm() {
  Impl& m = *impl_;
  if (!m.finalized) return failedPrecondition("gradNorm: call finalize() first");
  if (!m.norm_ready) {
    HSDP_RETURN_IF_ERROR(m.reducedGradients("gradNorm"));
    // Elastic mode: the norm is that of the quorum's average gradient, which exists once the
    // quorum committed the step; so the average and the decision come here (step() then applies
    // without voting again), and a step not committed is kAborted here, as step() would be.
    if (m.elastic && !m.elastic->committedPending())
      HSDP_RETURN_IF_ERROR(m.elasticCommit("gradNorm"));
    HSDP_RETURN_IF_ERROR(m.computeNorm());
    HSDP_RETURN_IF_ERROR(m.opt->readNorm());
    m.norm_ready = true;
  }
  return m.opt->lastNorm();
}

Status ShardedModel::step() {
  Impl& m = *impl_;
  if (!m.finalized) return failedPrecondition("step: call finalize() first");
  HSDP_RETURN_IF_ERROR(m.waitForSnapshot());  // the step writes what a save may still read
  HSDP_RETURN_IF_ERROR(m.reducedGradients("step"));
  // Elastic mode: the replica average over the groups of the step's quorum, and its decision
  // (unless gradNorm() took it). Not committed: kAborted, nothing applied.
  engine::Tracer& tr = m.coll->tracer();
  if (m.elastic && !m.elastic->committedPending()) {  // waits for the groups' averages
    const int64_t t0 = engine::Tracer::nowUs();
    HSDP_RETURN_IF_ERROR(m.elasticCommit("step"));
    tr.wait(engine::TraceKind::kWaitReplica, -1, t0);
  }
  if (m.elastic) HSDP_RETURN_IF_ERROR(m.elastic->applied());
  const int64_t optimizer_t0 = engine::Tracer::nowUs();
  ++m.step;
  for (Unit& u : m.units)  // parameters change: the next gather is full
    HSDP_RETURN_IF_ERROR(forgetNodeBlock(u.name, m.paramsOf(u).life, "step"));
  engine::OptimizerStep& opt = *m.opt;
  if (!m.norm_ready) HSDP_RETURN_IF_ERROR(m.computeNorm());
  m.norm_ready = false;
  // The scale is fused into the Adam pass.
  const float coef = opt.clipCoefficient(m.cfg.clip_norm);
  HSDP_RETURN_IF_ERROR(m.anchorOuter());
  for (Unit& u : m.units) {
    if (u.frozen) continue;
    if (opt.offloaded()) {
      if (m.gradOf(u).life.state == GradState::kReduced)  // not launched early
        HSDP_RETURN_IF_ERROR(m.launchStep(u, m.step, coef));
      continue;  // Stepping until the wait below
    }
    HSDP_RETURN_IF_ERROR(opt.stepNow(m.cfg.adam, m.step, m.shardStep(u), coef));
    HSDP_RETURN_IF_ERROR(transition(u.name, m.gradOf(u).life.state, GradState::kEmpty, "step",
                                    {GradState::kReduced}));
  }
  if (opt.offloaded()) {
    // What backward did not hide of the offloaded steps is waited for here.
    watchdog::WaitScope wait("step: offloaded optimizer");
    HSDP_RETURN_IF_ERROR(opt.waitAll());
    for (Unit& u : m.units) {
      if (u.frozen) continue;
      if (m.gradOf(u).life.state == GradState::kStepping) {  // landed: waitAll above
        m.gradOf(u).life.ticket = 0;
        HSDP_RETURN_IF_ERROR(transition(u.name, m.gradOf(u).life.state, GradState::kStepped, "step",
                                        {GradState::kStepping}));
      }
      HSDP_RETURN_IF_ERROR(opt.hostCopies().awaitUpload(*u.offload));
      HSDP_RETURN_IF_ERROR(transition(u.name, m.gradOf(u).life.state, GradState::kEmpty, "step",
                                      {GradState::kStepped}));
    }
  }
  tr.wait(engine::TraceKind::kOptimizer, -1, optimizer_t0);
  // Semi-sync replicas: the sync points (outer_step.cc). After the optimizer's span: the outer
  // all-reduce's wait is counted as replica there, and would be counted twice inside it.
  HSDP_RETURN_IF_ERROR(m.outerStep());
  if (m.replicatedParams()) HSDP_RETURN_IF_ERROR(m.gatherReplicated(/*frozen_too=*/false));
  tr.endStep();
  if (tr.on()) m.coll->traceLevelBytes();  // the step's bytes per level, at its end
  return okStatus();
}

// ---- elastic mode (docs/elastic.md): joining the job at finalize(), each step's beginStep()
// (quorum, replica Comm, heal) and the commit inside step(). The protocol and the transport are
// engine/elastic_group.h's; this says which of the model's buffers they move ----

Status ShardedModel::Impl::startElastic(uint64_t signature) {
  if (cfg.elastic.endpoint->empty()) return okStatus();
  // What must agree between replica groups: the model, the group's mesh and mode, precision and
  // optimizer (a group launched with another is refused by name).
  const MeshShape& s = mesh->shape();
  char units_hex[17];
  std::snprintf(units_hex, sizeof(units_hex), "%016" PRIx64, signature);
  const std::string fingerprint =
      strCat("units=", this->units.size(), ":", units_hex, ";mode=", shardModeName(cfg.mode),
             ";ranks=", s.world_size, ";mesh=", s.intra_shard, "x", s.inter_shard,
             ";param=", dtypeName(cfg.precision.param_dtype),
             ";reduce=", dtypeName(cfg.precision.reduce_dtype),
             ";optimizer=", optimizerName(cfg.adam.kind));
  HSDP_ASSIGN_OR_RETURN(elastic, engine::ElasticGroup::create(cfg.elastic, *coll, fingerprint));
  coll->attachGroups(elastic.get());
  return okStatus();
}

Status ShardedModel::Impl::elasticCommit(const char* what) {
  // Every unit's average was started as its reduce-scatter landed (grad_reducer.cc).
  HSDP_ASSIGN_OR_RETURN(bool commit, elastic->commit());
  if (commit) return okStatus();  // the group is Committed until step() applies it
  // Not committed: nothing is applied, the gradients are dropped, the loop repeats the step.
  for (Unit& u : units)
    if (!u.frozen)
      HSDP_RETURN_IF_ERROR(transition(u.name, gradOf(u).life.state, GradState::kEmpty,
                                      strCat(what, " (not committed)"), {GradState::kReduced}));
  return Status(StatusCode::kAborted,
                strCat("elastic step ", step,
                       " was not committed by its quorum (a group failed or left); nothing was "
                       "applied: run the step again from beginStep()"));
}

bool ShardedModel::elastic() const { return impl_->elastic != nullptr; }

StatusOr<StepStart> ShardedModel::beginStep() {
  Impl& m = *impl_;
  if (!m.finalized) return failedPrecondition("beginStep: call finalize() first");
  if (!m.elastic) {
    StepStart out;
    out.step = m.step;
    out.present = {0};
    return out;
  }
  HSDP_RETURN_IF_ERROR(m.checkIdle("beginStep"));
  if (m.elastic->committedPending())
    return failedPrecondition("beginStep: elastic step ", m.step,
                              " was committed by gradNorm() and not applied; call step() first");
  // A heal writes the training state: a save in flight must have copied it first.
  HSDP_RETURN_IF_ERROR(m.waitForSnapshot());
  // What a heal moves, rank to rank: every unit's fp32 master shard, and for units that train
  // both Adam moments; the step count follows. Then what derives from the master is refreshed.
  engine::HealState state;
  for (Unit& u : m.units) {
    const size_t bytes = u.layout.shardNumel() * sizeof(float);
    state.buffers.push_back({reinterpret_cast<char*>(m.master(u)), bytes});
    if (u.frozen) continue;
    state.buffers.push_back({reinterpret_cast<char*>(u.exp_avg.data()), bytes});
    state.buffers.push_back({reinterpret_cast<char*>(u.exp_avg_sq.data()), bytes});
  }
  state.step = &m.step;
  state.installed = [&m]() -> Status {
    for (Unit& u : m.units) {
      HSDP_RETURN_IF_ERROR(forgetNodeBlock(u.name, m.paramsOf(u).life, "heal"));
      HSDP_RETURN_IF_ERROR(m.refresh16(u));
      HSDP_RETURN_IF_ERROR(m.refreshEncoded(u));
    }
    if (m.replicatedParams()) HSDP_RETURN_IF_ERROR(m.gatherReplicated(/*frozen_too=*/true));
    return okStatus();
  };
  return m.elastic->begin(m.step, state);
}

StatusOr<std::vector<std::vector<int>>> ShardedModel::elasticMembership(int64_t steps,
                                                                        int64_t from) {
  if (!impl_->elastic) return failedPrecondition("elasticMembership: elastic mode is off");
  if (from < 0 || from > steps)
    return invalidArgument("elasticMembership: steps [", from, ", ", steps, ") is not a range");
  return impl_->elastic->membership(steps, from);
}

// ---- semi-synchronous replicas: the model's part of the sync (engine/outer_step.h) ----

Status ShardedModel::Impl::anchorOuter() {
  if (!outer->active() || outer->anchored()) return okStatus();
  for (Unit& u : units)
    if (!u.frozen) outer->capture(indexOf(u), master(u), u.layout.shardNumel());
  outer->setAnchored(true);
  return okStatus();
}

Status ShardedModel::Impl::outerStep() {
  if (!outer->active()) return okStatus();
  std::vector<engine::OuterSync::Shard>& due = outer_due;
  due.clear();
  for (Unit& u : units) {
    const int k = indexOf(u);
    if (u.frozen || !(outer->syncsAfter(k, step) || outer->landsAfter(k, step))) continue;
    due.push_back({k, master(u), gradOf(u).shard.as<float>(), u.layout.shardNumel(),
                   gradOf(u).replica_residual.as<float>()});
  }
  if (due.empty() && outer->inFlightUnit() < 0) return okStatus();
  HSDP_RETURN_IF_ERROR(outer->sync(step, due));
  for (const engine::OuterSync::Shard& s : due) {    // what derives from the master
    if (!outer->landsAfter(s.unit, step)) continue;  // started only (sync_delay > 0)
    HSDP_RETURN_IF_ERROR(refresh16(units[s.unit]));
    HSDP_RETURN_IF_ERROR(refreshEncoded(units[s.unit]));
  }
  return okStatus();
}

}  // namespace hsdp
