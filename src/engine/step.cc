// The optimizer step: the global gradient norm and clipping, Adam/AdamW on every shard (per
// weight-decay span), CPU offload (each unit's step on the worker thread, launched as soon as its
// gradient is reduced when nothing needs the global norm first), the learning-rate setter, and
// zero1/zero2's gathers of the updated parameters.
#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"

namespace hsdp {

using engine::GradState;
using engine::Unit;

Status ShardedModel::Impl::refresh16(Unit& u) {
  if (!bf16Params()) return okStatus();
  return space->castToBf16(master(u), u.shard16.as<bf16>(), u.layout.shardNumel(), Lane::kCompute);
}

// The int8/int4 parameter wire: encode the master shard once, for every gather until it changes
// again. (Host only: the quantized wires run in the host schedules.)
Status ShardedModel::Impl::refreshEncoded(Unit& u) {
  if (!encodedParams()) return okStatus();
  wireEncode(paramWire(), master(u), u.layout.shardNumel(), u.encoded_shard.data());
  return okStatus();
}

// Unit u's shard as the optimizer steps it: the master and gradient in place, or (offload on a
// device) their host copies and the trip there and back; the bf16 rounding and the encoded
// master it refreshes.
engine::ShardStep ShardedModel::Impl::shardStep(Unit& u) {
  engine::ShardStep s;
  const bool staged = stagedOffload();
  s.master = staged ? u.host_master.as<float>() : master(u);
  s.grad = staged ? u.host_grad.as<float>() : u.grad_shard.as<float>();
  s.exp_avg = u.exp_avg.as<float>();
  s.exp_avg_sq = u.exp_avg_sq.as<float>();
  s.n = u.layout.shardNumel();
  s.spans = u.decay_spans;
  // The bf16 copy: straight into shard16 on the host; on a device into host16, then uploaded.
  if (bf16Params()) s.out16 = staged ? u.host16.as<bf16>() : u.shard16.as<bf16>();
  if (encodedParams()) {  // int8/int4 parameter wire: encoded once per step, while warm
    s.wire = paramWire();
    s.encoded = u.encoded_shard.data();
  }
  if (staged) {
    s.slot = u.offload.get();
    s.space_master = master(u);
    s.space_grad = u.grad_shard.data();
    if (bf16Params()) s.space16 = u.shard16.as<bf16>();
  }
  return s;
}

// Offload: queue unit u's step t (gradient scaled by `scale`) on the worker; Reduced ->
// Stepping. On host memory the CPU Adam steps the shards in place (NUMA-placed host memory);
// on a device, host copies (a D2H copy of the gradient started here, the master back after).
Status ShardedModel::Impl::launchStep(Unit& u, int64_t t, float scale) {
  const std::initializer_list<GradState> from = {GradState::kReduced};
  HSDP_RETURN_IF_ERROR(require(u.name, u.grads.state, "offloaded optimizer step", from));
  HSDP_RETURN_IF_ERROR(waitForSnapshot());  // the step writes what a save in flight may read
  HSDP_ASSIGN_OR_RETURN(u.grads.ticket, opt->launch(cfg.adam, t, shardStep(u), scale));
  return transition(u.name, u.grads.state, GradState::kStepping, "offloaded optimizer step", from);
}

// The unit's parameters are about to be read: its offloaded step must have landed (on a device:
// the compute stream waits for the upload). Stepping -> Stepped.
Status ShardedModel::Impl::waitForStep(Unit& u) {
  if (u.grads.state != GradState::kStepping) return okStatus();
  watchdog::WaitScope wait("offloaded optimizer step", u.name);
  HSDP_RETURN_IF_ERROR(opt->wait(u.grads.ticket));
  u.grads.ticket = 0;
  HSDP_RETURN_IF_ERROR(transition(u.name, u.grads.state, GradState::kStepped,
                                  "offloaded optimizer step", {GradState::kStepping}));
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

// setLearningRate and setClipNorm: with CPU offload and no clipping a unit steps as soon as its
// gradient is reduced, so neither setting may change once the step's first unit started.
static Status checkNotStepping(const std::vector<Unit>& units, int64_t step, const char* what,
                               const std::string& has) {
  for (const Unit& u : units)
    if (u.grads.state == GradState::kStepping || u.grads.state == GradState::kStepped)
      return failedPrecondition(what, ": unit '", u.name, "' is ", stateName(u.grads.state),
                                ": it already started step ", step + 1, " with ", has,
                                " (CPU offload steps units during backward); set it before the "
                                "step's first reduceGrad");
  return okStatus();
}

Status ShardedModel::setLearningRate(float lr) {
  Impl& m = *impl_;
  if (!std::isfinite(lr) || lr <= 0)
    return invalidArgument("setLearningRate: lr=", lr, " must be finite and > 0");
  HSDP_RETURN_IF_ERROR(
      checkNotStepping(m.units, m.step, "setLearningRate", strCat("lr ", m.cfg.adam.lr)));
  m.cfg.adam.lr = lr;
  return okStatus();
}

Status ShardedModel::setClipNorm(float clip_norm) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(engine::checkClipNorm(clip_norm).withContext("setClipNorm"));
  HSDP_RETURN_IF_ERROR(
      checkNotStepping(m.units, m.step, "setClipNorm", strCat("clip_norm ", m.cfg.clip_norm)));
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
      HSDP_ASSIGN_OR_RETURN(void* b16, blocks.pool16.acquire(/*zero=*/false));
      g.blocks16.push_back(b16);
      g.ops.push_back(CollectiveOp::allGather(u.shard16.data(), b16, n, DType::kBFloat16));
    } else {
      g.ops.push_back(CollectiveOp::allGather(master(u), u.full_params.data(), n, DType::kFloat32));
    }
  }
  HSDP_ASSIGN_OR_RETURN(WorkHandle gathers, coll->gatherGroup());
  // On a device the compute stream waits for them: step() returns without the host waiting.
  watchdog::WaitScope wait("step: parameter all-gathers");
  HSDP_RETURN_IF_ERROR(blockOn(gathers).withContext("parameter all-gathers after the step"));
  for (size_t k = 0; k < g.blocks16.size(); ++k) {
    Unit& u = units[g.units[k]];
    // The compute copy holds the bf16 rounding, as every other rank's; our own slice of the
    // fp32 master is the host/shard master, untouched by this.
    HSDP_RETURN_IF_ERROR(space->castToFloat(static_cast<const bf16*>(g.blocks16[k]),
                                            u.full_params.as<float>(), u.layout.paddedNumel(),
                                            Lane::kCompute));
    HSDP_RETURN_IF_ERROR(blocks.pool16.release(g.blocks16[k]));
  }
  return okStatus();
}

