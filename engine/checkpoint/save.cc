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

#include "engine/sharded_model_impl.h"
#include "hsdp/files.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"
#include "storage/io.h"

namespace hsdp {
namespace engine {

using Clock = std::chrono::steady_clock;

// What a writer thread needs, prepared on the training thread before it starts.
struct SaveJob {
  std::string root, name, tmp;  // tmp: root + "/" + tmp_name
  std::string tmp_name;         // files::tempName(name): this job's temporary directory
  int rank = 0, world = 1;
  int64_t step = 0;
  ckpt::Manifest manifest;            // rank 0: all but the files' sizes and checksums
  std::vector<ckpt::FilePlan> plans;  // rank 0: every rank's plan, for the chunk lists
  std::vector<std::pair<std::string, std::string>> user;  // rank 0
  int keep_last = 0;
  double timeout_s = 600;
  Clock::time_point t0;
};

struct Saver {
  HostBuffer snapshot;  // this rank's data file image (myPlan()), reused by every save
  std::unique_ptr<MemorySpace::OffloadSlot> pinned;  // the snapshot registered with the space
  MemorySpace* space = nullptr;
  ckpt::FilePlan plan;
  bool direct_io = true;  // EngineConfig::checkpoint_direct_io: the data file around the cache
  // Per plan chunk: where the copier copies it from (host memory: the engine's buffers or the
  // offloaded state), or nullptr where startSnapshot brings it (device memory). Set by saveAsync.
  std::vector<const char*> sources;
  // The copier's progress, under `mu`: the snapshot's first `ready` bytes are final (the writer
  // may write them); `copied`: no chunk is read from the training state any more (it may change).
  std::mutex mu;
  std::condition_variable cv;
  uint64_t ready = 0;
  bool copied = true;
  // No lock: the training thread fills `job` before starting the writer and reads `status` /
  // `result` only after joining it; the join orders the two.
  std::thread writer;
  SaveJob job;
  Status status;
  bool status_secondary = false;  // rank 0: the commit failed because a peer's write did
  SaveResult result;
  bool in_flight = false;
};

void SaverDeleter::operator()(Saver* s) const {
  if (s->writer.joinable()) s->writer.join();
  delete s;
}

namespace {

std::string partName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "part-%05d.json", rank);
  return buf;
}

// Dropped by a rank whose write failed and whose error part could not be written either (a full
// disk has room for an empty file's name, not for its contents): rank 0 stops waiting at once.
std::string failedName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "part-%05d.failed", rank);
  return buf;
}

std::string utcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The copier thread: brings every host chunk into the snapshot and hashes the snapshot (the
// file's streaming hash `file` and every chunk's own) in one pass. Each 256 KiB piece is copied
// and then fed to both hashes while it is in cache (the hashes cost no memory traffic of their
// own); chunks are in file order, gaps between them (alignment padding) feed the file's hash
// only. Device chunks are awaited first. Every copy is made whatever fails, so that the training
// thread's waitForSnapshot always returns; a failure is returned after.
Status copyAndHash(Saver& s, XXH64_state_t* file, std::vector<uint64_t>* chunk_hashes) {
  constexpr uint64_t kPiece = uint64_t{256} << 10;
  constexpr uint64_t kHandOver = uint64_t{4} << 20;  // the writer is told every 4 MiB
  const ckpt::FilePlan& plan = s.plan;
  char* snap = s.snapshot.as<char>();
  auto publish = [&](uint64_t ready, bool copied) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.ready = ready;
    s.copied = s.copied || copied;
    s.cv.notify_all();
  };
  size_t last_copy = 0;  // one past the last chunk the copier copies
  for (size_t i = 0; i < plan.chunks.size(); ++i)
    if (s.sources[i] != nullptr) last_copy = i + 1;
  Status st = s.space->finishSnapshot(*s.pinned);
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> c(XXH64_createState(),
                                                                      XXH64_freeState);
  if (st.ok() && (c == nullptr || file == nullptr))
    st = internalError("checkpoint: cannot allocate an xxHash state");
  if (st.ok()) XXH64_reset(file, 0);
  uint64_t at = 0, told = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ckpt::PlannedChunk& pc = plan.chunks[i];
    if (st.ok() && pc.offset < at) st = internalError("checkpoint: plan chunks out of file order");
    if (st.ok()) XXH64_update(file, snap + at, pc.offset - at);
    if (st.ok()) XXH64_reset(c.get(), 0);
    const uint64_t end = pc.offset + pc.count * sizeof(float);
    for (uint64_t p = pc.offset; p < end; p += kPiece) {
      const uint64_t n = std::min(kPiece, end - p);
      if (s.sources[i] != nullptr) std::memcpy(snap + p, s.sources[i] + (p - pc.offset), n);
      if (st.ok()) {
        XXH64_update(c.get(), snap + p, n);
        XXH64_update(file, snap + p, n);
      }
      if (p + n >= told + kHandOver) publish(told = p + n, false);
    }
    if (st.ok()) (*chunk_hashes)[i] = XXH64_digest(c.get());
    if (i + 1 == last_copy) publish(end, true);
    at = std::max(at, end);
  }
  if (st.ok()) XXH64_update(file, snap + at, plan.bytes - at);
  publish(plan.bytes, true);
  return st;
}

