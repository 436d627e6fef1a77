// ShardedModel::save / saveAsync / waitForSave, and what load shares with them (the idle check,
// the error agreement, the model and mesh descriptions, the snapshot buffer).
//
// A save, as data: the training thread checks the state is between steps and rank 0 prepares
// <root>/.tmp-<name>/. Every rank's planned chunks (format.h: planFile) go into the snapshot
// buffer, which is laid out exactly as its data file: chunks in device memory by the space's
// copy stream (startSnapshot), started by saveAsync; chunks in host memory by the copier thread,
// which copies and hashes them piece by piece while saveAsync has long returned. The training
// state changes again (the next step, an offloaded unit's early step, setParameter) only once
// the copier is done with it (waitForSnapshot). A writer thread per rank writes the file as the
// copier hands it over, fsyncs it and drops a part file (its size and checksums) beside it; rank
// 0's writer waits for every part, writes manifest.json last, renames the directory into place
// and replaces `latest`. The writer threads never call MPI (MPI runs FUNNELED): they coordinate
// through the directory, and waitForSave() agrees on the outcome over the world afterwards.
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/checkpoint/saver.h"
#include "engine/sharded_model_impl.h"
#include "engine/transition.h"
#include "hsdp/files.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"
#include "storage/io.h"
#include "storage/safetensors.h"

