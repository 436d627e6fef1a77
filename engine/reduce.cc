// The gradient path: grad() and copy-in write a unit's full gradient (zeroed at its first use in
// a step, so micro-steps add up), reduceGrad() starts its reduce-scatter over the shard group,
// and pollReductions() moves the reductions in flight along: a landed scatter frees its block
// and starts the replica all-reduce; a landed all-reduce may launch the unit's offloaded step.
#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"

namespace hsdp {

using engine::Unit;

// The unit's full gradient for this step: zero-filled at its first use (grad(), copyInGrads()).
// `verb` and `param` name the caller in the error ("grad('u.w')", "copyInGrads('u')").
Status ShardedModel::Impl::ensureGrad(Unit& u, const char* verb, std::string_view param) {
  if (u.frozen)
    return failedPrecondition(verb, "('", u.name, param.empty() ? "" : ".", param,
                              "'): the unit is frozen: it has no gradient");
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

StatusOr<WorkHandle> ShardedModel::Impl::reduceScatter(Unit& u, const void* full, void* shard,
                                                       DType t) {
  const size_t count = u.layout.shardNumel();
  if (hierarchical)  // an int8/int4 inter wire with error feedback carries the unit's residual
    return hier_reduce->ireduceScatter(full, shard, count, t, RedOp::kAvg,
                                       u.grad_residual.as<float>());
  return space->ireduceScatter(mesh->shardGroupReduce(), full, shard, count, t, RedOp::kAvg);
}

// The average of the unit's gradient shard over the data-parallel replicas: the transport's
// exact all-reduce, or the encoded one (replica_wire; with the unit's residual for error
// feedback).
StatusOr<WorkHandle> ShardedModel::Impl::replicaAllReduce(Unit& u) {
  const size_t n = u.layout.shardNumel();
  if (replica_coll)
    return replica_coll->iallReduce(u.grad_shard.data(), n, DType::kFloat32, RedOp::kAvg,
                                    u.replica_residual.as<float>());
  return space->iallReduce(dataParallel(), u.grad_shard.data(), n, DType::kFloat32, RedOp::kAvg);
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
      if (dataParallel().size() > 1) {
        watchdog::Label label(u.name, "replica group");
        HSDP_ASSIGN_OR_RETURN(p.replicate, replicaAllReduce(u));
      }
    }
  }
  while (!pending.empty() && pending.front().scatter_done) {
    engine::PendingReduce& p = pending.front();
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

StatusOr<ParamView> ShardedModel::grad(int unit, std::string_view name) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "grad"));
  Unit& u = m.units[unit];
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  HSDP_RETURN_IF_ERROR(m.ensureGrad(u, "grad", name));
  const ParamSpec& p = u.layout.params()[i];
  return ParamView{u.full_grad + u.layout.offset(i), p.shape, p.numel()};
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
  if (u.frozen) return failedPrecondition("reduceGrad: unit '", u.name, "' is frozen");
  if (u.full_grad == nullptr)
    return failedPrecondition("reduceGrad: unit '", u.name, "' has no gradient; write grad() first");
  engine::PendingReduce p;
  p.unit = unit;
  if (m.shards > 1) {
    // Average over the shard group into our shard; the replica average follows once it lands.
    // On a device the scatter waits for the compute stream: the backward kernels that wrote
    // the gradient (and the bf16 rounding below) come first.
    watchdog::Label label(u.name, "shard group");
    StatusOr<WorkHandle> w = [&]() -> StatusOr<WorkHandle> {
      if (!m.bf16Reduce())
        return m.reduceScatter(u, u.full_grad, u.grad_shard.data(), DType::kFloat32);
      // Round the whole gradient to bf16 and reduce 2-byte data.
      HSDP_ASSIGN_OR_RETURN(u.full_grad16, m.pool16.acquire(/*zero=*/false));
      bf16* g16 = static_cast<bf16*>(u.full_grad16);
      HSDP_RETURN_IF_ERROR(
          m.space->castToBf16(u.full_grad, g16, u.layout.paddedNumel(), Lane::kCompute));
      return m.reduceScatter(u, g16, u.grad16.data(), DType::kBFloat16);
    }();
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

}  // namespace hsdp