// What the copier thread hands the writer once joined: the file's streaming hash (the writer
// goes on with the user blobs), every chunk's hash and its status.
struct Copied {
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> file{XXH64_createState(),
                                                                         XXH64_freeState};
  std::vector<uint64_t> chunk_hashes;
  Status status;
};

// The save's temporary directory, opened without following a link at its name: a directory
// swapped for a link after rank 0 made it is refused, never written into.
StatusOr<ckpt::Dir> openTmp(const SaveJob& job) {
  HSDP_ASSIGN_OR_RETURN(ckpt::Dir root, ckpt::Dir::open(job.root));
  return ckpt::Dir::openAt(root, job.tmp_name);
}

// Writes this rank's data file from the snapshot as the copier (`copier`, filling `copied`)
// hands it over, then rank 0's user blobs, and fsyncs it; fills the part: bytes, the file's and
// every chunk's xxh64. Joins the copier unless it returns early (the caller joins it then).
Status writeDataFile(Saver& s, std::thread& copier, Copied& copied, nlohmann::json* part) {
  const SaveJob& job = s.job;
  HSDP_ASSIGN_OR_RETURN(ckpt::Dir tmp, openTmp(job));
  HSDP_ASSIGN_OR_RETURN(ckpt::File f,
                        ckpt::File::createNewAt(tmp, ckpt::dataFileName(job.rank), s.direct_io));
  const char* snap = s.snapshot.as<char>();
  // The snapshot in slices of whole 4 KiB blocks as the copier finishes them (a direct write
  // needs them whole; it waits for the disk without using the CPU, so it overlaps the copy).
  // Large slices: one direct write is one request in flight at a time, and the disk needs many
  // (4 MiB slices wrote at a third of the speed of one write of the whole file here).
  constexpr uint64_t kSlice = uint64_t{32} << 20;
  Status written;
  for (uint64_t done = 0; done < s.plan.bytes && written.ok();) {
    uint64_t ready;
    {
      std::unique_lock<std::mutex> lock(s.mu);
      s.cv.wait(lock, [&] { return s.ready == s.plan.bytes || s.ready >= done + kSlice; });
      ready = s.ready;
    }
    const uint64_t end =
        ready == s.plan.bytes ? ready : ready / ckpt::kDirectAlign * ckpt::kDirectAlign;
    written = f.writeAll(snap + done, end - done);
    done = end;
  }
  copier.join();
  HSDP_RETURN_IF_ERROR(written);
  HSDP_RETURN_IF_ERROR(copied.status);
  XXH64_state_t* st = copied.file.get();
  const std::vector<uint64_t>& chunk_hashes = copied.chunk_hashes;
  uint64_t at = s.plan.bytes;
  nlohmann::json user = nlohmann::json::array();
  static const char zeros[ckpt::kAlign] = {};
  for (const auto& [key, bytes] : job.user) {
    const uint64_t pad = ckpt::alignUp(at) - at;
    HSDP_RETURN_IF_ERROR(f.writeAll(zeros, pad));
    HSDP_RETURN_IF_ERROR(f.writeAll(bytes.data(), bytes.size()));
    XXH64_update(st, zeros, pad);
    XXH64_update(st, bytes.data(), bytes.size());
    user.push_back({at + pad, bytes.size(), ckpt::hex64(ckpt::xxh64(bytes.data(), bytes.size()))});
    at += pad + bytes.size();
  }
  const uint64_t file_hash = XXH64_digest(st);
  HSDP_RETURN_IF_ERROR(f.sync());
  HSDP_RETURN_IF_ERROR(f.close());
  nlohmann::json hashes = nlohmann::json::array();
  for (uint64_t h : chunk_hashes) hashes.push_back(ckpt::hex64(h));
  (*part)["bytes"] = at;
  (*part)["xxh64"] = ckpt::hex64(file_hash);
  (*part)["chunks"] = std::move(hashes);
  (*part)["user"] = std::move(user);
  return okStatus();
}

