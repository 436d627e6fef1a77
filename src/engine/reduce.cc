// The gradient path: grad() and copy-in write a unit's full gradient (zeroed at its first use in
// a step, so micro-steps add up), reduceGrad() starts its reduce-scatter over the shard group,
// and pollReductions() moves the reductions in flight along: a landed scatter frees its block
// and starts the replica all-reduce; a landed all-reduce may launch the unit's offloaded step.
#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"

namespace hsdp {

using engine::GradLifecycle;
using engine::GradState;
using engine::Unit;

// The unit's full gradient for this step: zero-filled at its first use (grad(), copyInGrads()).
// `verb` and `param` name the caller in the error ("grad('u.w')", "copyInGrads('u')").
Status ShardedModel::Impl::ensureGrad(Unit& u, const char* verb, std::string_view param) {
  const std::string who = strCat(verb, "('", u.name, param.empty() ? "" : ".", param, "')");
  if (u.frozen) return failedPrecondition(who, ": the unit is frozen: it has no gradient");
  GradLifecycle& g = u.grads;
  HSDP_RETURN_IF_ERROR(require(u.name, g.state, who,
                               {GradState::kEmpty, GradState::kAccumulating, GradState::kReduced},
                               "its gradient is being reduced or stepped; step() first"));
  if (g.state == GradState::kAccumulating) return okStatus();
  // Reduced -> Accumulating: a gradient written again before step() is reduced again.
  const std::initializer_list<GradState> from = {GradState::kEmpty, GradState::kReduced};
  // On a device the zero-fill is enqueued on the compute stream, after the step that read
  // the previous gradient (step() orders the compute stream after the reductions).
  if (shards == 1) {
    g.full = u.grad_shard.as<float>();
    HSDP_RETURN_IF_ERROR(space->zero(g.full, u.grad_shard.size(), Lane::kCompute));
  } else if (!pooledGrads()) {  // zero1: the whole gradient lives on
    g.full = u.full_grad_buf.as<float>();
    HSDP_RETURN_IF_ERROR(space->zero(g.full, u.full_grad_buf.size(), Lane::kCompute));
  } else {
    HSDP_ASSIGN_OR_RETURN(void* block, blocks.pool.acquire(/*zero=*/true));
    g.full = static_cast<float*>(block);
  }
  return transition(u.name, g.state, GradState::kAccumulating, who, from);
}

// Moves pending gradient reductions along without blocking (or, with `block`, to the end):
// a finished reduce-scatter frees its full-gradient block and starts the replica all-reduce.
Status ShardedModel::Impl::pollReductions(bool block) {
  std::optional<watchdog::WaitScope> wait;
  if (block) wait.emplace("step: gradient reductions");
  for (engine::PendingReduce& p : pending) {
    Unit& u = units[p.unit];
    if (!p.scatter_done) {
      if (p.scatter) {
        // On a device this orders the reduce lane after the scatter and is true at once.
        HSDP_ASSIGN_OR_RETURN(bool done, coll->reached(p.scatter, Lane::kReduce, block));
        if (!done) break;  // later ones start their all-reduce after this one: keep order
        if (pooledGrads()) HSDP_RETURN_IF_ERROR(blocks.pool.release(u.grads.full, Lane::kReduce));
        if (u.grads.block16 != nullptr) {  // bf16 reduce: upcast the shard, free the wire copy
          HSDP_RETURN_IF_ERROR(space->castToFloat(u.grad16.as<bf16>(), u.grad_shard.as<float>(),
                                                  u.layout.shardNumel(), Lane::kReduce));
          HSDP_RETURN_IF_ERROR(blocks.pool16.release(u.grads.block16, Lane::kReduce));
          u.grads.block16 = nullptr;
        }
      }
      u.grads.full = nullptr;
      p.scatter_done = true;
      // Elastic mode: the average over the replica groups, on the group's replica worker.
      HSDP_RETURN_IF_ERROR(
          coll->startGroupAverage(u.grad_shard.as<float>(), u.layout.shardNumel()));
      if (coll->hasReplicas()) {
        watchdog::Label label(u.name, "replica group");
        HSDP_ASSIGN_OR_RETURN(p.replicate,
                              coll->replicaReduce(u.grad_shard.data(), u.layout.shardNumel(),
                                                  u.replica_residual.as<float>()));
      }
    }
  }
  while (!pending.empty() && pending.front().scatter_done) {
    engine::PendingReduce& p = pending.front();
    if (p.replicate) {
      HSDP_ASSIGN_OR_RETURN(bool done, coll->reached(p.replicate, Lane::kReduce, block));
      if (!done) break;
    }
    Unit& u = units[p.unit];
    HSDP_RETURN_IF_ERROR(transition(u.name, u.grads.state, GradState::kReduced,
                                    "gradient reduction", {GradState::kReducing}));
    // Offload without clipping: step this unit now, while backward goes on. (Clipping needs
    // the global norm of every gradient first, so then step() launches them all.)
    // (Elastic mode: not before the quorum commits the step.)
    if (opt->offloaded() && cfg.clip_norm <= 0 && !elastic)
      HSDP_RETURN_IF_ERROR(launchStep(u, step + 1, 1.0f));
    pending.pop_front();
  }
  return okStatus();
}

StatusOr<ParamView> ShardedModel::grad(int unit, std::string_view name) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "grad"));
  Unit& u = m.units[unit];
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  HSDP_RETURN_IF_ERROR(m.ensureGrad(u, "grad", name));
  const ParamSpec& p = u.layout.params()[i];
  return ParamView{u.grads.full + u.layout.offset(i), p.shape, p.numel()};
}

