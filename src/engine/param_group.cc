// The gather path (param_group.h): unshard / waitForUnshard / reshard (FSDP2's verbs), param()
// and copy-out, and how a unit's parameters get gathered (pool blocks, bf16 on the wire, the
// int8/int4 wire's encoded master, hpZ's intra-node re-gather, the rate limiter's deferred
// gathers).
#include "engine/param_group.h"

#include <algorithm>

#include "hsdp/log.h"
#include "hsdp/watchdog.h"

namespace hsdp::engine {

namespace {
constexpr std::string_view kGatheredHint = "unshard first, then waitForUnshard";
constexpr std::initializer_list<ParamState> kSharded = {ParamState::kSharded,
                                                        ParamState::kNodeBlockKept};
constexpr std::initializer_list<ParamState> kUnsharded = {
    ParamState::kDeferred, ParamState::kGathering, ParamState::kGathered};
}  // namespace

ParamGroup::ParamGroup(const std::vector<Unit>& units, MemorySpace& space, UnitCollectives& coll,
                       const Options& options)
    : units_(units), space_(space), coll_(coll), opt_(options) {}

// Issues the unit's all-gather into a pool block: Sharded, NodeBlockKept or Deferred ->
// Gathering (Gathered at once when the gather left nothing in flight).
Status ParamGroup::issueGather(int unit, std::string_view verb) {
  const Unit& u = units_[unit];
  UnitParams& up = params_[unit];
  ParamLifecycle& p = up.life;
  const bool node_block = p.rest == ParamState::kNodeBlockKept;
  HSDP_ASSIGN_OR_RETURN(void* block, pool_.acquire(/*zero=*/false));
  p.full = static_cast<float*>(block);
  p.issued_us = Tracer::nowUs();
  // The gathered unit: every shard-group rank's shard (bf16 on a bf16 wire).
  p.wire_bytes = u.layout.paddedNumel() * (opt_.bf16 && !node_block ? 2 : 4);
  // The unit's name goes into the fingerprints of the collectives below.
  watchdog::Label label(u.name, node_block ? "hpZ node group" : "shard group");
  StatusOr<WorkHandle> w = [&]() -> StatusOr<WorkHandle> {
    if (node_block)  // hpZ: the secondary partition is re-gathered inside the node only
      return coll_.gatherNodeBlock(up.node_block.data(), p.full,
                                   opt_.inter_shard * u.layout.shardNumel());
    if (opt_.encoded)  // int8/int4 across nodes: the encoded master, decoded here
      return coll_.gatherEncoded(up.encoded.data(), p.full, u.layout.shardNumel());
    if (opt_.bf16) {  // 2 bytes on the wire; upcast in waitForUnshard
      HSDP_ASSIGN_OR_RETURN(p.block16, pool16_.acquire(/*zero=*/false));
      return coll_.gather(up.shard16.data(), p.block16, u.layout.shardNumel(), DType::kBFloat16);
    }
    return coll_.gather(up.shard.as<float>(), p.full, u.layout.shardNumel(), DType::kFloat32);
  }();
  if (!w.ok()) return w.status().withContext(strCat("all-gather of unit '", u.name, "'"));
  p.work = std::move(*w);
  // A gather across nodes holds back the replica chunks behind it (engine/reduce_chain.h).
  const TraceLevel level = coll_.shardLevel();
  coll_.trackGather(
      p.work, !node_block && (level == TraceLevel::kInter || level == TraceLevel::kIntraInter));
  ++gathered_alive_;
  // A gather that left nothing in flight (no work, no bf16 block to upcast) is readable now.
  const ParamState to =
      p.work || p.block16 != nullptr ? ParamState::kGathering : ParamState::kGathered;
  return transition(u.name, p.state, to, verb,
                    {ParamState::kSharded, ParamState::kNodeBlockKept, ParamState::kDeferred});
}

Status ParamGroup::issueDeferred() {
  while (!deferred_.empty() && gathered_alive_ < opt_.max_gathered) {
    const int unit = deferred_.front();
    deferred_.pop_front();
    HSDP_RETURN_IF_ERROR(issueGather(unit, "unshard (deferred)"));
  }
  return okStatus();
}

// Copy-out writes all tensors at once, so they must not overlap one another (copy-in only
// reads them, into disjoint parameter slices; a tensor shared by tied parameters is fine).
Status ParamGroup::checkTensors(int unit, std::span<const TensorRef> tensors, const char* verb,
                                bool into_flat) {
  const Unit& u = units_[unit];
  plan_.clear();
  seen_.assign(u.layout.params().size(), 0);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorRef& t = tensors[k];
    auto bad = [&](auto&&... what) {
      return invalidArgument(verb, "('", u.name, "'): tensor ", k, " '", t.name, "' ", what...);
    };
    StatusOr<size_t> i = u.layout.indexOf(t.name);
    if (!i.ok()) return i.status().withContext(strCat(verb, "('", u.name, "'): tensor ", k));
    const ParamSpec& p = u.layout.params()[*i];
    if (t.numel != p.numel()) return bad("holds ", t.numel, " elements, the parameter ", p.numel());
    if (seen_[*i]++) return bad("is given twice");
    if (t.numel == 0) continue;
    if (t.data == nullptr) return bad("is a null pointer");
    Status where = space_.checkPointer(t.data);
    if (!where.ok()) return bad(where.message());
    plan_.push_back({t.data, u.layout.offset(*i), t.numel, k});
  }
  std::sort(plan_.begin(), plan_.end(),
            [](const PlannedCopy& a, const PlannedCopy& b) { return a.user < b.user; });
  for (size_t r = 1; r < plan_.size() && !into_flat; ++r)
    if (plan_[r].user < plan_[r - 1].user + plan_[r - 1].n)
      return invalidArgument(verb, "('", u.name, "'): tensors ",
                             std::min(plan_[r - 1].k, plan_[r].k), " and ",
                             std::max(plan_[r - 1].k, plan_[r].k), " overlap");
  return okStatus();
}

