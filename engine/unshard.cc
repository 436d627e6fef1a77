// The gather path: unshard / waitForUnshard / reshard (FSDP2's verbs), param() and copy-out, and
// how a unit's parameters get gathered (pool blocks, bf16 on the wire, the int8/int4 wire's
// encoded master, hpZ's intra-node re-gather, the rate limiter's deferred gathers).
#include <algorithm>

#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"

namespace hsdp {

using engine::Unit;

Status ShardedModel::Impl::issueGather(Unit& u) {
  HSDP_ASSIGN_OR_RETURN(void* block, pool.acquire(/*zero=*/false));
  u.gathered = static_cast<float*>(block);
  // The unit's name goes into the fingerprints of the collectives below.
  watchdog::Label label(u.name, u.hpz_valid ? "hpZ node group" : "shard group");
  StatusOr<WorkHandle> w = [&]() -> StatusOr<WorkHandle> {
    if (u.hpz_valid)  // hpZ: the secondary partition is re-gathered inside the node only
      return space->iallGather(mesh->intraShard(), u.hpz_block.data(), u.gathered,
                               mesh->shape().inter_shard * u.layout.shardNumel(),
                               DType::kFloat32);
    if (encodedParams()) {  // int8/int4 across nodes: the step's encoded master, decoded here
      if (!u.encoded_valid) HSDP_RETURN_IF_ERROR(refreshEncoded(u));
      return hier->iallGatherEncoded(u.encoded_shard.data(), u.gathered, u.layout.shardNumel());
    }
    if (bf16Params()) {  // 2 bytes on the wire; upcast in waitForUnshard
      HSDP_ASSIGN_OR_RETURN(u.gathered16, pool16.acquire(/*zero=*/false));
      return gatherAny(u.shard16.data(), u.gathered16, u.layout.shardNumel(), DType::kBFloat16);
    }
    return gatherAny(u.param_shard.as<float>(), u.gathered, u.layout.shardNumel(),
                     DType::kFloat32);
  }();
  if (!w.ok()) return w.status().withContext(strCat("all-gather of unit '", u.name, "'"));
  u.gather = std::move(*w);
  ++gathered_alive;
  return okStatus();
}

// Issues deferred gathers, oldest first, while the limit allows.
Status ShardedModel::Impl::issueDeferred() {
  while (!deferred.empty() && gathered_alive < cfg.max_gathered_units) {
    Unit& u = units[deferred.front()];
    deferred.pop_front();
    u.deferred = false;
    HSDP_RETURN_IF_ERROR(issueGather(u));
  }
  return okStatus();
}

StatusOr<WorkHandle> ShardedModel::Impl::gatherAny(const void* shard, void* full, size_t count, DType t) {
  if (hierarchical) return hier->iallGather(shard, full, count, t);
  return space->iallGather(mesh->shardGroup(), shard, full, count, t);
}
// All-gathers over the shard group that move together, as one Work. The hierarchical
// schedules keep them all in flight (pipelined in start order); otherwise one group.
StatusOr<WorkHandle> ShardedModel::Impl::gatherGroup(std::span<const CollectiveOp> ops,
                                                     std::span<const int> op_units) {
  if (!hierarchical) {
    watchdog::Label label("parameters after step", "shard group");
    return space->igroup(mesh->shardGroup(), ops);
  }
  std::vector<WorkHandle> works;
  works.reserve(ops.size());
  for (size_t k = 0; k < ops.size(); ++k) {
    const CollectiveOp& o = ops[k];
    watchdog::Label label(units[op_units[k]].name, "shard group");
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, hier->iallGather(o.send, o.recv, o.count, o.dtype));
    works.push_back(std::move(w));
  }
  return allOf(std::move(works));
}

// copyOutParams / copyInGrads, in two steps so that copy-in can check everything before it
// takes (and zeroes) the gradient buffer. checkTensors: every tensor against unit u's layout
// and the memory space, into copy_plan; copy-out writes all of them at once, so they must not
// overlap one another (copy-in only reads them, into disjoint parameter slices; a tensor
// shared by tied parameters is fine).
Status ShardedModel::Impl::checkTensors(Unit& u, std::span<const TensorRef> tensors, const char* verb,
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
            [](const engine::PlannedCopy& a, const engine::PlannedCopy& b) { return a.user < b.user; });
  for (size_t r = 1; r < copy_plan.size() && !into_flat; ++r)
    if (copy_plan[r].user < copy_plan[r - 1].user + copy_plan[r - 1].n)
      return invalidArgument(verb, "('", u.name, "'): tensors ",
                             std::min(copy_plan[r - 1].k, copy_plan[r].k), " and ",
                             std::max(copy_plan[r - 1].k, copy_plan[r].k), " overlap");
  return okStatus();
}

// The copies checkTensors planned, between the tensors and the flat buffer `flat` (which no
// tensor may lie inside), in one batch; into the flat buffer it adds.
Status ShardedModel::Impl::runCopies(Unit& u, std::span<const TensorRef> tensors, const char* verb, float* flat,
                 bool into_flat) {
  const float* flat_end = flat + u.layout.paddedNumel();
  copy_pieces.clear();
  for (const engine::PlannedCopy& c : copy_plan) {
    if (c.user < flat_end && flat < c.user + c.n)
      return invalidArgument(verb, "('", u.name, "'): tensor ", c.k, " '", tensors[c.k].name,
                             "' lies inside the unit's own flat buffer (a view from param() "
                             "or grad()): use the view, or a tensor of your own");
    float* f = flat + c.offset;
    copy_pieces.push_back(into_flat ? CopyPiece{c.user, f, c.n} : CopyPiece{f, c.user, c.n});
  }
  return space->batchedCopy(copy_pieces, /*accumulate=*/into_flat, Lane::kCompute);
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
    watchdog::WaitScope wait("waitForUnshard", u.name);
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
    watchdog::WaitScope wait("reshard", u.name);
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

}  // namespace hsdp
