// ShardedModel::load and loadWeights: both read, per rank, the planned chunks of its own piece of
// its shard (format.h: planFile on the model's mesh) into the staging buffer, agree over the
// world that every read succeeded, and only then install: the replicas all-gather their pieces
// over the replica group into the shards, and what derives from the masters (bf16 copies, the
// whole parameters of zero1/zero2, the offload host masters) is rebuilt. So a failed load
// changes nothing, and no byte of the checkpoint is read by two ranks.
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
    // Semi-sync: this rank's replica's own units (checkpoint/semi_sync.cc).
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

}  // namespace hsdp
