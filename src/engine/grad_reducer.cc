// The gradient path (grad_reducer.h): a unit's full gradient, its reduce-scatter over the shard
// group, and the reductions in flight.
#include "engine/grad_reducer.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "hsdp/log.h"
#include "hsdp/watchdog.h"

namespace hsdp::engine {

GradReducer::GradReducer(const std::vector<Unit>& units, MemorySpace& space, UnitCollectives& coll,
                         BufferPool& pool, BufferPool& pool16, const Options& options,
                         OnReduced on_reduced)
    : units_(units),
      space_(space),
      coll_(coll),
      pool_(pool),
      pool16_(pool16),
      opt_(options),
      on_reduced_(std::move(on_reduced)) {}

Status GradReducer::ensure(int unit, const char* verb, std::string_view param) {
  const Unit& u = units_[unit];
  UnitGrad& ug = grads_[unit];
  const std::string who = strCat(verb, "('", u.name, param.empty() ? "" : ".", param, "')");
  if (u.frozen) return failedPrecondition(who, ": the unit is frozen: it has no gradient");
  GradLifecycle& g = ug.life;
  HSDP_RETURN_IF_ERROR(require(u.name, g.state, who,
                               {GradState::kEmpty, GradState::kAccumulating, GradState::kReduced},
                               "its gradient is being reduced or stepped; step() first"));
  if (g.state == GradState::kAccumulating) return okStatus();
  // Reduced -> Accumulating: a gradient written again before step() is reduced again.
  const std::initializer_list<GradState> from = {GradState::kEmpty, GradState::kReduced};
  // On a device the zero-fill is enqueued on the compute stream, after the step that read
  // the previous gradient (step() orders the compute stream after the reductions).
  if (opt_.shards == 1) {
    g.full = ug.shard.as<float>();
    HSDP_RETURN_IF_ERROR(space_.zero(g.full, ug.shard.size(), Lane::kCompute));
  } else if (!opt_.pooled) {  // zero1: the whole gradient lives on
    g.full = ug.whole.as<float>();
    HSDP_RETURN_IF_ERROR(space_.zero(g.full, ug.whole.size(), Lane::kCompute));
  } else {
    HSDP_ASSIGN_OR_RETURN(void* block, pool_.acquire(/*zero=*/true));
    g.full = static_cast<float*>(block);
  }
  return transition(u.name, g.state, GradState::kAccumulating, who, from);
}

Status GradReducer::poll(bool block) {
  std::optional<watchdog::WaitScope> wait;
  if (block) wait.emplace("step: gradient reductions");
  Tracer& tr = coll_.tracer();
  // The chains move in the progress loop; one pass here, so that a poll moves them too.
  if (!pending_.empty() && pending_.back().chain) (void)ProgressiveWork::progressAll();
  for (Pending& p : pending_) {
    const Unit& u = units_[p.unit];
    UnitGrad& ug = grads_[p.unit];
    if (p.chain) {
      HSDP_RETURN_IF_ERROR(pollChain(p, block));
      if (!p.scatter_done) break;
      continue;
    }
    if (!p.scatter_done) {
      if (p.scatter) {
        // On a device this orders the reduce lane after the scatter and is true at once.
        const int64_t t0 = block ? Tracer::nowUs() : 0;
        HSDP_ASSIGN_OR_RETURN(bool done, coll_.reached(p.scatter, Lane::kReduce, block));
        if (block) tr.wait(TraceKind::kWaitReduce, p.unit, t0);
        if (!done) break;  // later ones start their all-reduce after this one: keep order
        tr.collective(TraceKind::kReduceScatter, coll_.shardLevel(), p.unit,
                      u.layout.paddedNumel() * (ug.life.block16 != nullptr ? 2 : 4),
                      p.scatter_issued);
        if (opt_.pooled) HSDP_RETURN_IF_ERROR(pool_.release(ug.life.full, Lane::kReduce));
        if (ug.life.block16 != nullptr) {  // bf16 reduce: upcast the shard, free the wire copy
          HSDP_RETURN_IF_ERROR(space_.castToFloat(ug.shard16.as<bf16>(), ug.shard.as<float>(),
                                                  u.layout.shardNumel(), Lane::kReduce));
          HSDP_RETURN_IF_ERROR(pool16_.release(ug.life.block16, Lane::kReduce));
          ug.life.block16 = nullptr;
        }
      }
      ug.life.full = nullptr;
      p.scatter_done = true;
      // Elastic mode: the average over the replica groups, on the group's replica worker.
      HSDP_RETURN_IF_ERROR(coll_.startGroupAverage(ug.shard.as<float>(), u.layout.shardNumel()));
      if (opt_.replica_average && coll_.hasReplicas()) {
        watchdog::Label label(u.name, "replica group");
        HSDP_ASSIGN_OR_RETURN(p.replicate,
                              coll_.replicaReduce(ug.shard.data(), u.layout.shardNumel(),
                                                  ug.replica_residual.as<float>()));
        p.replicate_issued = Tracer::nowUs();
      }
    }
  }
  while (!pending_.empty() && pending_.front().scatter_done) {
    Pending& p = pending_.front();
    if (p.replicate || p.chain) {  // a chain's view is gone once pollChain waited for it
      const int64_t t0 = block && p.replicate ? Tracer::nowUs() : 0;
      HSDP_ASSIGN_OR_RETURN(bool done, coll_.reached(p.replicate, Lane::kReduce, block));
      if (t0 != 0) tr.wait(TraceKind::kWaitReplica, p.unit, t0);
      if (!done) break;
      tr.collective(TraceKind::kReplica, TraceLevel::kReplica, p.unit,
                    units_[p.unit].layout.shardNumel() * sizeof(float), p.replicate_issued);
    }
    const int unit = p.unit;
    HSDP_RETURN_IF_ERROR(transition(units_[unit].name, grads_[unit].life.state, GradState::kReduced,
                                    "gradient reduction", {GradState::kReducing}));
    HSDP_RETURN_IF_ERROR(on_reduced_(unit));
    pending_.pop_front();
  }
  return okStatus();
}

Status GradReducer::pollChain(Pending& p, bool block) {
  if (p.scatter_done) return okStatus();
  const Unit& u = units_[p.unit];
  UnitGrad& ug = grads_[p.unit];
  Tracer& tr = coll_.tracer();
  if (block) {  // the whole chain: its wait is the scatter's up to its landing, then the replica's
    const int64_t t0 = Tracer::nowUs();
    HSDP_RETURN_IF_ERROR(coll_.reached(p.replicate, Lane::kReduce, true).status());
    const int64_t landed = std::max(t0, p.chain->landedUs());
    if (landed > t0) tr.wait(TraceKind::kWaitReduce, p.unit, t0, landed);
    tr.wait(TraceKind::kWaitReplica, p.unit, landed);
  } else if (!p.chain->scatterLanded()) {
    return okStatus();
  }
  tr.collective(TraceKind::kReduceScatter, coll_.shardLevel(), p.unit,
                u.layout.paddedNumel() * sizeof(float), p.scatter_issued, p.chain->landedUs());
  p.replicate_issued = p.chain->replicaIssuedUs();
  if (opt_.pooled) HSDP_RETURN_IF_ERROR(pool_.release(ug.life.full, Lane::kReduce));
  ug.life.full = nullptr;
  p.scatter_done = true;
  return okStatus();
}

Status GradReducer::reduce(int unit) {
  const Unit& u = units_[unit];
  UnitGrad& ug = grads_[unit];
  if (u.frozen) return failedPrecondition("reduceGrad: unit '", u.name, "' is frozen");
  const std::initializer_list<GradState> from = {GradState::kAccumulating};
  HSDP_RETURN_IF_ERROR(require(u.name, ug.life.state, "reduceGrad", from,
                               "it has no gradient written since its last reduceGrad; write "
                               "grad() or copyInGrads() first"));
  Pending p;
  p.unit = unit;
  if (opt_.shards > 1) {
    // Average over the shard group into our shard; the replica average follows once it lands.
    // On a device the scatter waits for the compute stream: the backward kernels that wrote
    // the gradient (and the bf16 rounding below) come first.
    watchdog::Label label(u.name, "shard group");
    p.scatter_issued = Tracer::nowUs();
    StatusOr<WorkHandle> w = [&]() -> StatusOr<WorkHandle> {
      // The replica all-reduce follows by itself (not under a semi-sync policy: the
      // gradient stops at the shard group, engine/outer_step.h).
      if (!opt_.bf16 && opt_.replica_average && coll_.chainsReplica()) {
        HSDP_ASSIGN_OR_RETURN(
            p.chain, coll_.reduceThenReplicate(ug.life.full, ug.shard.as<float>(),
                                               u.layout.shardNumel(), ug.residual.as<float>(),
                                               ug.replica_residual.as<float>(), u.name));
        return p.chain->view();
      }
      if (!opt_.bf16)
        return coll_.reduceScatter(ug.life.full, ug.shard.data(), u.layout.shardNumel(),
                                   DType::kFloat32, ug.residual.as<float>());
      // Round the whole gradient to bf16 and reduce 2-byte data.
      HSDP_ASSIGN_OR_RETURN(ug.life.block16, pool16_.acquire(/*zero=*/false));
      bf16* g16 = static_cast<bf16*>(ug.life.block16);
      HSDP_RETURN_IF_ERROR(
          space_.castToBf16(ug.life.full, g16, u.layout.paddedNumel(), Lane::kCompute));
      return coll_.reduceScatter(g16, ug.shard16.data(), u.layout.shardNumel(), DType::kBFloat16,
                                 ug.residual.as<float>());
    }();
    if (!w.ok()) return w.status().withContext(strCat("reduce-scatter of unit '", u.name, "'"));
    (p.chain ? p.replicate : p.scatter) = std::move(*w);
  }
  // Mode none all-reduces the gradient where backward wrote it: the reduce lane (the replica
  // all-reduce's caller) must come after the compute stream's work so far. Zero1-3 need it
  // too: the bf16 upcast on the reduce lane overwrites the shard the last step read.
  HSDP_RETURN_IF_ERROR(space_.order(Lane::kReduce, Lane::kCompute));
  HSDP_RETURN_IF_ERROR(transition(u.name, ug.life.state, GradState::kReducing, "reduceGrad", from));
  pending_.push_back(std::move(p));
  return poll(/*block=*/false);
}

}  // namespace hsdp::engine