// One rank's part: its file's size and checksum, and its chunks' checksums, into the manifest.
Status addPart(const SaveJob& job, int r, const std::string& text, const std::string& path,
               ckpt::Manifest* mp) {
  ckpt::Manifest& m = *mp;
  nlohmann::json p = nlohmann::json::parse(text, nullptr, false);
  if (p.is_discarded() || !p.is_object()) return internalError("unreadable part file ", path);
  if (p.contains("error")) return internalError(p["error"].get<std::string>());
  ckpt::FileDesc& f = m.files[r];
  f.bytes = p["bytes"].get<uint64_t>();
  f.xxh64 = std::stoull(p["xxh64"].get<std::string>(), nullptr, 16);
  const ckpt::FilePlan& plan = job.plans[r];
  const nlohmann::json& hashes = p["chunks"];
  if (hashes.size() != plan.chunks.size()) return internalError("part file ", path, " is stale");
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    const ckpt::PlannedChunk& pc = plan.chunks[c];
    m.tensors[pc.tensor].chunks.push_back(
        {r, pc.offset, pc.start, pc.count, std::stoull(hashes[c].get<std::string>(), nullptr, 16)});
  }
  if (r == 0)
    for (size_t i = 0; i < job.user.size(); ++i) {
      const nlohmann::json& e = p["user"][i];
      m.user.push_back({job.user[i].first, 0, e[0].get<uint64_t>(), e[1].get<uint64_t>(),
                        std::stoull(e[2].get<std::string>(), nullptr, 16)});
    }
  return okStatus();
}

// Rank 0: every rank's part (waiting up to the timeout), then the manifest. `*peer` is set when
// the failure is another rank's (its own error names the cause).
StatusOr<ckpt::Manifest> collectParts(const SaveJob& job, bool* peer) {
  ckpt::Manifest m = job.manifest;
  m.files.resize(job.world);
  HSDP_ASSIGN_OR_RETURN(ckpt::Dir tmp, openTmp(job));
  const Clock::time_point deadline =
      Clock::now() +
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(job.timeout_s));
  for (int r = 0; r < job.world; ++r) {
    const std::string path = tmp.join(partName(r));
    while (tmp.kindOf(partName(r)) == files::Kind::kMissing) {
      if (tmp.kindOf(failedName(r)) != files::Kind::kMissing) {
        *peer = true;
        return internalError("checkpoint '", job.root, "/", job.name, "': rank ", r,
                             " could not write its data file; the previous checkpoint is kept");
      }
      if (Clock::now() > deadline)
        return internalError("checkpoint '", job.root, "/", job.name, "': rank ", r,
                             " did not write its data file within ", job.timeout_s, " s (", path,
                             " missing); the previous checkpoint is kept");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    HSDP_ASSIGN_OR_RETURN(std::string text, tmp.readFile(partName(r), ckpt::kMaxPartBytes, "part"));
    // Our own writers made it, but read it defensively: a bad part fails the commit, not the job.
    try {
      Status part = addPart(job, r, text, path, &m);
      *peer = !part.ok() && r != 0;
      HSDP_RETURN_IF_ERROR(part);
    } catch (const std::exception& e) {
      return internalError("unreadable part file ", path, ": ", e.what());
    }
  }
  for (ckpt::TensorDesc& t : m.tensors)
    std::sort(t.chunks.begin(), t.chunks.end(),
              [](const ckpt::Chunk& a, const ckpt::Chunk& b) { return a.start < b.start; });
  HSDP_RETURN_IF_ERROR(m.finish(job.tmp + "/" + ckpt::kManifestName));
  return m;
}

