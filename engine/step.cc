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

using engine::DecaySpan;
using engine::Unit;

namespace {
// The Adam settings of a span: no decay where its parameters take none.
AdamConfig spanConfig(const AdamConfig& adam, const DecaySpan& s) {
  AdamConfig c = adam;
  if (!s.decay) c.weight_decay = 0.0f;
  return c;
}
}  // namespace

Status ShardedModel::Impl::refresh16(Unit& u) {
  if (!bf16Params()) return okStatus();
  return space->castToBf16(master(u), u.shard16.as<bf16>(), u.layout.shardNumel(), Lane::kCompute);
}

// The int8/int4 parameter wire: encode the master shard once, for every gather until the next
// step. (Host only: the quantized wires run in the host schedules.)
Status ShardedModel::Impl::refreshEncoded(Unit& u) {
  if (!encodedParams()) return okStatus();
  wireEncode(paramWire(), master(u), u.layout.shardNumel(), u.encoded_shard.data());
  u.encoded_valid = true;
  return okStatus();
}

Status ShardedModel::Impl::readNorm() const {
  if (!norm_pending) return okStatus();
  HSDP_ASSIGN_OR_RETURN(double sumsq, space->normResult());
  last_grad_norm = static_cast<float>(std::sqrt(sumsq));
  norm_pending = false;
  return okStatus();
}

// Offload: queue unit u's step t (gradient scaled by `scale`) on the worker thread. The gradient
// shard goes to host memory (on a device: a D2H copy started here), the CPU Adam steps the host
// master span by span, and the master comes back (on a device: an H2D copy).
Status ShardedModel::Impl::launchStep(Unit& u, int64_t t, float scale) {
  HSDP_RETURN_IF_ERROR(waitForSnapshot());  // the step writes what a save in flight may read
  float* space_master = master(u);
  const size_t n = u.layout.shardNumel();
  const AdamConfig adam = cfg.adam;  // by value: the rate of this step, whatever comes later
  CpuAdam* opt = cpu_adam.get();
  MemorySpace* sp = space.get();
  u.launched_step = t;
  // The bf16 copy: straight into shard16 on the host; on a device into host16, then uploaded.
  bf16* out16 = !bf16Params() ? nullptr : onDevice() ? u.host16.as<bf16>() : u.shard16.as<bf16>();
  bf16* up16 = bf16Params() && onDevice() ? u.shard16.as<bf16>() : nullptr;
  // The int8/int4 parameter wire: the worker encodes the new master too, off the training thread.
  const bool encode = encodedParams();
  const WireFormat wire = paramWire();
  HSDP_RETURN_IF_ERROR(
      sp->startDownload(*u.offload, u.host_grad.data(), u.grad_shard.data(), n * sizeof(float)));
  u.encoded_valid = false;
  u.step_ticket = queue->submit(
      [&u, space_master, n, adam, opt, sp, t, scale, out16, up16, encode, wire]() -> Status {
        HSDP_RETURN_IF_ERROR(sp->finishDownload(*u.offload, u.host_grad.data(), u.grad_shard.data(),
                                                n * sizeof(float)));
        for (const DecaySpan& s : u.decay_spans) {
          HSDP_RETURN_IF_ERROR(
              opt->step(spanConfig(adam, s), t,
                        {u.host_master.as<float>() + s.begin, u.host_grad.as<float>() + s.begin,
                         u.exp_avg.as<float>() + s.begin, u.exp_avg_sq.as<float>() + s.begin, s.n,
                         out16 ? out16 + s.begin : nullptr},
                        scale));
        }
        HSDP_RETURN_IF_ERROR(
            sp->upload(*u.offload, space_master, u.host_master.data(), n * sizeof(float)));
        if (up16 != nullptr)
          HSDP_RETURN_IF_ERROR(sp->upload(*u.offload, up16, out16, n * sizeof(bf16)));
        if (encode) wireEncode(wire, u.host_master.as<float>(), n, u.encoded_shard.data());
        return okStatus();
      });
  return okStatus();
}

