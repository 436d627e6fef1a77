// Semi-synchronous replicas (outer_step.h): the policy's checks, the outer state, the sync after
// an inner step. The model's part of it (which buffers, what is refreshed after) is in step.cc.
#include "engine/outer_step.h"

#include <cmath>

#include "hsdp/watchdog.h"

namespace hsdp::engine {

Status checkReplicaSync(const ReplicaSyncPolicy& p, int replicas, int units) {
  if (p.policy == ReplicaPolicy::kSync) return okStatus();
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

Status OuterSync::sync(std::span<const Shard> due) {
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
  const float lr = p_.outer_lr, mu = p_.outer_momentum;
  for (size_t k = 0; k < due.size(); ++k) {
    const Shard& s = due[k];
    const int64_t t0 = Tracer::nowUs();
    HSDP_RETURN_IF_ERROR(coll_.reached(work_[k], Lane::kCompute, /*block=*/true).status());
    tr.wait(TraceKind::kWaitReplica, s.unit, t0);
    if (!dl) continue;  // local_sgd: the average landed in the master
    float* a = anchor_[s.unit].data();
    float* m = momentum_[s.unit].data();
    for (size_t i = 0; i < s.n; ++i) {
      const float g = s.scratch[i];
      m[i] = mu * m[i] + g;
      const float p = a[i] - lr * (g + mu * m[i]);
      s.master[i] = p;
      a[i] = p;
    }
  }
  work_.clear();
  return coll_.poll();
}

}  // namespace hsdp::engine