// Whether `name` in `root` is a committed hsdp checkpoint: a directory (not a link) whose
// manifest parses and carries hsdp's format id.
bool isCheckpointDir(const ckpt::Dir& root, const std::string& name) {
  return root.kindOf(name) == files::Kind::kDirectory && ckpt::readManifest(root.join(name)).ok();
}

// Deletes all but the newest `keep` committed checkpoints of the root (by step, then name). Only
// what hsdp wrote is a candidate: a directory with a name hsdp gives ("step-" and digits) whose
// manifest carries hsdp's format id; anything else in the root is never touched.
Status prune(const ckpt::Dir& root, int keep, const std::string& current) {
  HSDP_ASSIGN_OR_RETURN(std::vector<ckpt::Dir::Entry> entries, root.list());
  std::vector<std::pair<int64_t, std::string>> found;
  for (const ckpt::Dir::Entry& e : entries) {
    if (e.kind != files::Kind::kDirectory || !ckpt::isStepName(e.name)) continue;
    StatusOr<ckpt::Manifest> m = ckpt::readManifest(root.join(e.name));
    if (m.ok()) found.push_back({m->step, e.name});
  }
  std::sort(found.rbegin(), found.rend());
  int kept = 0;
  for (const auto& [step, n] : found) {
    if (n == current || kept < keep - 1) {
      kept += n == current ? 0 : 1;
      continue;
    }
    HSDP_RETURN_IF_ERROR(root.removeTree(n));
  }
  return okStatus();
}

Status commit(const SaveJob& job, bool* peer) {
  HSDP_ASSIGN_OR_RETURN(ckpt::Manifest m, collectParts(job, peer));
  HSDP_ASSIGN_OR_RETURN(ckpt::Dir root, ckpt::Dir::open(job.root));
  HSDP_ASSIGN_OR_RETURN(ckpt::Dir tmp, ckpt::Dir::openAt(root, job.tmp_name));
  for (int r = 0; r < job.world; ++r) HSDP_RETURN_IF_ERROR(tmp.removeFile(partName(r)));
  const std::string text = ckpt::serializeManifest(m);
  {
    HSDP_ASSIGN_OR_RETURN(ckpt::File f, ckpt::File::createNewAt(tmp, ckpt::kManifestName));
    HSDP_RETURN_IF_ERROR(f.writeAll(text.data(), text.size()));
    HSDP_RETURN_IF_ERROR(f.sync());
    HSDP_RETURN_IF_ERROR(f.close());
  }
  HSDP_RETURN_IF_ERROR(tmp.sync());
  // Into place: a new name, or an older checkpoint of the same name exchanged and removed;
  // anything else of that name (the user's directory, a file, a link) is kept and the save fails.
  const files::Kind there = root.kindOf(job.name);
  if (there == files::Kind::kMissing) {
    HSDP_RETURN_IF_ERROR(root.rename(job.tmp_name, job.name, ckpt::Dir::Rename::kNoReplace));
  } else if (isCheckpointDir(root, job.name)) {
    HSDP_RETURN_IF_ERROR(root.rename(job.tmp_name, job.name, ckpt::Dir::Rename::kExchange));
    HSDP_RETURN_IF_ERROR(root.removeTree(job.tmp_name));
  } else {
    return invalidArgument("checkpoint '", files::quote(root.join(job.name)), "': that name is ",
                           files::kindName(there),
                           " that is not an hsdp checkpoint; it is not replaced");
  }
  HSDP_RETURN_IF_ERROR(root.sync());
  HSDP_RETURN_IF_ERROR(root.replaceFile(ckpt::kLatestName, job.name + "\n"));
  if (job.keep_last > 0) HSDP_RETURN_IF_ERROR(prune(root, job.keep_last, job.name));
  return okStatus();
}

