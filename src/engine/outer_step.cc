// Semi-synchronous replicas (outer_step.h): the policy's checks, the outer state, the sync after
// an inner step. The model's part of it (which buffers, what is refreshed after) is in step.cc.
#include "engine/outer_step.h"

#include <cmath>

#include "hsdp/watchdog.h"

namespace hsdp::engine {

Status checkReplicaSync(const ReplicaSyncPolicy& p, int replicas, int units) {
  if (p.policy == ReplicaPolicy::kSync) {
    if (p.sync_delay == 0) return okStatus();
    return invalidArgument("EngineConfig::replica_sync.sync_delay=", p.sync_delay,
                           " needs replica policy local_sgd or diloco (sync has no outer step)");
  }
  const char* name = replicaPolicyName(p.policy);
  if (replicas < 2)
    return invalidArgument("replica policy ", name,
                           " needs replica groups, but the mesh has 1 replica (every rank is in "
                           "the one shard group): lower intra_shard x inter_shard, or use sync");
  if (p.sync_every < 1)
    return invalidArgument("EngineConfig::replica_sync.sync_every=", p.sync_every,
                           " must be >= 1 (the inner steps between syncs)");
  if (!std::isfinite(p.outer_lr) || p.outer_lr <= 0)
    return invalidArgument("EngineConfig::replica_sync.outer_lr=", p.outer_lr,
                           " must be finite and > 0");
  if (!std::isfinite(p.outer_momentum) || p.outer_momentum < 0 || p.outer_momentum >= 1)
    return invalidArgument("EngineConfig::replica_sync.outer_momentum=", p.outer_momentum,
                           " must be in [0, 1)");
  if (p.fragments < 1)
    return invalidArgument("EngineConfig::replica_sync.fragments=", p.fragments, " must be >= 1");
  // Streaming DiLoCo's rule (and torchft's): a fragment's outer gradient lands before the
  // fragment is sent again, H steps later.
  if (p.sync_delay < 0 || p.sync_delay >= p.sync_every)
    return invalidArgument("EngineConfig::replica_sync.sync_delay=", p.sync_delay,
                           " must be in [0, sync_every=", p.sync_every,
                           "): a fragment's outer all-reduce lands before its next sync starts");
  if (units >= 0 && p.fragments > units)
    return invalidArgument("EngineConfig::replica_sync.fragments=", p.fragments,
                           " exceeds the model's ", units, " units (a fragment is whole units)");
  return okStatus();
}

OuterSync::OuterSync(const ReplicaSyncPolicy& policy, UnitCollectives& coll)
    : p_(policy), coll_(coll) {}

void OuterSync::allocate(const std::vector<Unit>& units) {
  const int n = static_cast<int>(units.size());
  fragment_.resize(n);
  anchor_.resize(n);
  momentum_.resize(n);
  for (int k = 0; k < n; ++k) {
    fragment_[k] = static_cast<int>(int64_t{k} * p_.fragments / n);  // contiguous blocks
    if (!diloco() || units[k].frozen) continue;
    anchor_[k].assign(units[k].layout.shardNumel(), 0.0f);
    momentum_[k].assign(units[k].layout.shardNumel(), 0.0f);
  }
  pending_.assign(n, {});
  started_.assign(n, -1);
  inflight_.clear();
  inflight_.resize(n);
  if (p_.sync_delay > 0)
    for (int k = 0; k < n; ++k)
      if (!units[k].frozen) pending_[k].assign(units[k].layout.shardNumel(), 0.0f);
  anchored_ = false;
}

bool OuterSync::syncsAfter(int unit, int64_t t) const {
  if (!active() || t < 1) return false;
  const int64_t h = p_.sync_every;
  const int64_t off = int64_t{fragment_[unit]} * h / p_.fragments;
  return t >= off && (t - off) % h == 0;
}

void OuterSync::capture(int unit, const float* master, size_t n) {
  if (diloco() && !anchor_[unit].empty()) std::copy(master, master + n, anchor_[unit].begin());
}

int OuterSync::inFlightUnit(int only) const {
  for (size_t k = 0; k < started_.size(); ++k)
    if (started_[k] >= 0 && (only < 0 || only == static_cast<int>(k))) return static_cast<int>(k);
  return -1;
}

Status OuterSync::checkIdle(const char* verb, int64_t step, const std::vector<Unit>& units,
                            int only) const {
  const int k = inFlightUnit(only);
  if (k < 0) return okStatus();
  return failedPrecondition(
      verb, ": step ", step, " is inside the outer sync delay window: unit '", units[k].name,
      "' (fragment ", fragment_[k], ") started its outer all-reduce after step ", started_[k],
      " and applies it after step ", started_[k] + p_.sync_delay, " (sync_delay ", p_.sync_delay,
      "); a checkpoint holds no in-flight outer gradient: call it outside the window");
}

void OuterSync::apply(const Shard& s, const float* g) {
  if (!diloco()) {  // local_sgd: the average is the new master
    if (g != s.master) std::copy(g, g + s.n, s.master);
    return;
  }
  const float lr = p_.outer_lr, mu = p_.outer_momentum;
  float* a = anchor_[s.unit].data();
  float* m = momentum_[s.unit].data();
  for (size_t i = 0; i < s.n; ++i) {
    m[i] = mu * m[i] + g[i];
    const float p = a[i] - lr * (g[i] + mu * m[i]);
    s.master[i] = p;
    a[i] = p;
  }
}

Status OuterSync::sync(int64_t t, std::span<const Shard> due) {
  if (p_.sync_delay == 0) return syncNow(due);
  Tracer& tr = coll_.tracer();
  for (const Shard& s : due) {  // the ones started after t - tau: wait, update
    if (!landsAfter(s.unit, t)) continue;
    const int64_t t0 = Tracer::nowUs();
    watchdog::Label label("outer sync", "replica group");
    HSDP_RETURN_IF_ERROR(coll_.reached(inflight_[s.unit], Lane::kCompute, true).status());
    tr.wait(TraceKind::kWaitReplica, s.unit, t0);
    apply(s, pending_[s.unit].data());
    started_[s.unit] = -1;
  }
  for (const Shard& s : due) {  // the ones due now: start, in unit order on every rank
    if (!syncsAfter(s.unit, t)) continue;
    float* buf = pending_[s.unit].data();
    if (diloco()) {
      const float* a = anchor_[s.unit].data();
      for (size_t i = 0; i < s.n; ++i) buf[i] = a[i] - s.master[i];
    } else {
      std::copy(s.master, s.master + s.n, buf);
    }
    HSDP_ASSIGN_OR_RETURN(inflight_[s.unit],
                          coll_.replicaReduce(buf, s.n, diloco() ? s.residual : nullptr));
    started_[s.unit] = t;
  }
  for (WorkHandle& w : inflight_)  // progress for the ones in flight (a test, never a wait)
    if (w != nullptr) HSDP_RETURN_IF_ERROR(coll_.reached(w, Lane::kCompute, false, false).status());
  return coll_.poll();
}

Status OuterSync::syncNow(std::span<const Shard> due) {
  work_.clear();
  const bool dl = diloco();
  for (const Shard& s : due) {
    float* buf = s.master;
    if (dl) {  // the outer gradient, anchor - master, on the wire
      const float* a = anchor_[s.unit].data();
      for (size_t i = 0; i < s.n; ++i) s.scratch[i] = a[i] - s.master[i];
      buf = s.scratch;
    }
    watchdog::Label label("outer sync", "replica group");
    // local_sgd's parameters get no error feedback: what one sync dropped is not owed to the next.
    HSDP_ASSIGN_OR_RETURN(WorkHandle w, coll_.replicaReduce(buf, s.n, dl ? s.residual : nullptr));
    work_.push_back(std::move(w));
  }
  Tracer& tr = coll_.tracer();
  for (size_t k = 0; k < due.size(); ++k) {
    const Shard& s = due[k];
    const int64_t t0 = Tracer::nowUs();
    HSDP_RETURN_IF_ERROR(coll_.reached(work_[k], Lane::kCompute, /*block=*/true).status());
    tr.wait(TraceKind::kWaitReplica, s.unit, t0);
    if (dl) apply(s, s.scratch);  // local_sgd: the average landed in the master
  }
  work_.clear();
  return coll_.poll();
}

}  // namespace hsdp::engine
