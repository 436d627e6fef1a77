// Internal to the engine: semi-synchronous replicas (EngineConfig::replica_sync,
// docs/semi_sync.md). With local_sgd or diloco the gradients are reduced inside the shard group
// only (GradReducer skips the replica all-reduce) and each replica steps its own copy; after
// inner step t the units whose fragment is due sync over the replicas:
//   local_sgd   master := mean over the replicas of master
//   diloco      g := mean over the replicas of (anchor - master)      (the outer gradient)
//               m := mu * m + g;  master := anchor - lr * (g + mu * m)  (Nesterov, torch.optim.SGD)
//               anchor := master
// Fragment f (units split into F contiguous blocks) syncs after inner step t when
// t >= off(f) and (t - off(f)) % H == 0, t >= 1, with off(f) = f * H / F (F = 1: every H steps).
// Streaming DiLoCo's delay tau (sync_delay > 0): the outer gradient (local_sgd: the parameters)
// is copied into the unit's own in-flight buffer and its all-reduce started after step t; the
// inner steps go on, and after step t + tau it is waited for and applied as above (the paper's
// mixing alpha = 0: the fragment takes the synced value, its local progress of the tau steps is
// dropped, as torchft does). Each step() tests the works still in flight, so that they progress.
// The anchor and momentum are this rank's shard of each trainable unit, host memory, sharded
// like the inner optimizer state. Every collective goes through UnitCollectives (the replica
// wire's all-reduce).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/unit.h"
#include "engine/unit_collectives.h"
#include "hsdp/config.h"

namespace hsdp::engine {

// The policy's settings checked against the mesh's replica count (and, with `units` >= 0, the
// fragment count against the units): InvalidArgument naming the field and its value.
[[nodiscard]] Status checkReplicaSync(const ReplicaSyncPolicy& p, int replicas, int units = -1);

class OuterSync {
 public:
  OuterSync(const ReplicaSyncPolicy& policy, UnitCollectives& coll);

  bool active() const { return p_.policy != ReplicaPolicy::kSync; }
  bool diloco() const { return p_.policy == ReplicaPolicy::kDiloco; }
  const ReplicaSyncPolicy& policy() const { return p_; }

  // finalize(): each unit's fragment, and (diloco) the anchor and momentum of every trainable
  // unit's shard (zeros).
  void allocate(const std::vector<Unit>& units);
  int fragmentOf(int unit) const { return fragment_[unit]; }
  // Whether unit `unit` syncs after inner step `t` (1-based): its all-reduce starts then.
  bool syncsAfter(int unit, int64_t t) const;
  // Whether unit `unit`'s all-reduce is applied after inner step `t` (started after t - tau).
  bool landsAfter(int unit, int64_t t) const { return syncsAfter(unit, t - p_.sync_delay); }
  // A unit whose outer all-reduce is in flight (started, not applied), or -1; its start step.
  int inFlightUnit(int only = -1) const;
  // A save or load (`verb`) after inner step `step`: refused (FailedPrecondition naming the
  // step, the unit and the step it lands after) while an outer all-reduce is in flight; a
  // checkpoint holds no in-flight outer gradient, and a load would be overwritten by it.
  // With `only` >= 0 (setParameter), that unit's all-reduce only.
  [[nodiscard]] Status checkIdle(const char* verb, int64_t step, const std::vector<Unit>& units,
                                 int only = -1) const;

  // The anchors must be taken from the masters before the next inner step (after finalize and
  // load; a sync keeps them current).
  bool anchored() const { return anchored_; }
  void setAnchored(bool a) { anchored_ = a; }
  // anchor := master (n elements).
  void capture(int unit, const float* master, size_t n);

  // One unit to sync: its fp32 master shard and a scratch of the same size (the gradient shard,
  // free after the inner step); diloco on an encoded replica wire: the error feedback of the
  // outer gradient (the unit's replica residual, which the gradient path does not use here), or
  // null.
  struct Shard {
    int unit = 0;
    float* master = nullptr;
    float* scratch = nullptr;
    size_t n = 0;
    float* residual = nullptr;
  };
  // After inner step `t`, `due`: every unit that syncsAfter(t) or landsAfter(t). tau = 0: the
  // replica average of every shard (all issued, then waited for in order) and the outer update.
  // tau > 0: the landing ones waited for and updated, then the starting ones issued; the works
  // still in flight tested. The caller refreshes what derives from the masters of the units that
  // landed.
  [[nodiscard]] Status sync(int64_t t, std::span<const Shard> due);

  // Checkpoints: a unit's outer state (diloco; empty spans otherwise).
  std::span<float> anchor(int unit) { return anchor_[unit]; }
  std::span<float> momentum(int unit) { return momentum_[unit]; }

 private:
  ReplicaSyncPolicy p_;
  UnitCollectives& coll_;
  std::vector<int> fragment_;
  std::vector<std::vector<float>> anchor_, momentum_;  // per unit (diloco, trainable units)
  bool anchored_ = false;
  std::vector<WorkHandle> work_;  // reused by sync()
  // tau > 0, per unit: the outer gradient (or parameters) on the wire, the step after which it
  // started (-1: none) and its work (declared last: destroyed, i.e. finished, before the buffers).
  std::vector<std::vector<float>> pending_;
  std::vector<int64_t> started_;
  std::vector<WorkHandle> inflight_;

  Status syncNow(std::span<const Shard> due);
  // The outer update of `s` from `g`, the replica average (diloco; local_sgd: the parameters).
  void apply(const Shard& s, const float* g);
};

}  // namespace hsdp::engine