Status ParamGroup::runCopies(int unit, std::span<const TensorRef> tensors, const char* verb,
                             float* flat, bool into_flat) {
  const Unit& u = units_[unit];
  const float* flat_end = flat + u.layout.paddedNumel();
  pieces_.clear();
  for (const PlannedCopy& c : plan_) {
    if (c.user < flat_end && flat < c.user + c.n)
      return invalidArgument(verb, "('", u.name, "'): tensor ", c.k, " '", tensors[c.k].name,
                             "' lies inside the unit's own flat buffer (a view from param() "
                             "or grad()): use the view, or a tensor of your own");
    float* f = flat + c.offset;
    pieces_.push_back(into_flat ? CopyPiece{c.user, f, c.n} : CopyPiece{f, c.user, c.n});
  }
  return space_.batchedCopy(pieces_, /*accumulate=*/into_flat, Lane::kCompute);
}

Status ParamGroup::checkUnshard(int unit) const {
  return require(units_[unit].name, params_[unit].life.state, "unshard", kSharded,
                 "it is already unsharded");
}

Status ParamGroup::unshard(int unit) {
  const Unit& u = units_[unit];
  UnitParams& up = params_[unit];
  ParamLifecycle& p = up.life;
  HSDP_RETURN_IF_ERROR(checkUnshard(unit));
  p.rest = p.state;
  if (opt_.shards == 1 || opt_.replicated) {
    // Mode none: the shard is the whole; zero1/zero2: always whole, nothing to gather.
    p.full = opt_.shards == 1 ? up.shard.as<float>() : up.whole.as<float>();
    return transition(u.name, p.state, ParamState::kGathered, "unshard", kSharded);
  }
  if (opt_.max_gathered > 0 && gathered_alive_ >= opt_.max_gathered) {
    // Rate limit: issue this gather when an earlier unit is resharded (or when waited for).
    deferred_.push_back(unit);
    return transition(u.name, p.state, ParamState::kDeferred, "unshard", kSharded);
  }
  return issueGather(unit, "unshard");
}

Status ParamGroup::waitForUnshard(int unit) {
  const Unit& u = units_[unit];
  ParamLifecycle& p = params_[unit].life;
  HSDP_RETURN_IF_ERROR(
      require(u.name, p.state, "waitForUnshard", kUnsharded, "it was not unsharded"));
  if (p.state == ParamState::kDeferred) {  // waited for before a slot freed up: issue it now
    HSDP_INFO(kShard, "gather of unit '", u.name, "' issued past the limit of ", opt_.max_gathered,
              " gathered units: it is waited for");
    deferred_.erase(std::find(deferred_.begin(), deferred_.end(), unit));
    HSDP_RETURN_IF_ERROR(issueGather(unit, "waitForUnshard"));
  }
  if (p.state != ParamState::kGathering) return okStatus();
  if (p.work) {  // on a device: the compute stream waits for the gather, the host does not
    watchdog::WaitScope wait("waitForUnshard", u.name);
    HSDP_RETURN_IF_ERROR(blockOn(unit).withContext(strCat("all-gather of unit '", u.name, "'")));
  }
  if (p.block16 != nullptr) {  // compute runs in fp32 on the bf16-rounded parameters
    HSDP_RETURN_IF_ERROR(space_.castToFloat(static_cast<const bf16*>(p.block16), p.full,
                                            u.layout.paddedNumel(), Lane::kCompute));
    HSDP_RETURN_IF_ERROR(pool16_.release(p.block16));
    p.block16 = nullptr;
  }
  return transition(u.name, p.state, ParamState::kGathered, "waitForUnshard",
                    {ParamState::kGathering});
}