namespace hsdp {
namespace engine {

void SaverDeleter::operator()(Saver* s) const {
  if (s->writer.joinable()) s->writer.join();
  delete s;
}

namespace {
using S = SaveState;
// Every move of the saver's lifecycle (saver.h draws it), as (from, to).
constexpr std::pair<S, S> kSaveMoves[] = {
    {S::kIdle, S::kCopying},
    {S::kIdle, S::kWriting},
    {S::kCopying, S::kWriting},
    {S::kWriting, S::kIdle},
};
}  // namespace

const char* stateName(SaveState s) {
  constexpr const char* kNames[] = {"Idle", "Copying", "Writing"};  // SaveState's order
  return kNames[static_cast<int>(s)];
}

Status transition(SaveState& state, SaveState to, std::string_view verb, std::string_view hint) {
  return moveAlong(kSaveMoves, "the checkpoint saver", state, to, verb, hint);
}

}  // namespace engine

using engine::Unit;

Status ShardedModel::Impl::checkIdle(const char* verb) const {
  if (!finalized) return failedPrecondition(verb, ": call finalize() first");
  for (const Unit& u : units) {
    HSDP_RETURN_IF_ERROR(
        engine::require(u.name, paramsOf(u).life.state, verb,
                        {engine::ParamState::kSharded, engine::ParamState::kNodeBlockKept},
                        "it is unsharded; call it between step() and the next forward"));
    HSDP_RETURN_IF_ERROR(engine::require(
        u.name, gradOf(u).life.state, verb,
        {engine::GradState::kEmpty, engine::GradState::kReduced, engine::GradState::kStepping,
         engine::GradState::kStepped},
        "it has a gradient in progress; call it between step() and the next forward"));
  }
  return okStatus();
}

Status ShardedModel::Impl::agreeJobMarker() {
  constexpr size_t kLen = 128;
  std::vector<char> mine(kLen, 0), all(kLen * coll->controlSize());
  std::strncpy(mine.data(), files::jobMarker().c_str(), kLen - 1);
  HSDP_RETURN_IF_ERROR(coll->controlAllGather(mine.data(), all.data(), kLen, DType::kUInt8));
  files::setJobMarker(std::string(all.data()));
  return okStatus();
}

Status ShardedModel::Impl::agree(const Status& local, bool secondary) {
  return coll->agree(local, secondary);
}

std::vector<ckpt::UnitDesc> ShardedModel::Impl::unitDescs() const {
  std::vector<ckpt::UnitDesc> d;
  for (const Unit& u : units) {
    ckpt::UnitDesc x{u.name, u.frozen, {}};
    for (const ParamSpec& p : u.layout.params())
      x.params.push_back({p.name, p.shape, p.weight_decay});
    d.push_back(std::move(x));
  }
  return d;
}

ckpt::SavedUnder ShardedModel::Impl::savedUnder() const {
  ckpt::SavedUnder d;
  d.mesh = mesh->shape();
  d.shards = shards;
  d.replicas = mesh->shape().replicas();
  d.mode = shardModeName(cfg.mode);
  d.hpz = cfg.hpz;
  d.offload_cpu = cfg.offload.cpu;
  d.param_dtype = dtypeName(cfg.precision.param_dtype);
  d.reduce_dtype = dtypeName(cfg.precision.reduce_dtype);
  d.device = deviceName(cfg.device);
  if (elastic) {  // the membership this state was committed under
    d.elastic_job = elastic->job();
    d.elastic_group = elastic->groupIndex();
    d.elastic_step = elastic->committed().step;
    d.elastic_present = elastic->committed().present;
  }
  return d;
}

// The writer rule (docs/elastic.md, "Checkpoints"): the lowest group index of the quorum that
// committed the step whose state is saved. Every member of that quorum holds the same bits and
// reads the same record (the committed quorum), so every group computes the same writer without
// a message; the lowest index is stable while that group stays (no writer changes between saves
// without a failure), and any other choice from the record would do as well. Before this process
// has committed a step (a state loaded or initial, which every group holds alike) there is no
// record: group 0 writes.
int ShardedModel::Impl::checkpointWriter() const {
  if (!elastic) return -1;
  const engine::ElasticGroup::Committed& c = elastic->committed();
  if (c.step < 0 || c.step + 1 != step || c.present.empty()) return 0;
  return *std::min_element(c.present.begin(), c.present.end());
}

ckpt::FilePlan ShardedModel::Impl::myPlan() const {
  // Semi-sync: the whole shard of this rank's own replica (a piece of one replica).
  return ckpt::planFile(unitDescs(), shards, pieceReplicas(), shardIndex(),
                        pieceReplicas() == 1 ? 0 : mesh->coords().replica_rank);
}

Status ShardedModel::Impl::ensureSaver() {
  if (saver) return okStatus();
  std::unique_ptr<engine::Saver, engine::SaverDeleter> s(new engine::Saver());
  s->copies = &opt->hostCopies();
  s->plan = savePlan(shardIndex(), mesh->coords().replica_rank);  // myPlan()'s, then outer state
  s->direct_io = *cfg.checkpoint.direct_io;
  HSDP_ASSIGN_OR_RETURN(s->snapshot, HostBuffer::allocate(std::max<uint64_t>(s->plan.bytes, 64)));
  HSDP_ASSIGN_OR_RETURN(s->pinned,
                        s->copies->offloadSlot({{s->snapshot.data(), s->snapshot.size()}}));
  saver = std::move(s);
  return okStatus();
}

void* ShardedModel::Impl::stagingData() const { return saver->snapshot.data(); }

Status ShardedModel::saveAsync(const std::string& root, const SaveOptions& options) {
  Impl& m = *impl_;
  const auto t0 = engine::Clock::now();
  if (saveInFlight()) HSDP_RETURN_IF_ERROR(waitForSave().status());
  Status local = m.checkIdle("save");
  if (local.ok() && root.empty()) local = invalidArgument("save: empty checkpoint root");
  if (local.ok() && options.keep_last < 0)
    local = invalidArgument("save: keep_last=", options.keep_last, " must be >= 0");
  if (local.ok()) local = m.outer->checkIdle("save", m.step, m.units);  // streaming's delay window
  char def[32];
  std::snprintf(def, sizeof def, "step-%08lld", static_cast<long long>(m.step));
  const std::string name = options.name.empty() ? def : options.name;
  // addUnit refuses colliding names; checked again where they become file content.
  if (local.ok()) local = ckpt::checkTensorNames(m.unitDescs(), "save");
  for (const auto& [key, bytes] : options.user)
    if (local.ok() && bytes.size() > ckpt::kMaxUserEntryBytes)
      local = invalidArgument("save: user entry '", files::quote(key), "' is ", bytes.size(),
                              " bytes, over the limit of ", ckpt::kMaxUserEntryBytes, " bytes");
  if (local.ok() && (name[0] == '.' || name.find('/') != std::string::npos || name == "latest"))
    local = invalidArgument("save: checkpoint name '", name, "' must be a plain directory name");
  const int writer = m.checkpointWriter();
  if (writer >= 0 && writer != m.elastic->groupIndex()) {
    // Not this group's to write: nothing is written, nothing waits (the writer's save does not
    // hold up this group either). Every rank of the group decides alike (the same record); bad
    // arguments fail here as on the writer.
    HSDP_RETURN_IF_ERROR(m.agree(local));
    SaveResult r;
    r.dir = root + "/" + name;
    r.step = m.step;
    r.written = false;
    r.writer_group = writer;
    r.snapshot_seconds = std::chrono::duration<double>(engine::Clock::now() - t0).count();
    m.skipped_save = r;
    return okStatus();
  }
  const int rank = m.mesh->world().rank();
  if (!m.job_marker_agreed) {
    // Every rank names the temporary directory with rank 0's job marker (files::tempName).
    HSDP_RETURN_IF_ERROR(m.agreeJobMarker());
    m.job_marker_agreed = true;
  }
  const std::string tmp_name = files::tempName(name);
  const std::string tmp = root + "/" + tmp_name;
  if (local.ok() && rank == 0) {
    // The root, without this job's own leftovers (a save of this job that failed), and a fresh
    // temporary directory. Other names in the root, other jobs' temporaries included, are
    // never touched.
    local = files::makeDirs(root);
    StatusOr<ckpt::Dir> d = local.ok() ? ckpt::Dir::open(root) : StatusOr<ckpt::Dir>(local);
    if (!d.ok()) local = d.status();
    StatusOr<std::vector<ckpt::Dir::Entry>> entries =
        local.ok() ? d->list() : StatusOr<std::vector<ckpt::Dir::Entry>>(local);
    if (!entries.ok()) local = entries.status();
    for (size_t i = 0; local.ok() && i < entries->size(); ++i)
      if (files::isOwnTemp((*entries)[i].name)) local = d->removeTree((*entries)[i].name);
    if (local.ok()) local = d->makeDir(tmp_name);
    if (!local.ok()) local = local.withContext(strCat("save to '", files::quote(root), "'"));
  }
  for (Unit& u : m.units)
    if (local.ok()) local = m.waitForStep(u);
  // Semi-sync: the anchors the next inner step would take (a save before the first step).
  if (local.ok()) local = m.anchorOuter();
  if (local.ok()) local = m.ensureSaver();
  HSDP_RETURN_IF_ERROR(m.agree(local));
  // Every rank writes into the directory rank 0 made: the root must be one filesystem for all.
  if (files::kindOf(tmp) != files::Kind::kDirectory)
    local = failedPrecondition("save: rank ", rank, " does not see '", tmp,
                               "', which rank 0 "
                               "created: the checkpoint root must be on a filesystem every "
                               "rank shares");
  HSDP_RETURN_IF_ERROR(m.agree(local));

  // The snapshot: every planned chunk from the engine's buffers. Device memory: copies started
  // on the space's copy stream now. Host memory (the host space's buffers, offloaded state):
  // the copier thread's, after this returns.
  engine::Saver& s = *m.saver;
  const int k = m.shardIndex();
  Status snap;
  const std::vector<ckpt::TensorDesc> tensors = ckpt::tensorList(m.checkpointUnits());
  s.sources.assign(s.plan.chunks.size(), nullptr);
  bool any_host = false;
  for (size_t i = 0; i < s.plan.chunks.size() && snap.ok(); ++i) {
    const ckpt::PlannedChunk& c = s.plan.chunks[i];
    bool host = false;
    const Unit* u = nullptr;
    const float* src = m.saveSource(tensors[c.tensor], &host, &u);
    const size_t rel = c.flat - static_cast<size_t>(k) * u->layout.shardNumel();
    if (host || !m.onDevice()) {
      s.sources[i] = reinterpret_cast<const char*>(src + rel);
      any_host = true;
    } else {
      snap = s.copies->startSnapshot(*s.pinned, s.snapshot.as<char>() + c.offset, src + rel,
                                     c.count * sizeof(float));
    }
  }
  HSDP_RETURN_IF_ERROR(m.agree(snap));

  engine::SaveJob& job = s.job;
  job = engine::SaveJob();
  job.root = root;
  job.name = name;
  job.tmp = tmp;
  job.tmp_name = tmp_name;
  job.rank = rank;
  job.world = m.mesh->world().size();
  job.step = m.step;
  job.keep_last = options.keep_last;
  job.timeout_s = options.commit_timeout_s;
  job.t0 = t0;
  if (rank == 0) {
    ckpt::Manifest& man = job.manifest;
    man.step = m.step;
    man.created = engine::utcNow();
    man.units = m.checkpointUnits();
    man.saved = m.savedUnder();
    man.semi_sync = m.outer->active();
    if (man.semi_sync) man.replica_sync = m.replicaSyncDesc();
    const AdamConfig& a = m.cfg.adam;
    man.optim = {optimizerName(a.kind), a.lr,           a.beta1, a.beta2, a.eps,
                 a.weight_decay,        m.cfg.clip_norm};
    man.tensors = ckpt::tensorList(man.units);
    for (int w = 0; w < job.world; ++w) {
      const MeshCoords c = meshCoords(m.mesh->layout(), m.mesh->shape(), w);
      const int kw = m.shards == 1 ? 0 : c.shard_rank;
      man.files.push_back({ckpt::dataFileName(w), w, kw, c.replica_rank, 0, 0});
      job.plans.push_back(m.savePlan(kw, c.replica_rank));
    }
    for (const auto& kv : options.user) job.user.push_back(kv);
  }
  s.result = SaveResult();
  s.result.dir = root + "/" + name;
  s.result.step = m.step;
  s.result.writer_group = writer;
  s.result.snapshot_seconds = std::chrono::duration<double>(engine::Clock::now() - t0).count();
  {  // the trace's copies lane: the snapshot, from the call to here
    const int64_t end = engine::Tracer::nowUs();
    m.coll->tracer().snapshot(s.plan.bytes,
                              end - static_cast<int64_t>(s.result.snapshot_seconds * 1e6), end);
  }
  s.status = okStatus();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.ready = 0;
    HSDP_RETURN_IF_ERROR(engine::transition(
        s.state, any_host ? engine::SaveState::kCopying : engine::SaveState::kWriting, "save"));
  }
  s.writer = std::thread(engine::runWriter, &s);
  return okStatus();
}

