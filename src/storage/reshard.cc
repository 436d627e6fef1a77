// hsdp-ckpt reshard: a checkpoint rewritten for another mesh without starting that job. The
// output is what a save on that mesh writes (format.h: planFile), so loading it there reads each
// rank's own chunks only, and it is byte for byte the data a load there followed by a save
// would write. Streaming: the traversal goes unit by unit, state by state, through the output
// pieces in element order, so every output file is appended sequentially and every input chunk
// is read front to back (its xxh64 checked as the last byte goes by). Two threads, a pipeline:
// the reader reads and verifies chunk i+1.. while the writer writes and hashes chunk i, through
// a ring of kSlots chunk buffers (memory: kSlots chunks); the kernel is told to read the inputs
// ahead and to start writing the outputs back as they grow, so the disk works meanwhile.
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "hsdp/checkpoint_offline.h"
#include "hsdp/mesh_shape.h"
#include "storage/io.h"
#include "storage/offline.h"

namespace hsdp {

using namespace ckpt;

namespace {

// Reads a tensor's elements front to back, hashing every input chunk as it goes.
class StreamingReader {
 public:
  StreamingReader(const Manifest& m, const std::string& dir)
      : m_(m),
        files_(dataFiles(m, dir, /*direct=*/false, /*sequential=*/true)),
        state_(m.tensors.size()) {}
  ~StreamingReader() {
    for (Cursor& c : state_)
      if (c.h) XXH64_freeState(c.h);
  }

  Status read(int t, uint64_t begin, uint64_t end, float* dst) {
    const std::vector<Chunk>& chunks = m_.tensors[t].chunks;
    Cursor& cur = state_[t];
    while (begin < end) {
      if (cur.chunk >= chunks.size()) return internalError("reshard: read past tensor ", t);
      const Chunk& c = chunks[cur.chunk];
      if (begin != c.start + cur.done) return internalError("reshard: out-of-order read");
      const uint64_t n = std::min(end - begin, c.count - cur.done);
      HSDP_ASSIGN_OR_RETURN(std::shared_ptr<const File> f, files_.get(c.file));
      HSDP_RETURN_IF_ERROR(f->preadAll(dst, n * 4, c.offset + cur.done * 4));
      if (!cur.h) cur.h = XXH64_createState();
      if (cur.done == 0) XXH64_reset(cur.h, 0);
      XXH64_update(cur.h, dst, n * 4);
      cur.done += n;
      if (cur.done == c.count) {
        if (XXH64_digest(cur.h) != c.xxh64)
          return invalidArgument("data file '", f->path(), "': bytes [", c.offset, ", ",
                                 c.offset + c.count * 4, ") of tensor ", tensorName(m_, t),
                                 " fail their xxh64 checksum (corrupt file)");
        ++cur.chunk;
        cur.done = 0;
      }
      begin += n;
      dst += n;
    }
    return okStatus();
  }

  StatusOr<std::shared_ptr<const File>> file(int f) { return files_.get(f); }