Status ShardedModel::copyInGrads(int unit, std::span<const TensorRef> tensors) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "copyInGrads"));
  Unit& u = m.units[unit];
  // Checked before the gradient buffer is taken (and zeroed), so a bad call changes nothing.
  HSDP_RETURN_IF_ERROR(m.checkTensors(u, tensors, "copyInGrads", /*into_flat=*/true));
  HSDP_RETURN_IF_ERROR(m.ensureGrad(u, "copyInGrads", {}));
  return m.runCopies(u, tensors, "copyInGrads", u.grads.full, /*into_flat=*/true);
}

Status ShardedModel::reduceGrad(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "reduceGrad"));
  Unit& u = m.units[unit];
  if (u.frozen) return failedPrecondition("reduceGrad: unit '", u.name, "' is frozen");
  const std::initializer_list<GradState> from = {GradState::kAccumulating};
  HSDP_RETURN_IF_ERROR(require(u.name, u.grads.state, "reduceGrad", from,
                               "it has no gradient written since its last reduceGrad; write "
                               "grad() or copyInGrads() first"));
  engine::PendingReduce p;
  p.unit = unit;
  if (m.shards > 1) {
    // Average over the shard group into our shard; the replica average follows once it lands.
    // On a device the scatter waits for the compute stream: the backward kernels that wrote
    // the gradient (and the bf16 rounding below) come first.
    watchdog::Label label(u.name, "shard group");
    StatusOr<WorkHandle> w = [&]() -> StatusOr<WorkHandle> {
      if (!m.bf16Reduce())
        return m.coll->reduceScatter(u.grads.full, u.grad_shard.data(), u.layout.shardNumel(),
                                     DType::kFloat32, u.grad_residual.as<float>());
      // Round the whole gradient to bf16 and reduce 2-byte data.
      HSDP_ASSIGN_OR_RETURN(u.grads.block16, m.blocks.pool16.acquire(/*zero=*/false));
      bf16* g16 = static_cast<bf16*>(u.grads.block16);
      HSDP_RETURN_IF_ERROR(
          m.space->castToBf16(u.grads.full, g16, u.layout.paddedNumel(), Lane::kCompute));
      return m.coll->reduceScatter(g16, u.grad16.data(), u.layout.shardNumel(), DType::kBFloat16,
                                   u.grad_residual.as<float>());
    }();
    if (!w.ok()) return w.status().withContext(strCat("reduce-scatter of unit '", u.name, "'"));
    p.scatter = std::move(*w);
  }
  // Mode none all-reduces the gradient where backward wrote it: the reduce lane (the replica
  // all-reduce's caller) must come after the compute stream's work so far. Zero1-3 need it
  // too: the bf16 upcast on the reduce lane overwrites the shard the last step read.
  HSDP_RETURN_IF_ERROR(m.space->order(Lane::kReduce, Lane::kCompute));
  HSDP_RETURN_IF_ERROR(transition(u.name, u.grads.state, GradState::kReducing, "reduceGrad", from));
  m.pending.push_back(std::move(p));
  return m.pollReductions(/*block=*/false);
}

}  // namespace hsdp
