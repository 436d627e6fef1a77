// Checkpoints of semi-synchronous replicas (docs/checkpoint.md, "Semi-synchronous replicas";
// docs/semi_sync.md). Between syncs every replica's parameters differ, and its inner Adam moments
// always do, so a checkpoint holds every replica's own state: the manifest's units are the
// model's once per replica ("replica<r>/<unit>"), each written whole by that replica's ranks (its
// shard group: pieces of one replica), and for diloco the outer anchor and momentum of every
// trainable unit ("outer_anchor/<unit>", "outer_momentum/<unit>", frozen: one state), identical
// on every replica and written once, by replica 0, after its own state. The layout rules (chunks,
// alignment, checksums, the commit) are those of every checkpoint; the manifest's format_version
// is 2 and its `replica_sync` object records the policy, H, F, the outer lr and momentum, the
// replica count and the step within the period. The sync format is unchanged.
#include <algorithm>

#include "engine/sharded_model_impl.h"

namespace hsdp {

using engine::Unit;

namespace {

// The model's trainable unit indices (the outer state's units, in order).
std::vector<int> trainable(const std::vector<ckpt::UnitDesc>& units) {
  std::vector<int> t;
  for (size_t u = 0; u < units.size(); ++u)
    if (!units[u].frozen) t.push_back(static_cast<int>(u));
  return t;
}

// The outer state's units (diloco): the anchors, then the momenta, of the trainable units.
std::vector<ckpt::UnitDesc> outerUnits(const std::vector<ckpt::UnitDesc>& model) {
  std::vector<ckpt::UnitDesc> out;
  for (bool momentum : {false, true})
    for (int u : trainable(model)) {
      ckpt::UnitDesc d = model[u];
      d.name = ckpt::outerUnitName(momentum, d.name);
      d.frozen = true;  // one state: the array itself
      out.push_back(std::move(d));
    }
  return out;
}

}  // namespace

std::vector<ckpt::UnitDesc> ShardedModel::Impl::checkpointUnits() const {
  std::vector<ckpt::UnitDesc> model = unitDescs();
  if (!outer->active()) return model;
  std::vector<ckpt::UnitDesc> v;
  for (int r = 0; r < mesh->shape().replicas(); ++r)
    for (ckpt::UnitDesc d : model) {
      d.name = ckpt::replicaUnitName(r, d.name);
      v.push_back(std::move(d));
    }
  if (outer->diloco())
    for (ckpt::UnitDesc& d : outerUnits(model)) v.push_back(std::move(d));
  return v;
}

ckpt::FilePlan ShardedModel::Impl::savePlan(int shard, int replica) const {
  std::vector<ckpt::UnitDesc> mine = unitDescs();
  if (!outer->active()) return ckpt::planFile(mine, shards, pieceReplicas(), shard, replica);
  const int per_replica = static_cast<int>(ckpt::tensorList(mine).size());
  const int replicas = mesh->shape().replicas();
  if (replica == 0 && outer->diloco())
    for (ckpt::UnitDesc& d : outerUnits(mine)) mine.push_back(std::move(d));
  // This replica's whole shard (one piece), then the outer state's; indexed as checkpointUnits().
  ckpt::FilePlan plan = ckpt::planFile(mine, shards, 1, shard, 0);
  for (ckpt::PlannedChunk& c : plan.chunks)
    c.tensor = c.tensor < per_replica ? replica * per_replica + c.tensor
                                      : replicas * per_replica + (c.tensor - per_replica);
  return plan;
}

const float* ShardedModel::Impl::saveSource(const ckpt::TensorDesc& t, bool* host,
                                            const Unit** unit) {
  const int n = static_cast<int>(units.size());
  const int base = outer->active() ? n * mesh->shape().replicas() : 0;
  if (t.unit < base || !outer->active()) {  // a model unit (this rank's replica's)
    Unit& u = units[outer->active() ? t.unit % n : t.unit];
    *unit = &u;
    const bool offloaded = stagedOffload() && !u.frozen;  // the master's host copy
    *host = offloaded;
    return t.state == ckpt::State::kParam && !offloaded ? master(u)
           : t.state == ckpt::State::kParam             ? u.host_master.as<float>()
           : t.state == ckpt::State::kExpAvg            ? u.exp_avg.as<float>()
                                                        : u.exp_avg_sq.as<float>();
  }
  const std::vector<int> tr = trainable(unitDescs());
  const int j = t.unit - base, k = tr[j % tr.size()];
  *unit = &units[k];
  *host = true;  // the outer state is host memory
  return j < static_cast<int>(tr.size()) ? outer->anchor(k).data() : outer->momentum(k).data();
}

ckpt::ReplicaSyncDesc ShardedModel::Impl::replicaSyncDesc() const {
  const ReplicaSyncPolicy& p = outer->policy();
  ckpt::ReplicaSyncDesc d;
  d.policy = replicaPolicyName(p.policy);
  d.sync_every = p.sync_every;
  d.fragments = p.fragments;
  d.outer_lr = p.outer_lr;
  d.outer_momentum = p.outer_momentum;
  d.replicas = mesh->shape().replicas();
  d.model_units = static_cast<int>(units.size());
  d.step_in_period = step % p.sync_every;
  return d;
}

Status ShardedModel::Impl::checkSavedPolicy(const ckpt::Manifest& m, const std::string& dir) const {
  const ckpt::ReplicaSyncDesc mine = replicaSyncDesc();
  auto differ = [&](auto&&... what) {
    return invalidArgument("load: checkpoint '", dir, "' was saved with ", what...,
                           ": a semi-synchronous checkpoint resumes only under the policy, H, F, "
                           "outer lr and momentum and replica count it was saved with");
  };
  if (!m.semi_sync) {
    if (!outer->active()) return okStatus();
    return differ("replica policy sync (this model's: ", mine.policy,
                  "; one copy of the model, no outer state)");
  }
  const ckpt::ReplicaSyncDesc& d = m.replica_sync;
  if (!outer->active())
    return differ("replica policy ", d.policy, " (this model's: sync; ", d.replicas,
                  " replicas' own states)");
  if (d.policy != mine.policy)
    return differ("replica policy ", d.policy, " (this model's: ", mine.policy, ")");
  if (d.sync_every != mine.sync_every)
    return differ("sync_every (H) ", d.sync_every, " (this model's: ", mine.sync_every, ")");
  if (d.fragments != mine.fragments)
    return differ("fragments ", d.fragments, " (this model's: ", mine.fragments, ")");
  if (d.replicas != mine.replicas)
    return differ(d.replicas, " replicas (this model's: ", mine.replicas, ")");
  if (d.outer_lr != mine.outer_lr)
    return differ("outer lr ", d.outer_lr, " (this model's: ", mine.outer_lr, ")");
  if (d.outer_momentum != mine.outer_momentum)
    return differ("outer momentum ", d.outer_momentum, " (this model's: ", mine.outer_momentum,
                  ")");
  if (d.model_units != mine.model_units)
    return differ(d.model_units, " units per replica (this model's: ", mine.model_units, ")");
  return okStatus();
}

std::vector<ckpt::TensorReader::Request> ShardedModel::Impl::outerRequests(
    const ckpt::Manifest& m, OuterStaged* staged) const {
  std::vector<ckpt::TensorReader::Request> req;
  if (!outer->diloco()) return req;
  const std::vector<int> tr = trainable(unitDescs());
  const int base = static_cast<int>(units.size()) * mesh->shape().replicas();
  staged->anchor.assign(units.size(), {});
  staged->momentum.assign(units.size(), {});
  for (int u : tr) {
    staged->anchor[u].assign(units[u].layout.shardNumel(), 0.0f);
    staged->momentum[u].assign(units[u].layout.shardNumel(), 0.0f);
  }
  const std::vector<ckpt::TensorDesc> tensors = ckpt::tensorList(unitDescs());
  const size_t k = shardIndex();
  for (const ckpt::PlannedChunk& c : myPlan().chunks) {
    const ckpt::TensorDesc& t = tensors[c.tensor];
    if (t.state != ckpt::State::kParam || units[t.unit].frozen) continue;
    const int j = static_cast<int>(std::find(tr.begin(), tr.end(), t.unit) - tr.begin());
    const size_t rel = c.flat - k * units[t.unit].layout.shardNumel();
    for (int kind = 0; kind < 2; ++kind) {
      const int ti = m.tensorIndex(base + kind * static_cast<int>(tr.size()) + j, t.param,
                                   ckpt::State::kParam);
      std::vector<float>& dst = kind == 0 ? staged->anchor[t.unit] : staged->momentum[t.unit];
      req.push_back({ti, c.start, c.start + c.count, dst.data() + rel});
    }
  }
  return req;
}

void ShardedModel::Impl::installOuter(const OuterStaged& staged) {
  if (!outer->diloco()) return;
  for (size_t u = 0; u < staged.anchor.size(); ++u) {
    std::copy(staged.anchor[u].begin(), staged.anchor[u].end(), outer->anchor(u).begin());
    std::copy(staged.momentum[u].begin(), staged.momentum[u].end(), outer->momentum(u).begin());
  }
  outer->setAnchored(true);
}

}  // namespace hsdp