 private:
  struct Cursor {
    size_t chunk = 0;
    uint64_t done = 0;
    XXH64_state_t* h = nullptr;
  };
  const Manifest& m_;
  files::FileCache files_;  // read front to back: the kernel reads ahead while the pipeline works
  std::vector<Cursor> state_;
};

// One output data file, appended in order. Open only while it is among the most recently written
// (OutFiles): a reshard to any number of ranks stays under the open-file limit.
struct OutFile {
  static constexpr uint64_t kWriteback = uint64_t{16} << 20;
  File f;
  uint64_t at = 0;
  uint64_t flushed = 0;  // written back from here on: startWriteback every kWriteback bytes
  XXH64_state_t* h = nullptr;
  Status pad(uint64_t to) {
    static const char zeros[4096] = {};
    while (at < to) {
      const uint64_t n = std::min<uint64_t>(sizeof zeros, to - at);
      HSDP_RETURN_IF_ERROR(f.writeAll(zeros, n));
      XXH64_update(h, zeros, n);
      at += n;
    }
    return okStatus();
  }
  Status write(const void* p, uint64_t n) {
    HSDP_RETURN_IF_ERROR(f.writeAll(p, n));
    XXH64_update(h, p, n);
    at += n;
    if (at - flushed >= kWriteback) {
      files::startWriteback(f, flushed, at - flushed);
      flushed = at;
    }
    return okStatus();
  }
};

// The output files: at most files::openFileBudget() open; the least recently opened one is closed
// to make room (not fsynced: finish() fsyncs every file once, through a descriptor of the same
// inode) and reopened at its end when written again.
class OutFiles {
 public:
  OutFiles(const Dir& dir, int n) : dir_(dir), files_(n), budget_(files::openFileBudget()) {}
  ~OutFiles() {
    for (OutFile& o : files_)
      if (o.h != nullptr) XXH64_freeState(o.h);
  }
  OutFile& operator[](int w) { return files_[w]; }
  // File w, open for appending.
  StatusOr<OutFile*> get(int w) {
    OutFile& o = files_[w];
    if (o.f.isOpen()) return &o;
    if (open_.size() >= budget_) {
      OutFile& victim = files_[open_.front()];
      open_.erase(open_.begin());
      HSDP_RETURN_IF_ERROR(victim.f.close());
    }
    if (o.h == nullptr) {
      HSDP_ASSIGN_OR_RETURN(o.f, File::createNewAt(dir_, dataFileName(w)));
      o.h = XXH64_createState();
      XXH64_reset(o.h, 0);
    } else {
      HSDP_ASSIGN_OR_RETURN(o.f, File::openWriteAt(dir_, dataFileName(w), o.at));
    }
    open_.push_back(w);
    return &o;
  }
  // Every file synced and closed.
  Status finish(OfflineTicker& ticker) {
    for (int w = 0; w < static_cast<int>(files_.size()); ++w) {
      HSDP_RETURN_IF_ERROR(ticker.tick(w));
      HSDP_ASSIGN_OR_RETURN(OutFile * o, get(w));
      HSDP_RETURN_IF_ERROR(o->f.sync());
      HSDP_RETURN_IF_ERROR(o->f.close());
      open_.erase(std::find(open_.begin(), open_.end(), w));
    }
    return okStatus();
  }