// The writer thread's body.
void runWriter(Saver* s) {
  const SaveJob& job = s->job;
  nlohmann::json part = {{"rank", job.rank}};
  // The copier first, whatever fails after: the training thread waits for its copies.
  Copied copied;
  copied.chunk_hashes.resize(s->plan.chunks.size());
  std::thread copier(
      [&] { copied.status = copyAndHash(*s, copied.file.get(), &copied.chunk_hashes); });
  Status st = writeDataFile(*s, copier, copied, &part);
  if (copier.joinable()) copier.join();
  if (!st.ok())
    part = {{"rank", job.rank}, {"error", strCat("rank ", job.rank, ": ", st.message())}};
  // The part appears whole (written beside, then renamed), so rank 0 never reads half of one;
  // no fsync: it only tells rank 0 the data file is durable, and the commit removes it.
  const std::string text = part.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  StatusOr<ckpt::Dir> tmp = openTmp(job);
  Status p = [&]() -> Status {
    HSDP_RETURN_IF_ERROR(tmp.status());
    const std::string name = partName(job.rank), beside = name + ".tmp";
    HSDP_ASSIGN_OR_RETURN(ckpt::File f, ckpt::File::createNewAt(*tmp, beside));
    HSDP_RETURN_IF_ERROR(f.writeAll(text.data(), text.size()));
    HSDP_RETURN_IF_ERROR(f.close());
    return tmp->rename(beside, name, ckpt::Dir::Rename::kNoReplace);
  }();
  if (!p.ok() && tmp.ok()) {
    // The part does not fit (a full disk has room for an empty file's name, not for its
    // contents): an empty marker, so rank 0 need not wait for the timeout.
    StatusOr<ckpt::File> marker = ckpt::File::createNewAt(*tmp, failedName(job.rank));
    if (marker.ok()) (void)marker->close();
  }
  if (st.ok()) st = p;
  s->status_secondary = false;
  if (st.ok() && job.rank == 0) st = commit(job, &s->status_secondary);
  s->status = st;
  s->result.rank_bytes = s->plan.bytes;
  s->result.seconds = std::chrono::duration<double>(Clock::now() - job.t0).count();
}

}  // namespace
}  // namespace engine

using engine::Unit;

Status ShardedModel::Impl::checkIdle(const char* verb) const {
  if (!finalized) return failedPrecondition(verb, ": call finalize() first");
  for (const Unit& u : units) {
    HSDP_RETURN_IF_ERROR(
        engine::require(u.name, u.params.state, verb,
                        {engine::ParamState::kSharded, engine::ParamState::kNodeBlockKept},
                        "it is unsharded; call it between step() and the next forward"));
    HSDP_RETURN_IF_ERROR(engine::require(
        u.name, u.grads.state, verb,
        {engine::GradState::kEmpty, engine::GradState::kReduced, engine::GradState::kStepping,
         engine::GradState::kStepped},
        "it has a gradient in progress; call it between step() and the next forward"));
  }
  return okStatus();
}

Status ShardedModel::Impl::agreeJobMarker() {
  constexpr size_t kLen = 128;
  Comm& world = mesh->world();
  std::vector<char> mine(kLen, 0), all(kLen * world.size());
  std::strncpy(mine.data(), files::jobMarker().c_str(), kLen - 1);
  HSDP_RETURN_IF_ERROR(space->allGatherHost(world, mine.data(), all.data(), kLen, DType::kUInt8));
  files::setJobMarker(std::string(all.data()));
  return okStatus();
}

