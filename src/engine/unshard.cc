// The gather path: unshard / waitForUnshard / reshard (FSDP2's verbs), param() and copy-out, and
// how a unit's parameters get gathered (pool blocks, bf16 on the wire, the int8/int4 wire's
// encoded master, hpZ's intra-node re-gather, the rate limiter's deferred gathers).
#include <algorithm>

#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"

namespace hsdp {

using engine::ParamLifecycle;
using engine::ParamState;
using engine::Unit;

namespace {
constexpr std::string_view kGatheredHint = "unshard first, then waitForUnshard";
}  // namespace

// Issues unit u's all-gather into a pool block: Sharded, NodeBlockKept or Deferred -> Gathering
// (Gathered at once when the gather left nothing in flight).
Status ShardedModel::Impl::issueGather(Unit& u, std::string_view verb) {
  ParamLifecycle& p = u.params;
  const bool node_block = p.rest == ParamState::kNodeBlockKept;
  HSDP_ASSIGN_OR_RETURN(void* block, blocks.pool.acquire(/*zero=*/false));
  p.full = static_cast<float*>(block);
  // The unit's name goes into the fingerprints of the collectives below.
  watchdog::Label label(u.name, node_block ? "hpZ node group" : "shard group");
  StatusOr<WorkHandle> w = [&]() -> StatusOr<WorkHandle> {
    if (node_block)  // hpZ: the secondary partition is re-gathered inside the node only
      return coll->gatherNodeBlock(u.hpz_block.data(), p.full,
                                   mesh->shape().inter_shard * u.layout.shardNumel());
    if (encodedParams())  // int8/int4 across nodes: the encoded master, decoded here
      return coll->gatherEncoded(u.encoded_shard.data(), p.full, u.layout.shardNumel());
    if (bf16Params()) {  // 2 bytes on the wire; upcast in waitForUnshard
      HSDP_ASSIGN_OR_RETURN(p.block16, blocks.pool16.acquire(/*zero=*/false));
      return coll->gather(u.shard16.data(), p.block16, u.layout.shardNumel(), DType::kBFloat16);
    }
    return coll->gather(u.param_shard.as<float>(), p.full, u.layout.shardNumel(), DType::kFloat32);
  }();
  if (!w.ok()) return w.status().withContext(strCat("all-gather of unit '", u.name, "'"));
  p.work = std::move(*w);
  ++blocks.gathered_alive;
  // A gather that left nothing in flight (no work, no bf16 block to upcast) is readable now.
  const ParamState to =
      p.work || p.block16 != nullptr ? ParamState::kGathering : ParamState::kGathered;
  return transition(u.name, p.state, to, verb,
                    {ParamState::kSharded, ParamState::kNodeBlockKept, ParamState::kDeferred});
}

// Issues deferred gathers, oldest first, while the limit allows.
Status ShardedModel::Impl::issueDeferred() {
  while (!blocks.deferred.empty() && blocks.gathered_alive < cfg.pipeline.max_gathered_units) {
    Unit& u = units[blocks.deferred.front()];
    blocks.deferred.pop_front();
    HSDP_RETURN_IF_ERROR(issueGather(u, "unshard (deferred)"));
  }
  return okStatus();
}

// copyOutParams / copyInGrads, in two steps so that copy-in can check everything before it
// takes (and zeroes) the gradient buffer. checkTensors: every tensor against unit u's layout
// and the memory space, into copies.plan; copy-out writes all of them at once, so they must not
// overlap one another (copy-in only reads them, into disjoint parameter slices; a tensor
// shared by tied parameters is fine).
Status ShardedModel::Impl::checkTensors(Unit& u, std::span<const TensorRef> tensors,
                                        const char* verb, bool into_flat) {
  copies.plan.clear();
  copies.seen.assign(u.layout.params().size(), 0);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorRef& t = tensors[k];
    auto bad = [&](auto&&... what) {
      return invalidArgument(verb, "('", u.name, "'): tensor ", k, " '", t.name, "' ", what...);
    };
    StatusOr<size_t> i = u.layout.indexOf(t.name);
    if (!i.ok()) return i.status().withContext(strCat(verb, "('", u.name, "'): tensor ", k));
    const ParamSpec& p = u.layout.params()[*i];
    if (t.numel != p.numel()) return bad("holds ", t.numel, " elements, the parameter ", p.numel());
    if (copies.seen[*i]++) return bad("is given twice");
    if (t.numel == 0) continue;
    if (t.data == nullptr) return bad("is a null pointer");
    Status where = space->checkPointer(t.data);
    if (!where.ok()) return bad(where.message());
    copies.plan.push_back({t.data, u.layout.offset(*i), t.numel, k});
  }
  std::sort(
      copies.plan.begin(), copies.plan.end(),
      [](const engine::PlannedCopy& a, const engine::PlannedCopy& b) { return a.user < b.user; });
  for (size_t r = 1; r < copies.plan.size() && !into_flat; ++r)
    if (copies.plan[r].user < copies.plan[r - 1].user + copies.plan[r - 1].n)
      return invalidArgument(verb, "('", u.name, "'): tensors ",
                             std::min(copies.plan[r - 1].k, copies.plan[r].k), " and ",
                             std::max(copies.plan[r - 1].k, copies.plan[r].k), " overlap");
  return okStatus();
}