 private:
  const Dir& dir_;
  std::vector<OutFile> files_;
  std::vector<int> open_;  // open files, least recently opened first
  size_t budget_;
};

}  // namespace

Status reshardCheckpoint(const std::string& in, const std::string& out, const MeshTarget& t) {
  HSDP_ASSIGN_OR_RETURN(std::string dir, resolveCheckpointDir(in));
  HSDP_ASSIGN_OR_RETURN(Manifest src, readManifest(dir));
  HSDP_RETURN_IF_ERROR(refuseSemiSync(src, dir, "reshard"));
  // The ranks as consecutive nodes of ranks_per_node, as a job under HSDP_RANKS_PER_NODE.
  HSDP_RETURN_IF_ERROR(checkConsecutiveNodes(t.world_size, t.ranks_per_node));
  const int rpn = t.ranks_per_node;
  HSDP_ASSIGN_OR_RETURN(MeshShape shape, meshShapeOf(t.world_size, t.world_size / rpn, rpn,
                                                     t.intra_shard, t.inter_shard));
  if (t.mode == ShardMode::kNone && shape.shardGroupSize() != 1)
    return invalidArgument(
        "mode none replicates everything and needs intra_shard=1 and "
        "inter_shard=1 (got ",
        shape.intra_shard, " and ", shape.inter_shard, ")");
  // The output: a new directory, not a link, device or existing directory, never the input.
  HSDP_RETURN_IF_ERROR(
      files::checkOutputTarget(out, {.directory = true}, {dir, in}).withContext("reshard"));
  HSDP_ASSIGN_OR_RETURN(files::PathParts out_parts, files::splitPath(out));
  Manifest m = src;
  m.saved.mesh = shape;
  m.saved.shards = t.mode == ShardMode::kNone ? 1 : shape.shardGroupSize();
  m.saved.replicas = shape.world_size / m.saved.shards;
  m.saved.mode = shardModeName(t.mode);
  m.files.clear();
  m.user.clear();
  for (TensorDesc& td : m.tensors) td.chunks.clear();
  const int W = shape.world_size;
  std::vector<FilePlan> plans;
  std::vector<std::pair<int, int>> kr;  // per rank: shard, replica
  // Progress and stops (hsdp-ckpt: a line on a terminal; SIGINT/SIGTERM end the reshard here,
  // the guard below removing the temporary output).
  const std::string left =
      strCat(files::quote(out), " is not created; the temporary output is removed");
  OfflineTicker planning("planning", "ranks", static_cast<uint64_t>(W), left);
  for (int w = 0; w < W; ++w) {
    if (w % 1024 == 0) HSDP_RETURN_IF_ERROR(planning.tick(w));
    const MeshCoords c = meshCoords(shape, w, w / rpn, w % rpn);
    const int k = m.saved.shards == 1 ? 0 : c.shard_rank;
    kr.push_back({k, c.replica_rank});
    plans.push_back(planFile(m.units, m.saved.shards, m.saved.replicas, k, c.replica_rank));
    m.files.push_back({dataFileName(w), w, k, c.replica_rank, 0, 0});
  }
  // Written beside the target under this job's temporary name, renamed into place at the end;
  // on any failure the guard removes it (nothing half-written is left).
  HSDP_ASSIGN_OR_RETURN(Dir parent, Dir::open(out_parts.dir));
  const std::string tmp_name = files::tempName(out_parts.name);
  HSDP_RETURN_IF_ERROR(parent.removeTree(tmp_name));  // this job's own leftover only
  HSDP_RETURN_IF_ERROR(parent.makeDir(tmp_name));
  files::TempGuard guard(parent, tmp_name);
  HSDP_ASSIGN_OR_RETURN(Dir tmp, Dir::openAt(parent, tmp_name));
  OutFiles files(tmp, W);
  // The copies, in the order the traversal takes them: unit by unit, state by state, the ranks
  // in piece order, each rank's chunks of (unit, state) in its file order.
  struct Copy {
    int w, in_t, out_t;
    uint64_t start, count, offset;
  };
  std::vector<Copy> copies;
  std::vector<size_t> next(W, 0);
  for (size_t u = 0; u < m.units.size(); ++u) {
    std::vector<int> order(W);
    for (int w = 0; w < W; ++w) order[w] = w;
    const uint64_t numel = m.units[u].numel();
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return pieceOf(numel, m.saved.shards, m.saved.replicas, kr[a].first, kr[a].second).begin <
             pieceOf(numel, m.saved.shards, m.saved.replicas, kr[b].first, kr[b].second).begin;
    });
    for (int s = 0; s < m.units[u].states(); ++s)
      for (int w : order)
        for (; next[w] < plans[w].chunks.size(); ++next[w]) {
          const PlannedChunk& c = plans[w].chunks[next[w]];
          const TensorDesc& td = m.tensors[c.tensor];
          if (td.unit != static_cast<int>(u) || static_cast<int>(td.state) != s) break;
          copies.push_back({w, src.tensorIndex(td.unit, td.param, td.state), c.tensor, c.start,
                            c.count, c.offset});
        }
  }
  StreamingReader reader(src, dir);
  uint64_t copy_bytes = 0;
  for (const Copy& c : copies) copy_bytes += c.count * 4;
  OfflineTicker copying("copying", "bytes", copy_bytes, left);
  {
    // The reader thread fills slot i % kSlots with copy i; this thread writes it out and hands
    // the slot back. `read` counts the copies read, `written` those written (each owned by its
    // thread, read by the other under the mutex); a failure on either side stops both.
    constexpr size_t kSlots = 4;
    std::vector<std::vector<float>> slots(kSlots, std::vector<float>(kChunkElems));
    std::mutex mu;
    std::condition_variable cv;
    size_t read = 0, written = 0;
    bool stop = false;
    Status read_status;
    std::thread reader_thread([&] {
      for (size_t i = 0; i < copies.size(); ++i) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || i - written < kSlots; });
          if (stop) return;
        }
        const Copy& c = copies[i];
        Status st = reader.read(c.in_t, c.start, c.start + c.count, slots[i % kSlots].data());
        std::lock_guard<std::mutex> lock(mu);
        if (!st.ok()) {
          read_status = std::move(st);
          stop = true;
          cv.notify_all();
          return;
        }
        ++read;
        cv.notify_all();
      }
    });
    Status write_status = [&]() -> Status {
      for (size_t i = 0; i < copies.size(); ++i) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || read > i; });
          if (read <= i) return okStatus();  // the reader failed: its status says why
        }
        const Copy& c = copies[i];
        const float* data = slots[i % kSlots].data();
        HSDP_ASSIGN_OR_RETURN(OutFile * o, files.get(c.w));
        HSDP_RETURN_IF_ERROR(o->pad(c.offset));
        HSDP_RETURN_IF_ERROR(o->write(data, c.count * 4));
        m.tensors[c.out_t].chunks.push_back(
            {c.w, c.offset, c.start, c.count, xxh64(data, c.count * 4)});
        HSDP_RETURN_IF_ERROR(copying.add(c.count * 4));
        std::lock_guard<std::mutex> lock(mu);
        ++written;
        cv.notify_all();
      }
      return okStatus();
    }();
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
      cv.notify_all();
    }
    reader_thread.join();
    HSDP_RETURN_IF_ERROR(read_status);
    HSDP_RETURN_IF_ERROR(write_status);
  }
  // User blobs go after rank 0's data, as a save puts them.
  for (const UserEntry& e : src.user) {
    HSDP_ASSIGN_OR_RETURN(std::shared_ptr<const File> f, reader.file(e.file));
    HSDP_RETURN_IF_ERROR(
        checkFitsInMemory(e.bytes, strCat("user entry '", files::quote(e.key), "'")));
    std::string bytes(e.bytes, '\0');
    HSDP_RETURN_IF_ERROR(f->preadAll(bytes.data(), e.bytes, e.offset));
    if (xxh64(bytes.data(), bytes.size()) != e.xxh64)
      return invalidArgument("data file '", f->path(), "': user entry '", files::quote(e.key),
                             "' fails its xxh64 checksum");
    HSDP_ASSIGN_OR_RETURN(OutFile * o, files.get(0));
    HSDP_RETURN_IF_ERROR(o->pad(alignUp(o->at)));
    m.user.push_back({e.key, 0, o->at, e.bytes, e.xxh64});
    HSDP_RETURN_IF_ERROR(o->write(bytes.data(), bytes.size()));
  }
  OfflineTicker writing("writing files", "files", static_cast<uint64_t>(W), left);
  HSDP_RETURN_IF_ERROR(files.finish(writing));
  for (int w = 0; w < W; ++w) {
    m.files[w].bytes = files[w].at;
    m.files[w].xxh64 = XXH64_digest(files[w].h);
  }
  for (TensorDesc& td : m.tensors)
    std::sort(td.chunks.begin(), td.chunks.end(),
              [](const Chunk& a, const Chunk& b) { return a.start < b.start; });
  HSDP_RETURN_IF_ERROR(m.finish(out));
  HSDP_RETURN_IF_ERROR(tmp.replaceFile(kManifestName, serializeManifest(m)));
  HSDP_RETURN_IF_ERROR(parent.rename(tmp_name, out_parts.name, Dir::Rename::kNoReplace));
  guard.release();
  return parent.sync();
}

}  // namespace hsdp