// The unit's gather, waited for on the caller's thread: the wait and the gather are the trace's.
Status ParamGroup::blockOn(int unit) {
  ParamLifecycle& p = params_[unit].life;
  Tracer& tr = coll_.tracer();
  const int64_t t0 = Tracer::nowUs();
  HSDP_RETURN_IF_ERROR(coll_.reached(p.work, Lane::kCompute, /*block=*/true).status());
  p.work.reset();
  tr.wait(TraceKind::kWaitGather, unit, t0);
  const TraceLevel level =
      p.rest == ParamState::kNodeBlockKept ? TraceLevel::kIntra : coll_.shardLevel();
  tr.collective(TraceKind::kGather, level, unit, p.wire_bytes, p.issued_us);
  return okStatus();
}

Status ParamGroup::reshard(int unit) {
  const Unit& u = units_[unit];
  UnitParams& up = params_[unit];
  ParamLifecycle& p = up.life;
  HSDP_RETURN_IF_ERROR(require(u.name, p.state, "reshard", kUnsharded, "it is not unsharded"));
  if (p.state == ParamState::kDeferred) {  // never issued: nothing to free, nothing to keep
    deferred_.erase(std::find(deferred_.begin(), deferred_.end(), unit));
    return transition(u.name, p.state, p.rest, "reshard", kUnsharded);
  }
  if (p.work) {  // resharding a unit whose gather is still in flight: let it land first
    watchdog::WaitScope wait("reshard", u.name);
    HSDP_RETURN_IF_ERROR(blockOn(unit));
  }
  if (p.block16 != nullptr) {
    HSDP_RETURN_IF_ERROR(pool16_.release(p.block16));
    p.block16 = nullptr;
  }
  ParamState to = p.rest;
  if (opt_.hpz && to == ParamState::kSharded) {
    // Keep our intra-node block (shards intra_idx*J .. intra_idx*J + J-1) until step().
    const size_t n = opt_.inter_shard * u.layout.shardNumel();
    HSDP_RETURN_IF_ERROR(space_.copy(up.node_block.data(), p.full + opt_.intra_idx * n,
                                     n * sizeof(float), Lane::kCompute));
    to = ParamState::kNodeBlockKept;
  }
  if (opt_.shards > 1 && !opt_.replicated) {
    HSDP_RETURN_IF_ERROR(pool_.release(p.full));
    --gathered_alive_;
  }
  p.full = nullptr;
  HSDP_RETURN_IF_ERROR(transition(u.name, p.state, to, "reshard", kUnsharded));
  if (opt_.max_gathered > 0) HSDP_RETURN_IF_ERROR(issueDeferred());
  return okStatus();
}

StatusOr<ParamView> ParamGroup::param(int unit, std::string_view name) const {
  const Unit& u = units_[unit];
  const ParamLifecycle& p = params_[unit].life;
  HSDP_RETURN_IF_ERROR(require(u.name, p.state, strCat("param('", u.name, ".", name, "')"),
                               {ParamState::kGathered}, kGatheredHint));
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  const ParamSpec& s = u.layout.params()[i];
  return ParamView{p.full + u.layout.offset(i), s.shape, s.numel()};
}

Status ParamGroup::copyOut(int unit, std::span<const TensorRef> tensors) {
  const ParamLifecycle& p = params_[unit].life;
  HSDP_RETURN_IF_ERROR(
      require(units_[unit].name, p.state, "copyOutParams", {ParamState::kGathered}, kGatheredHint));
  HSDP_RETURN_IF_ERROR(checkTensors(unit, tensors, "copyOutParams", /*into_flat=*/false));
  return runCopies(unit, tensors, "copyOutParams", p.full, /*into_flat=*/false);
}

}  // namespace hsdp::engine