Status ShardedModel::Impl::agree(const Status& local, bool secondary) {
  constexpr size_t kMsg = 1024;  // [code, secondary, message..., 0]
  Comm& world = mesh->world();
  std::vector<char> mine(kMsg, 0), all(kMsg * world.size());
  if (!local.ok()) {
    mine[0] = static_cast<char>(static_cast<int>(local.code()));
    mine[1] = secondary ? 1 : 0;
    std::strncpy(mine.data() + 2, local.message().c_str(), kMsg - 3);
  }
  HSDP_RETURN_IF_ERROR(space->allGatherHost(world, mine.data(), all.data(), kMsg, DType::kUInt8));
  int first = -1;
  for (int r = world.size() - 1; r >= 0; --r)
    if (all[r * kMsg] != 0 && (first < 0 || all[r * kMsg + 1] == 0 || all[first * kMsg + 1] != 0))
      first = r;
  if (first < 0) return okStatus();
  return Status(static_cast<StatusCode>(all[first * kMsg]), std::string(&all[first * kMsg + 2]));
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

ckpt::MeshDesc ShardedModel::Impl::meshDesc() const {
  const MeshShape& s = mesh->shape();
  ckpt::MeshDesc d;
  d.world_size = s.world_size;
  d.num_nodes = s.num_nodes;
  d.ranks_per_node = s.ranks_per_node;
  d.intra_shard = s.intra_shard;
  d.inter_shard = s.inter_shard;
  d.shards = shards;
  d.replicas = pieceReplicas();
  d.mode = shardModeName(cfg.mode);
  d.hpz = cfg.hpz;
  d.offload_cpu = cfg.offload_cpu;
  d.param_dtype = dtypeName(cfg.param_dtype);
  d.reduce_dtype = dtypeName(cfg.reduce_dtype);
  d.device = deviceName(cfg.device);
  return d;
}

ckpt::FilePlan ShardedModel::Impl::myPlan() const {
  return ckpt::planFile(unitDescs(), shards, pieceReplicas(), shardIndex(),
                        mesh->coords().replica_rank);
}

Status ShardedModel::Impl::ensureSaver() {
  if (saver) return okStatus();
  std::unique_ptr<engine::Saver, engine::SaverDeleter> s(new engine::Saver());
  s->space = space.get();
  s->plan = myPlan();
  s->direct_io = *cfg.checkpoint_direct_io;
  HSDP_ASSIGN_OR_RETURN(s->snapshot, HostBuffer::allocate(std::max<uint64_t>(s->plan.bytes, 64)));
  HSDP_ASSIGN_OR_RETURN(s->pinned, space->offloadSlot({{s->snapshot.data(), s->snapshot.size()}}));
  saver = std::move(s);
  return okStatus();
}

void* ShardedModel::Impl::stagingData() const { return saver->snapshot.data(); }

Status ShardedModel::saveAsync(const std::string& root, const SaveOptions& options) {
  Impl& m = *impl_;
  const auto t0 = engine::Clock::now();
  if (m.saver && m.saver->in_flight) HSDP_RETURN_IF_ERROR(waitForSave().status());
  Status local = m.checkIdle("save");
  if (local.ok() && root.empty()) local = invalidArgument("save: empty checkpoint root");
  if (local.ok() && options.keep_last < 0)
    local = invalidArgument("save: keep_last=", options.keep_last, " must be >= 0");
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
  const std::vector<ckpt::TensorDesc> tensors = ckpt::tensorList(m.unitDescs());
  s.sources.assign(s.plan.chunks.size(), nullptr);
  bool any_host = false;
  for (size_t i = 0; i < s.plan.chunks.size() && snap.ok(); ++i) {
    const ckpt::PlannedChunk& c = s.plan.chunks[i];
    Unit& u = m.units[tensors[c.tensor].unit];
    const ckpt::State state = tensors[c.tensor].state;
    const size_t rel = c.flat - static_cast<size_t>(k) * u.layout.shardNumel();
    const bool offloaded = m.stagedOffload() && !u.frozen;  // the master's host copy
    const float* src = state == ckpt::State::kParam && !offloaded ? m.master(u)
                       : state == ckpt::State::kParam             ? u.host_master.as<float>()
                       : state == ckpt::State::kExpAvg            ? u.exp_avg.as<float>()
                                                                  : u.exp_avg_sq.as<float>();
    if (offloaded || !m.onDevice()) {
      s.sources[i] = reinterpret_cast<const char*>(src + rel);
      any_host = true;
    } else {
      snap = m.space->startSnapshot(*s.pinned, s.snapshot.as<char>() + c.offset, src + rel,
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
    man.units = m.unitDescs();
    man.mesh = m.meshDesc();
    const AdamConfig& a = m.cfg.adam;
    man.optim = {optimizerName(a.kind), a.lr,           a.beta1, a.beta2, a.eps,
                 a.weight_decay,        m.cfg.clip_norm};
    man.tensors = ckpt::tensorList(man.units);
    for (int w = 0; w < job.world; ++w) {
      const MeshCoords c = meshCoords(m.mesh->layout(), m.mesh->shape(), w);
      const int kw = m.shards == 1 ? 0 : c.shard_rank;
      man.files.push_back({ckpt::dataFileName(w), w, kw, c.replica_rank, 0, 0});
      job.plans.push_back(
          ckpt::planFile(man.units, m.shards, m.pieceReplicas(), kw, c.replica_rank));
    }
    for (const auto& kv : options.user) job.user.push_back(kv);
  }
  s.result = SaveResult();
  s.result.dir = root + "/" + name;
  s.result.step = m.step;
  s.result.snapshot_seconds = std::chrono::duration<double>(engine::Clock::now() - t0).count();
  s.status = okStatus();
  s.in_flight = true;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.ready = 0;
    s.copied = !any_host;
  }
  s.writer = std::thread(engine::runWriter, &s);
  return okStatus();
}

Status ShardedModel::Impl::waitForSnapshot() {
  if (!saver || !saver->in_flight) return okStatus();
  engine::Saver& s = *saver;
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.copied) return okStatus();
  // The copier reads the state for the save in flight: it must not change before.
  watchdog::WaitScope wait("checkpoint snapshot", s.result.dir);
  s.cv.wait(lock, [&] { return s.copied; });
  return okStatus();
}

StatusOr<SaveResult> ShardedModel::waitForSave() {
  Impl& m = *impl_;
  if (!m.saver || !m.saver->in_flight) return failedPrecondition("waitForSave: no save in flight");
  engine::Saver& s = *m.saver;
  // The join waits for this rank's write (and on rank 0 the commit, bounded by
  // SaveOptions::commit_timeout_s); the agreement below is a world collective. Both are a wait
  // the watchdog times, so a rank stopped during a save is named like in any other wait.
  watchdog::WaitScope wait("save", s.result.dir);
  s.writer.join();
  s.in_flight = false;
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
  HSDP_RETURN_IF_ERROR(
      m.space->allGatherHost(m.mesh->world(), &mine, all.data(), 1, DType::kInt64));
  s.result.bytes = 0;
  for (uint64_t b : all) s.result.bytes += b;
  HSDP_INFO(kShard, "checkpoint ", s.result.dir, " committed: ", s.result.bytes, " bytes in ",
            s.result.seconds, " s");
  return s.result;
}

bool ShardedModel::saveInFlight() const { return impl_->saver && impl_->saver->in_flight; }

StatusOr<SaveResult> ShardedModel::save(const std::string& root, const SaveOptions& options) {
  HSDP_RETURN_IF_ERROR(saveAsync(root, options));
  return waitForSave();
}

}  // namespace hsdp
