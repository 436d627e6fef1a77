// ShardedModel::load and loadWeights: both read, per rank, the planned chunks of its own piece of
// its shard (format.h: planFile on the model's mesh) into the staging buffer, agree over the
// world that every read succeeded, and only then install: the replicas all-gather their pieces
// over the replica group into the shards, and what derives from the masters (bf16 copies, the
// whole parameters of zero1/zero2, the offload host masters) is rebuilt. So a failed load
// changes nothing, and no byte of the checkpoint is read by two ranks. At the end, the layout of
// a semi-synchronous replicas' checkpoint (every replica's own state), which save.cc writes.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"
#include "storage/io.h"
#include "storage/safetensors.h"

namespace hsdp {

using engine::Unit;

namespace {

using ReadFn = std::function<Status(int unit, int param, ckpt::State state, uint64_t start,
                                    uint64_t count, float* dst)>;

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The optimizer settings a checkpoint holds, checked as the model's own are (validate, the clip
// norm's check): a hand-edited or damaged manifest is refused, not trained with.
StatusOr<AdamConfig> savedOptimizer(const ckpt::OptimDesc& o, const std::string& dir) {
  auto bad = [&](const Status& s) {
    return invalidArgument("checkpoint '", dir,
                           "' holds invalid optimizer settings: ", s.message());
  };
  StatusOr<OptimizerKind> kind = parseOptimizerKind(o.kind);
  if (!kind.ok()) return bad(kind.status());
  AdamConfig a;
  a.kind = *kind;
  a.lr = o.lr;
  a.beta1 = o.beta1;
  a.beta2 = o.beta2;
  a.eps = o.eps;
  a.weight_decay = o.weight_decay;
  if (Status s = validate(a); !s.ok()) return bad(s);
  if (Status s = engine::checkClipNorm(o.clip_norm); !s.ok()) return bad(s);
  return a;
}

}  // namespace

// Fills the staging buffer's planned chunks of states < `states` through `read` (loadWeights;
// load reads a checkpoint's chunks with TensorReader::readMany).
static Status readToStaging(const ckpt::FilePlan& plan,
                            const std::vector<ckpt::TensorDesc>& tensors, int states,
                            const ReadFn& read, char* staging) {
  for (const ckpt::PlannedChunk& c : plan.chunks) {
    const ckpt::TensorDesc& t = tensors[c.tensor];
    if (static_cast<int>(t.state) >= states) continue;
    HSDP_RETURN_IF_ERROR(read(t.unit, t.param, t.state, c.start, c.count,
                              reinterpret_cast<float*>(staging + c.offset)));
  }
  return okStatus();
}

Status ShardedModel::Impl::installFromStaging(int states) {
  const ckpt::FilePlan& plan = myPlan();
  const std::vector<ckpt::TensorDesc> tensors = ckpt::tensorList(unitDescs());
  const int R = pieceReplicas(), r = mesh->coords().replica_rank, k = shardIndex();
  const char* staging = static_cast<const char*>(stagingData());
  size_t pmax = 0;
  for (const Unit& u : units) pmax = std::max(pmax, (u.layout.shardNumel() + R - 1) / R);
  SpaceBuffer gather;
  if (R > 1) {
    HSDP_ASSIGN_OR_RETURN(gather, space->allocate(std::max<size_t>(1, R * pmax) * sizeof(float)));
  }
  // The planned chunks of each (unit, state), in file order.
  std::vector<std::vector<const ckpt::PlannedChunk*>> by(units.size() * ckpt::kStates);
  for (const ckpt::PlannedChunk& c : plan.chunks)
    by[tensors[c.tensor].unit * ckpt::kStates + static_cast<int>(tensors[c.tensor].state)]
        .push_back(&c);
  for (size_t ui = 0; ui < units.size(); ++ui) {
    Unit& u = units[ui];
    const size_t s = u.layout.shardNumel(), p = (s + R - 1) / R;
    const size_t shard0 = static_cast<size_t>(k) * s;
    for (int st = 0; st < (u.frozen ? 1 : states); ++st) {
      const bool host_dest = st > 0 && opt->offloaded();  // offloaded moments live in host memory
      float* dest = st == 0   ? master(u)
                    : st == 1 ? u.exp_avg.as<float>()
                              : u.exp_avg_sq.as<float>();
      const auto& chunks = by[ui * ckpt::kStates + st];
      if (R == 1) {
        for (const ckpt::PlannedChunk* c : chunks) {
          float* d = dest + (c->flat - shard0);
          const char* src = staging + c->offset;
          if (host_dest)
            std::memcpy(d, src, c->count * sizeof(float));
          else
            HSDP_RETURN_IF_ERROR(space->copyFromHost(d, src, c->count * sizeof(float)));
        }
        continue;
      }
      float* g = gather.as<float>();
      const size_t slot0 = shard0 + std::min(s, r * p);
      HSDP_RETURN_IF_ERROR(space->zero(g + r * p, p * sizeof(float), Lane::kCompute));
      for (const ckpt::PlannedChunk* c : chunks)
        HSDP_RETURN_IF_ERROR(space->copyFromHost(g + r * p + (c->flat - slot0), staging + c->offset,
                                                 c->count * sizeof(float)));
      // The replica communicator follows the reduce lane (on a device): let it see the copies.
      HSDP_RETURN_IF_ERROR(space->order(Lane::kReduce, Lane::kCompute));
      HSDP_ASSIGN_OR_RETURN(WorkHandle w, coll->replicaGather(g + r * p, g, p));
      HSDP_RETURN_IF_ERROR(coll->reached(w, Lane::kCompute, /*block=*/true, /*exposed=*/false)
                               .status()
                               .withContext(strCat("replica all-gather of unit '", u.name, "'")));
      if (host_dest)
        HSDP_RETURN_IF_ERROR(space->copyToHost(dest, g, s * sizeof(float)));
      else
        HSDP_RETURN_IF_ERROR(space->copy(dest, g, s * sizeof(float), Lane::kCompute));
    }
  }
  // What derives from the masters.
  for (Unit& u : units) {
    HSDP_RETURN_IF_ERROR(engine::forgetNodeBlock(u.name, paramsOf(u).life, "load"));
    if (stagedOffload() && !u.frozen)
      HSDP_RETURN_IF_ERROR(space->copyToHost(u.host_master.data(), master(u),
                                             u.layout.shardNumel() * sizeof(float)));
    HSDP_RETURN_IF_ERROR(refreshEncoded(u));
    HSDP_RETURN_IF_ERROR(refresh16(u));
  }
  if (replicatedParams()) HSDP_RETURN_IF_ERROR(gatherReplicated(/*frozen_too=*/true));
  return okStatus();
}

StatusOr<LoadResult> ShardedModel::load(const std::string& path, const LoadOptions& options) {
  Impl& m = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  if (saveInFlight()) HSDP_RETURN_IF_ERROR(waitForSave().status());
  LoadResult result;
  Status local = m.checkIdle("load");
  if (local.ok()) local = m.outer->checkIdle("load", m.step, m.units);
  if (local.ok() && m.elastic && m.elastic->started())
    local = failedPrecondition(
        "load: an elastic group loads a checkpoint before its first beginStep(); after it, its "
        "state comes from the quorum (a heal)");
  StatusOr<ckpt::Manifest> man = local;
  if (local.ok()) {
    StatusOr<std::string> dir = ckpt::resolveCheckpointDir(path);
    local = dir.status();
    if (local.ok()) result.dir = *dir;
  }
  if (local.ok()) {
    man = ckpt::readManifest(result.dir);
    local = man.status();
  }
  if (local.ok()) local = m.checkSavedPolicy(*man, result.dir);
  if (local.ok())
    local =
        ckpt::compareUnits(man->units, m.checkpointUnits(), result.dir, options.optimizer_state);
  if (local.ok() && options.optimizer_state) {
    StatusOr<AdamConfig> saved = savedOptimizer(man->optim, result.dir);
    local = saved.status();
    if (local.ok()) result.optimizer = *saved;
    result.clip_norm = man->optim.clip_norm;
  }
  for (Unit& u : m.units)
    if (local.ok()) local = m.waitForStep(u);
  if (local.ok()) local = m.ensureSaver();
  HSDP_RETURN_IF_ERROR(m.agree(local.ok() ? local : local.withContext("load")));

  const int states = options.optimizer_state ? ckpt::kStates : 1;
  ShardedModel::Impl::OuterStaged outer_staged;
  ckpt::TensorReader reader(*man, result.dir, options.verify, *m.cfg.checkpoint.direct_io);
  const auto t_read = std::chrono::steady_clock::now();
  {
    // The planned chunks of the states loaded, as the manifest's tensors, into the staging buffer.
    const ckpt::FilePlan& plan = m.myPlan();
    const std::vector<ckpt::TensorDesc> tensors = ckpt::tensorList(m.unitDescs());
    char* staging = static_cast<char*>(m.stagingData());
    std::vector<ckpt::TensorReader::Request> requests;
    // Semi-sync: this rank's replica's own units (below).
    const int unit0 =
        m.outer->active() ? m.mesh->coords().replica_rank * static_cast<int>(m.units.size()) : 0;
    for (const ckpt::PlannedChunk& c : plan.chunks) {
      const ckpt::TensorDesc& t = tensors[c.tensor];
      if (static_cast<int>(t.state) >= states) continue;
      const int ti = man->tensorIndex(unit0 + t.unit, t.param, t.state);
      if (ti < 0) {
        local = internalError("load: no tensor for unit ", t.unit, " param ", t.param);
        break;
      }
      requests.push_back(
          {ti, c.start, c.start + c.count, reinterpret_cast<float*>(staging + c.offset)});
    }
    if (local.ok() && options.optimizer_state)  // diloco: the outer state of this rank's shard
      for (const ckpt::TensorReader::Request& q : m.outerRequests(*man, &outer_staged))
        requests.push_back(q);
    if (local.ok()) local = reader.readMany(requests);
  }
  const double read_s = secondsSince(t_read);
  for (size_t i = 0; local.ok() && i < man->user.size(); ++i)
    local = reader.readUser(man->user[i], &result.user[man->user[i].key]);
  HSDP_RETURN_IF_ERROR(m.agree(local.ok() ? local : local.withContext("load")));

  const auto t_install = std::chrono::steady_clock::now();
  Status installed = m.installFromStaging(states);
  const double install_s = secondsSince(t_install);
  // Semi-sync: the outer state loaded (the anchors with it), or without the optimizer state,
  // anchors taken again from the loaded parameters before the next inner step.
  if (installed.ok()) {
    if (options.optimizer_state)
      m.installOuter(outer_staged);
    else
      m.outer->setAnchored(false);
  }
  if (installed.ok() && options.optimizer_state) {
    m.step = man->step;
    if (options.optimizer_from == OptimizerFrom::kCheckpoint) {
      const float lr = m.cfg.adam.lr;
      m.cfg.adam = result.optimizer;
      if (!options.restore_learning_rate) m.cfg.adam.lr = lr;
    }
  }
  // A unit stepped early (offload, before this load) is stepped again by the next step(), from
  // the loaded state: Stepped -> Reduced (load waited for every step in flight).
  for (Unit& u : m.units) {
    engine::GradLifecycle& g = m.gradOf(u).life;
    if (g.state == engine::GradState::kStepped)
      HSDP_RETURN_IF_ERROR(transition(u.name, g.state, engine::GradState::kReduced, "load",
                                      {engine::GradState::kStepped}));
  }
  HSDP_RETURN_IF_ERROR(m.agree(installed));
  // Elastic: the group now holds the state of the loaded step; it rejoins ready for it, so the
  // job's first quorum counts it in its core (whatever groups the saving job had).
  if (m.elastic) HSDP_RETURN_IF_ERROR(m.elastic->readyAt(m.step));
  result.step = man->step;
  result.bytes_read = reader.bytesRead();
  result.seconds = secondsSince(t0);
  HSDP_INFO(kShard, "loaded checkpoint ", result.dir, " (step ", result.step,
            "): ", result.bytes_read, " bytes read by this rank in ", result.seconds,
            " s (reading and verifying ", read_s, " s, installing ", install_s, " s)");
  return result;
}

Status ShardedModel::loadWeights(const std::string& path, const LoadWeightsOptions& options) {
  Impl& m = *impl_;
  if (saveInFlight()) HSDP_RETURN_IF_ERROR(waitForSave().status());
  Status local = m.checkIdle("loadWeights");
  if (local.ok()) local = m.outer->checkIdle("loadWeights", m.step, m.units);
  StatusOr<ckpt::SafetensorsSet> set = local;
  std::vector<ckpt::UnitDesc> units = m.unitDescs();
  if (local.ok()) {
    set = ckpt::openSafetensors(path);
    local = set.status();
  }
  // Every parameter's tensor (strict: all of them, and nothing else in the files).
  std::vector<std::vector<int>> index(units.size());
  if (local.ok())
    local =
        ckpt::matchTensors(*set, units, options.strict, {options.prefixes, options.ignore}, &index);
  for (Unit& u : m.units)
    if (local.ok()) local = m.waitForStep(u);
  if (local.ok()) local = m.ensureSaver();
  HSDP_RETURN_IF_ERROR(m.agree(local.ok() ? local : local.withContext("loadWeights")));
  ckpt::FilePlan plan = m.myPlan();
  // Parameters the files do not have keep their values: stage the current master for them.
  ReadFn read = [&](int unit, int param, ckpt::State, uint64_t start, uint64_t count,
                    float* dst) -> Status {
    const int t = index[unit][param];
    if (t >= 0) return set->read(t, start, count, dst);
    Unit& u = m.units[unit];
    const size_t rel = u.layout.offset(param) + start -
                       static_cast<size_t>(m.shardIndex()) * u.layout.shardNumel();
    return m.space->copyToHost(dst, m.master(u) + rel, count * sizeof(float));
  };
  local =
      readToStaging(plan, ckpt::tensorList(units), 1, read, static_cast<char*>(m.stagingData()));
  HSDP_RETURN_IF_ERROR(m.agree(local.ok() ? local : local.withContext("loadWeights")));
  m.outer->setAnchored(false);  // semi-sync: anchors are taken again before the next inner step
  return m.agree(m.installFromStaging(1));
}

// ---- Checkpoints of semi-synchronous replicas: what save and load share ----
// (docs/checkpoint.md, "Semi-synchronous replicas";
// docs/semi_sync.md). Between syncs every replica's parameters differ, and its inner Adam moments
// always do, so a checkpoint holds every replica's own state: the manifest's units are the
// model's once per replica ("replica<r>/<unit>"), each written whole by that replica's ranks (its
// shard group: pieces of one replica), and for diloco the outer anchor and momentum of every
// trainable unit ("outer_anchor/<unit>", "outer_momentum/<unit>", frozen: one state), identical
// on every replica and written once, by replica 0, after its own state. The layout rules (chunks,
// alignment, checksums, the commit) are those of every checkpoint; the manifest's format_version
// is 2 and its `replica_sync` object records the policy, H, F, the outer lr and momentum, the
// replica count and the step within the period. The sync format is unchanged.
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
  d.sync_delay = p.sync_delay;
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
  if (d.sync_delay != mine.sync_delay)
    return differ("sync_delay ", d.sync_delay, " (this model's: ", mine.sync_delay, ")");
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