Status ShardedModel::Impl::waitForSnapshot() {
  if (!saver) return okStatus();
  engine::Saver& s = *saver;
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.state != engine::SaveState::kCopying) return okStatus();
  // The copier reads the state for the save in flight: it must not change before.
  watchdog::WaitScope wait("checkpoint snapshot", s.result.dir);
  s.cv.wait(lock, [&] { return s.state != engine::SaveState::kCopying; });
  return okStatus();
}

StatusOr<SaveResult> ShardedModel::waitForSave() {
  Impl& m = *impl_;
  if (m.skipped_save) {  // elastic: another group writes it
    SaveResult r = *m.skipped_save;
    m.skipped_save.reset();
    return r;
  }
  if (!saveInFlight()) return failedPrecondition("waitForSave: no save in flight");
  engine::Saver& s = *m.saver;
  // The join waits for this rank's write (and on rank 0 the commit, bounded by
  // SaveOptions::commit_timeout_s); the agreement below is a world collective. Both are a wait
  // the watchdog times, so a rank stopped during a save is named like in any other wait.
  watchdog::WaitScope wait("save", s.result.dir);
  s.writer.join();
  HSDP_RETURN_IF_ERROR(s.moveTo(engine::SaveState::kIdle, "waitForSave"));
  Status agreed = m.agree(s.status, s.status_secondary);
  if (!agreed.ok() && m.mesh->world().rank() == 0) {
    // Every writer is done (the agreement followed their joins): nothing of the failed save is
    // left; the previous checkpoint and `latest` were never touched.
    StatusOr<ckpt::Dir> root = ckpt::Dir::open(s.job.root);
    if (root.ok()) (void)root->removeTree(s.job.tmp_name);
  }
  HSDP_RETURN_IF_ERROR(agreed);
  uint64_t mine = s.result.rank_bytes;
  std::vector<uint64_t> all(m.mesh->world().size());
  HSDP_RETURN_IF_ERROR(m.coll->controlAllGather(&mine, all.data(), 1, DType::kInt64));
  s.result.bytes = 0;
  for (uint64_t b : all) s.result.bytes += b;
  HSDP_INFO(kShard, "checkpoint ", s.result.dir, " committed: ", s.result.bytes, " bytes in ",
            s.result.seconds, " s");
  return s.result;
}