// The copies checkTensors planned, between the tensors and the flat buffer `flat` (which no
// tensor may lie inside), in one batch; into the flat buffer it adds.
Status ShardedModel::Impl::runCopies(Unit& u, std::span<const TensorRef> tensors, const char* verb,
                                     float* flat, bool into_flat) {
  const float* flat_end = flat + u.layout.paddedNumel();
  copies.pieces.clear();
  for (const engine::PlannedCopy& c : copies.plan) {
    if (c.user < flat_end && flat < c.user + c.n)
      return invalidArgument(verb, "('", u.name, "'): tensor ", c.k, " '", tensors[c.k].name,
                             "' lies inside the unit's own flat buffer (a view from param() "
                             "or grad()): use the view, or a tensor of your own");
    float* f = flat + c.offset;
    copies.pieces.push_back(into_flat ? CopyPiece{c.user, f, c.n} : CopyPiece{f, c.user, c.n});
  }
  return space->batchedCopy(copies.pieces, /*accumulate=*/into_flat, Lane::kCompute);
}

Status ShardedModel::unshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "unshard"));
  Unit& u = m.units[unit];
  ParamLifecycle& p = u.params;
  const std::initializer_list<ParamState> kSharded = {ParamState::kSharded,
                                                      ParamState::kNodeBlockKept};
  HSDP_RETURN_IF_ERROR(require(u.name, p.state, "unshard", kSharded, "it is already unsharded"));
  HSDP_RETURN_IF_ERROR(m.pollReductions(/*block=*/false));
  HSDP_RETURN_IF_ERROR(m.waitForStep(u));  // never gather parameters before their step lands
  p.rest = p.state;
  if (m.shards == 1 || m.replicatedParams()) {
    // Mode none: the shard is the whole; zero1/zero2: always whole, nothing to gather.
    p.full = m.shards == 1 ? u.param_shard.as<float>() : u.full_params.as<float>();
    return transition(u.name, p.state, ParamState::kGathered, "unshard", kSharded);
  }
  if (m.cfg.pipeline.max_gathered_units > 0 && m.blocks.gathered_alive >= m.cfg.pipeline.max_gathered_units) {
    // Rate limit: issue this gather when an earlier unit is resharded (or when waited for).
    m.blocks.deferred.push_back(unit);
    return transition(u.name, p.state, ParamState::kDeferred, "unshard", kSharded);
  }
  return m.issueGather(u, "unshard");
}