Status ShardedModel::step() {
  Impl& m = *impl_;
  if (!m.finalized) return failedPrecondition("step: call finalize() first");
  HSDP_RETURN_IF_ERROR(m.waitForSnapshot());  // the step writes what a save may still read
  HSDP_RETURN_IF_ERROR(m.pollReductions(/*block=*/true));
  for (const Unit& u : m.units)
    if (!u.frozen)
      HSDP_RETURN_IF_ERROR(require(u.name, u.grads.state, "step",
                                   {GradState::kReduced, GradState::kStepping, GradState::kStepped},
                                   "it has no reduced gradient; call reduceGrad for every unit "
                                   "before step"));
  // On a device: the compute stream (norm, optimizer) comes after every reduction.
  HSDP_RETURN_IF_ERROR(m.space->order(Lane::kCompute, Lane::kReduce));
  HSDP_RETURN_IF_ERROR(m.coll->poll());
  if (m.elastic) {
    // The replica average over the groups of the step's quorum, and its decision. Not
    // committed: nothing is applied, the gradients are dropped, the loop repeats the step.
    HSDP_ASSIGN_OR_RETURN(bool commit, m.elasticCommit());
    if (!commit) {
      for (Unit& u : m.units)
        if (!u.frozen)
          HSDP_RETURN_IF_ERROR(transition(u.name, u.grads.state, GradState::kEmpty,
                                          "step (not committed)", {GradState::kReduced}));
      return Status(StatusCode::kAborted,
                    strCat("elastic step ", m.step,
                           " was not committed by its quorum (a group "
                           "failed or left); nothing was applied: run the step again from "
                           "beginStep()"));
    }
  }
  ++m.step;
  for (Unit& u : m.units)  // parameters change: the next gather is full
    HSDP_RETURN_IF_ERROR(forgetNodeBlock(u.name, u.params, "step"));
  // Global-norm clipping: the squared norm of every shard, summed over the shard group (the
  // replicas hold identical shards, so they are not added again).
  engine::OptimizerStep& opt = *m.opt;
  std::vector<std::pair<const float*, size_t>> grads;
  grads.reserve(m.units.size());
  for (Unit& u : m.units)
    if (!u.frozen) grads.push_back({u.grad_shard.as<float>(), u.layout.shardNumel()});
  {
    watchdog::Label label("gradient norm", "shard group");
    HSDP_RETURN_IF_ERROR(opt.beginNorm(grads, m.coll->normGroup()));
  }
  // The host needs the norm now only to clip; otherwise a device reads it back when asked.
  if (m.cfg.clip_norm > 0 || !m.onDevice()) HSDP_RETURN_IF_ERROR(opt.readNorm());
  // The scale is fused into the Adam pass.
  const float coef = opt.clipCoefficient(m.cfg.clip_norm);
  for (Unit& u : m.units) {
    if (u.frozen) continue;
    if (opt.offloaded()) {
      if (u.grads.state == GradState::kReduced)  // not launched early
        HSDP_RETURN_IF_ERROR(m.launchStep(u, m.step, coef));
      continue;  // Stepping until the wait below
    }
    HSDP_RETURN_IF_ERROR(opt.stepNow(m.cfg.adam, m.step, m.shardStep(u), coef));
    HSDP_RETURN_IF_ERROR(
        transition(u.name, u.grads.state, GradState::kEmpty, "step", {GradState::kReduced}));
  }
  if (opt.offloaded()) {
    // What backward did not hide of the offloaded steps is waited for here.
    watchdog::WaitScope wait("step: offloaded optimizer");
    HSDP_RETURN_IF_ERROR(opt.waitAll());
    for (Unit& u : m.units) {
      if (u.frozen) continue;
      if (u.grads.state == GradState::kStepping) {  // landed: waitAll above
        u.grads.ticket = 0;
        HSDP_RETURN_IF_ERROR(
            transition(u.name, u.grads.state, GradState::kStepped, "step", {GradState::kStepping}));
      }
      HSDP_RETURN_IF_ERROR(opt.hostCopies().awaitUpload(*u.offload));
      HSDP_RETURN_IF_ERROR(
          transition(u.name, u.grads.state, GradState::kEmpty, "step", {GradState::kStepped}));
    }
  }
  if (m.replicatedParams()) HSDP_RETURN_IF_ERROR(m.gatherReplicated(/*frozen_too=*/false));
  return okStatus();
}

}  // namespace hsdp