// The unit's parameters are about to be read: its offloaded step must have landed (on a device:
// the compute stream waits for the upload).
Status ShardedModel::Impl::waitForStep(Unit& u) {
  if (u.step_ticket == 0) return okStatus();
  watchdog::WaitScope wait("offloaded optimizer step", u.name);
  HSDP_RETURN_IF_ERROR(queue->waitFor(u.step_ticket));
  u.step_ticket = 0;
  u.encoded_valid = encodedParams();  // the job encoded the new master
  return space->awaitUpload(*u.offload);
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

Status ShardedModel::setLearningRate(float lr) {
  Impl& m = *impl_;
  if (!std::isfinite(lr) || lr <= 0)
    return invalidArgument("setLearningRate: lr=", lr, " must be finite and > 0");
  for (const Unit& u : m.units)
    if (u.launched_step > m.step)
      return failedPrecondition("setLearningRate: unit '", u.name, "' already started step ",
                                u.launched_step, " with lr ", m.cfg.adam.lr,
                                " (CPU offload steps units during backward); set the rate "
                                "before the step's first reduceGrad");
  m.cfg.adam.lr = lr;
  return okStatus();
}

float ShardedModel::learningRate() const { return impl_->cfg.adam.lr; }

// zero1/zero2: every rank stepped its slice of the whole parameters; gather them back, in
// place, all units together: several buffers that move at once, so one group (on a device one
// fused NCCL launch instead of a launch per unit). Frozen units did not change in a step.
Status ShardedModel::Impl::gatherReplicated(bool frozen_too) {
  group_ops.clear();
  blocks16.clear();
  group_units.clear();
  for (size_t k = 0; k < units.size(); ++k) {
    Unit& u = units[k];
    if (u.frozen && !frozen_too) continue;
    const size_t n = u.layout.shardNumel();
    group_units.push_back(static_cast<int>(k));
    if (bf16Params()) {  // bf16 on the wire, upcast into the fp32 compute copy below
      HSDP_ASSIGN_OR_RETURN(void* b16, pool16.acquire(/*zero=*/false));
      blocks16.push_back(b16);
      group_ops.push_back(CollectiveOp::allGather(u.shard16.data(), b16, n, DType::kBFloat16));
    } else {
      group_ops.push_back(
          CollectiveOp::allGather(master(u), u.full_params.data(), n, DType::kFloat32));
    }
  }
  HSDP_ASSIGN_OR_RETURN(WorkHandle gathers, gatherGroup(group_ops, group_units));
  // On a device the compute stream waits for them: step() returns without the host waiting.
  watchdog::WaitScope wait("step: parameter all-gathers");
  HSDP_RETURN_IF_ERROR(blockOn(gathers).withContext("parameter all-gathers after the step"));
  for (size_t k = 0; k < blocks16.size(); ++k) {
    Unit& u = units[group_units[k]];
    // The compute copy holds the bf16 rounding, as every other rank's; our own slice of the
    // fp32 master is the host/shard master, untouched by this.
    HSDP_RETURN_IF_ERROR(space->castToFloat(static_cast<const bf16*>(blocks16[k]),
                                            u.full_params.as<float>(), u.layout.paddedNumel(),
                                            Lane::kCompute));
    HSDP_RETURN_IF_ERROR(pool16.release(blocks16[k]));
  }
  return okStatus();
}

Status ShardedModel::step() {
  Impl& m = *impl_;
  if (!m.finalized) return failedPrecondition("step: call finalize() first");
  HSDP_RETURN_IF_ERROR(m.waitForSnapshot());  // the step writes what a save may still read
  HSDP_RETURN_IF_ERROR(m.pollReductions(/*block=*/true));
  for (const Unit& u : m.units)
    if (!u.frozen && !u.grad_reduced)
      return failedPrecondition("step: unit '", u.name,
                                "' has no reduced gradient; call "
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
    if (!u.frozen)
      HSDP_RETURN_IF_ERROR(
          m.space->normAccumulate(u.grad_shard.as<float>(), u.layout.shardNumel()));
  {
    watchdog::Label label("gradient norm", "shard group");
    HSDP_RETURN_IF_ERROR(m.space->normReduce(m.shards > 1 ? &m.mesh->shardGroup() : nullptr));
  }
  m.norm_pending = true;
  // The host needs the norm now only to clip; otherwise a device reads it back when asked.
  if (m.cfg.clip_norm > 0 || !m.onDevice()) HSDP_RETURN_IF_ERROR(m.readNorm());
  // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is < 1;
  // the scale is fused into the Adam pass.
  float coef = 1.0f;
  if (m.cfg.clip_norm > 0) coef = std::min(1.0f, m.cfg.clip_norm / (m.last_grad_norm + 1e-6f));
  for (Unit& u : m.units) {
    if (u.frozen) continue;
    if (m.queue) {
      if (u.launched_step != m.step)  // not launched early
        HSDP_RETURN_IF_ERROR(m.launchStep(u, m.step, coef));
    } else {
      float* p = m.master(u);
      bf16* p16 = m.bf16Params() ? u.shard16.as<bf16>() : nullptr;
      for (const DecaySpan& s : u.decay_spans)
        HSDP_RETURN_IF_ERROR(m.space->adamStep(
            spanConfig(m.cfg.adam, s), m.step,
            {p + s.begin, u.grad_shard.as<float>() + s.begin, u.exp_avg.as<float>() + s.begin,
             u.exp_avg_sq.as<float>() + s.begin, s.n, p16 ? p16 + s.begin : nullptr},
            coef));
      HSDP_RETURN_IF_ERROR(m.refreshEncoded(u));  // once per step, while the shard is warm
    }
    u.grad_reduced = false;
  }
  if (m.queue) {
    // What backward did not hide of the offloaded steps is waited for here.
    watchdog::WaitScope wait("step: offloaded optimizer");
    HSDP_RETURN_IF_ERROR(m.queue->waitAll());
    for (Unit& u : m.units) {
      if (u.frozen) continue;
      u.step_ticket = 0;
      u.encoded_valid = m.encodedParams();
      HSDP_RETURN_IF_ERROR(m.space->awaitUpload(*u.offload));
    }
  }
  if (m.replicatedParams()) HSDP_RETURN_IF_ERROR(m.gatherReplicated(/*frozen_too=*/false));
  return okStatus();
}

}  // namespace hsdp