Status ShardedModel::waitForUnshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "waitForUnshard"));
  Unit& u = m.units[unit];
  ParamLifecycle& p = u.params;
  HSDP_RETURN_IF_ERROR(
      require(u.name, p.state, "waitForUnshard",
              {ParamState::kDeferred, ParamState::kGathering, ParamState::kGathered},
              "it was not unsharded"));
  if (p.state == ParamState::kDeferred) {  // waited for before a slot freed up: issue it now
    HSDP_INFO(kShard, "gather of unit '", u.name, "' issued past the limit of ",
              m.cfg.pipeline.max_gathered_units, " gathered units: it is waited for");
    m.blocks.deferred.erase(std::find(m.blocks.deferred.begin(), m.blocks.deferred.end(), unit));
    HSDP_RETURN_IF_ERROR(m.issueGather(u, "waitForUnshard"));
  }
  if (p.state == ParamState::kGathering) {
    if (p.work) {  // on a device: the compute stream waits for the gather, the host does not
      watchdog::WaitScope wait("waitForUnshard", u.name);
      HSDP_RETURN_IF_ERROR(
          m.blockOn(p.work).withContext(strCat("all-gather of unit '", u.name, "'")));
      p.work.reset();
    }
    if (p.block16 != nullptr) {  // compute runs in fp32 on the bf16-rounded parameters
      HSDP_RETURN_IF_ERROR(m.space->castToFloat(static_cast<const bf16*>(p.block16), p.full,
                                                u.layout.paddedNumel(), Lane::kCompute));
      HSDP_RETURN_IF_ERROR(m.blocks.pool16.release(p.block16));
      p.block16 = nullptr;
    }
    HSDP_RETURN_IF_ERROR(transition(u.name, p.state, ParamState::kGathered, "waitForUnshard",
                                    {ParamState::kGathering}));
  }
  return m.pollReductions(/*block=*/false);
}

Status ShardedModel::reshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "reshard"));
  Unit& u = m.units[unit];
  ParamLifecycle& p = u.params;
  const std::initializer_list<ParamState> kUnsharded = {
      ParamState::kDeferred, ParamState::kGathering, ParamState::kGathered};
  HSDP_RETURN_IF_ERROR(require(u.name, p.state, "reshard", kUnsharded, "it is not unsharded"));
  if (p.state == ParamState::kDeferred) {  // never issued: nothing to free, nothing to keep
    m.blocks.deferred.erase(std::find(m.blocks.deferred.begin(), m.blocks.deferred.end(), unit));
    return transition(u.name, p.state, p.rest, "reshard", kUnsharded);
  }
  if (p.work) {  // resharding a unit whose gather is still in flight: let it land first
    watchdog::WaitScope wait("reshard", u.name);
    HSDP_RETURN_IF_ERROR(m.blockOn(p.work));
    p.work.reset();
  }
  if (p.block16 != nullptr) {
    HSDP_RETURN_IF_ERROR(m.blocks.pool16.release(p.block16));
    p.block16 = nullptr;
  }
  ParamState to = p.rest;
  if (m.cfg.hpz && to == ParamState::kSharded) {
    // Keep our intra-node block (shards intra_idx*J .. intra_idx*J + J-1) until step().
    const size_t n = m.mesh->shape().inter_shard * u.layout.shardNumel();
    HSDP_RETURN_IF_ERROR(m.space->copy(u.hpz_block.data(), p.full + m.mesh->coords().intra_idx * n,
                                       n * sizeof(float), Lane::kCompute));
    to = ParamState::kNodeBlockKept;
  }
  if (m.shards > 1 && !m.replicatedParams()) {
    HSDP_RETURN_IF_ERROR(m.blocks.pool.release(p.full));
    --m.blocks.gathered_alive;
  }
  p.full = nullptr;
  HSDP_RETURN_IF_ERROR(transition(u.name, p.state, to, "reshard", kUnsharded));
  if (m.cfg.pipeline.max_gathered_units > 0) HSDP_RETURN_IF_ERROR(m.issueDeferred());
  return okStatus();
}

StatusOr<ParamView> ShardedModel::param(int unit, std::string_view name) {
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "param"));
  Unit& u = impl_->units[unit];
  HSDP_RETURN_IF_ERROR(require(u.name, u.params.state, strCat("param('", u.name, ".", name, "')"),
                               {ParamState::kGathered}, kGatheredHint));
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  const ParamSpec& p = u.layout.params()[i];
  return ParamView{u.params.full + u.layout.offset(i), p.shape, p.numel()};
}

Status ShardedModel::copyOutParams(int unit, std::span<const TensorRef> tensors) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "copyOutParams"));
  Unit& u = m.units[unit];
  HSDP_RETURN_IF_ERROR(
      require(u.name, u.params.state, "copyOutParams", {ParamState::kGathered}, kGatheredHint));
  HSDP_RETURN_IF_ERROR(m.checkTensors(u, tensors, "copyOutParams", /*into_flat=*/false));
  return m.runCopies(u, tensors, "copyOutParams", u.params.full, /*into_flat=*/false);
}

}  // namespace hsdp