bool ShardedModel::saveInFlight() const {
  if (impl_->skipped_save) return true;  // waitForSave returns it
  return impl_->saver && impl_->saver->current() != engine::SaveState::kIdle;
}

StatusOr<SaveResult> ShardedModel::save(const std::string& root, const SaveOptions& options) {
  HSDP_RETURN_IF_ERROR(saveAsync(root, options));
  return waitForSave();
}

// ShardedModel::exportSafetensors: the full parameters, one unit at a time (gatherFullParameters,
// collective), written by rank 0 with the writer exportCheckpoint uses, so a model and a
// checkpoint of it export to the same bytes.
StatusOr<std::vector<std::string>> ShardedModel::exportSafetensors(const std::string& out,
                                                                   const ExportOptions& options) {
  Impl& m = *impl_;
  Status local = m.checkIdle("exportSafetensors");
  std::vector<ckpt::SafetensorsWriter::Tensor> list;
  for (const engine::Unit& u : m.units)
    for (const ParamSpec& p : u.layout.params())
      list.push_back({ckpt::joinedName(u.name, p.name), p.shape});
  StatusOr<ckpt::SafetensorsWriter> w =
      ckpt::SafetensorsWriter::create(out, std::move(list), options.dtype, options.max_shard_bytes);
  if (local.ok()) local = w.status();
  // Rank 0 writes: its view of the target decides (not a link, device, FIFO or directory).
  if (local.ok() && m.mesh->world().rank() == 0) local = w->checkTargets({});
  HSDP_RETURN_IF_ERROR(m.agree(local));
  const bool writer = m.mesh->world().rank() == 0;
  std::vector<float> full;
  for (int u = 0; u < numUnits(); ++u) {
    // Every rank takes part in every gather, whatever rank 0's file does.
    HSDP_RETURN_IF_ERROR(gatherFullParameters(u, &full));
    if (writer && local.ok()) local = w->append(full.data(), full.size());
  }
  std::vector<std::string> files = w->plannedFiles();
  if (writer && local.ok()) local = w->finish().status();
  HSDP_RETURN_IF_ERROR(m.agree(local));
  return files;
}

}  // namespace hsdp
