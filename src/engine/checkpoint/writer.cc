// The checkpoint writer thread (saver.h): this rank's data file, copied and hashed from the
// snapshot as the copier hands it over, written (O_DIRECT where it can) and fsynced; its part file
// beside it; and on rank 0 the commit: every part collected, manifest.json written last, the
// directory renamed into place, `latest` replaced, old steps pruned. No MPI here (save.cc says
// why): the writers coordinate through the directory.
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

#include "core/files_internal.h"
#include "core/json.h"
#include "engine/checkpoint/saver.h"
#include "hsdp/files.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"
#include "storage/format.h"
#include "storage/io.h"

namespace hsdp {
namespace engine {

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

}  // namespace

std::string utcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm;
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

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
    // Copying -> Writing, once (a listed move: it cannot fail).
    if (copied && s.state == SaveState::kCopying)
      (void)transition(s.state, SaveState::kWriting, "checkpoint copier");
    s.cv.notify_all();
  };
  size_t last_copy = 0;  // one past the last chunk the copier copies
  for (size_t i = 0; i < plan.chunks.size(); ++i)
    if (s.sources[i] != nullptr) last_copy = i + 1;
  Status st = s.copies->finishSnapshot(*s.pinned);
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
                        files::createNewAt(tmp, ckpt::dataFileName(job.rank), s.direct_io));
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
        ready == s.plan.bytes ? ready : ready / files::kDirectAlign * files::kDirectAlign;
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
  StatusOr<nlohmann::json> parsed = hsdp::parseJson(text, path);
  if (!parsed.ok() || !parsed->is_object())
    return internalError("unreadable part file ", path,
                         parsed.ok() ? std::string() : ": " + parsed.status().message());
  nlohmann::json p = std::move(*parsed);
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
  // Elastic: a writer stopped mid-save (SIGSTOP, a cut link) may commit after the next writer
  // committed a later step into the same root; `latest` never goes back to an earlier step.
  if (!m.saved.elastic_job.empty()) {
    StatusOr<std::string> cur = ckpt::resolveCheckpointDir(job.root);
    StatusOr<ckpt::Manifest> newest =
        cur.ok() ? ckpt::readManifest(*cur) : StatusOr<ckpt::Manifest>(cur.status());
    if (newest.ok() && newest->step > job.step) {
      HSDP_WARN(kShard, "checkpoint ", job.name, " committed; `latest` stays ", *cur,
                " (a later step, written by the writer that followed this one)");
      return okStatus();
    }
  }
  HSDP_RETURN_IF_ERROR(root.replaceFile(ckpt::kLatestName, job.name + "\n"));
  if (job.keep_last > 0) HSDP_RETURN_IF_ERROR(prune(root, job.keep_last, job.name));
  return okStatus();
}

}  // namespace

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

}  // namespace engine
}  // namespace hsdp
