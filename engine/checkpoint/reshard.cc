// hsdp-ckpt reshard: a checkpoint rewritten for another mesh without starting that job. The
// output is what a save on that mesh writes (format.h: planFile), so loading it there reads each
// rank's own chunks only, and it is byte for byte the data a load there followed by a save
// would write. Streaming: the traversal goes unit by unit, state by state, through the output
// pieces in element order, so every output file is appended sequentially and every input chunk
// is read front to back (its xxh64 checked as the last byte goes by); memory is one chunk.
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "engine/checkpoint/io.h"
#include "hsdp/checkpoint.h"
#include "hsdp/mesh.h"
#include "hsdp/topology.h"

namespace hsdp {

using namespace ckpt;

namespace {

// Reads a tensor's elements front to back, hashing every input chunk as it goes.
class StreamingReader {
 public:
  StreamingReader(const Manifest& m, const std::string& dir)
      : m_(m), dir_(dir), files_(m.files.size()), state_(m.tensors.size()) {}
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
      HSDP_ASSIGN_OR_RETURN(const File* f, file(c.file));
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

  StatusOr<const File*> file(int f) {
    if (!files_[f]) {
      HSDP_ASSIGN_OR_RETURN(File opened, openDataFile(m_, dir_, f));
      files_[f] = std::move(opened);
    }
    return &*files_[f];
  }

 private:
  struct Cursor {
    size_t chunk = 0;
    uint64_t done = 0;
    XXH64_state_t* h = nullptr;
  };
  const Manifest& m_;
  std::string dir_;
  std::vector<std::optional<File>> files_;
  std::vector<Cursor> state_;
};

// One output data file, appended in order.
struct OutFile {
  File f;
  uint64_t at = 0;
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
    return okStatus();
  }
};

}  // namespace

Status reshardCheckpoint(const std::string& in, const std::string& out, const MeshTarget& t) {
  HSDP_ASSIGN_OR_RETURN(std::string dir, resolveCheckpointDir(in));
  HSDP_ASSIGN_OR_RETURN(Manifest src, readManifest(dir));
  HSDP_ASSIGN_OR_RETURN(NodeLayout layout, virtualNodeLayout(t.world_size, t.ranks_per_node));
  HSDP_ASSIGN_OR_RETURN(MeshShape shape, resolveMeshShape(layout, {t.intra_shard, t.inter_shard}));
  if (t.mode == ShardMode::kNone && shape.shardGroupSize() != 1)
    return invalidArgument(
        "mode none replicates everything and needs intra_shard=1 and "
        "inter_shard=1 (got ",
        shape.intra_shard, " and ", shape.inter_shard, ")");
  if (pathExists(out)) return invalidArgument("reshard: '", out, "' exists; give a new directory");
  Manifest m = src;
  m.mesh.world_size = shape.world_size;
  m.mesh.num_nodes = shape.num_nodes;
  m.mesh.ranks_per_node = shape.ranks_per_node;
  m.mesh.intra_shard = shape.intra_shard;
  m.mesh.inter_shard = shape.inter_shard;
  m.mesh.shards = t.mode == ShardMode::kNone ? 1 : shape.shardGroupSize();
  m.mesh.replicas = shape.world_size / m.mesh.shards;
  m.mesh.mode = shardModeName(t.mode);
  m.files.clear();
  m.user.clear();
  for (TensorDesc& td : m.tensors) td.chunks.clear();
  const int W = shape.world_size;
  std::vector<FilePlan> plans;
  std::vector<std::pair<int, int>> kr;  // per rank: shard, replica
  for (int w = 0; w < W; ++w) {
    const MeshCoords c = meshCoords(layout, shape, w);
    const int k = m.mesh.shards == 1 ? 0 : c.shard_rank;
    kr.push_back({k, c.replica_rank});
    plans.push_back(planFile(m.units, m.mesh.shards, m.mesh.replicas, k, c.replica_rank));
    m.files.push_back({dataFileName(w), w, k, c.replica_rank, 0, 0});
  }
  const std::string parent = std::filesystem::path(out).parent_path().string();
  const std::string tmp =
      (parent.empty() ? "." : parent) + "/.tmp-" + std::filesystem::path(out).filename().string();
  HSDP_RETURN_IF_ERROR(removeTree(tmp));
  HSDP_RETURN_IF_ERROR(makeDirs(tmp));
  std::vector<OutFile> files(W);
  struct Cleanup {  // before the first state: a failed create leaves none behind
    std::vector<OutFile>& f;
    ~Cleanup() {
      for (OutFile& o : f)
        if (o.h != nullptr) XXH64_freeState(o.h);
    }
  } cleanup{files};
  for (int w = 0; w < W; ++w) {
    HSDP_ASSIGN_OR_RETURN(files[w].f, File::create(tmp + "/" + dataFileName(w)));
    files[w].h = XXH64_createState();
    XXH64_reset(files[w].h, 0);
  }
  // Each rank's next chunk, and the ranks in piece order for every unit.
  std::vector<size_t> next(W, 0);
  StreamingReader reader(src, dir);
  std::vector<float> buf(kChunkElems);
  for (size_t u = 0; u < m.units.size(); ++u) {
    std::vector<int> order(W);
    for (int w = 0; w < W; ++w) order[w] = w;
    const uint64_t numel = m.units[u].numel();
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return pieceOf(numel, m.mesh.shards, m.mesh.replicas, kr[a].first, kr[a].second).begin <
             pieceOf(numel, m.mesh.shards, m.mesh.replicas, kr[b].first, kr[b].second).begin;
    });
    for (int s = 0; s < m.units[u].states(); ++s)
      for (int w : order) {
        // This rank's chunks of (unit u, state s), in its file order.
        while (next[w] < plans[w].chunks.size()) {
          const PlannedChunk& c = plans[w].chunks[next[w]];
          const TensorDesc& td = m.tensors[c.tensor];
          if (td.unit != static_cast<int>(u) || static_cast<int>(td.state) != s) break;
          const int in_t = src.tensorIndex(td.unit, td.param, td.state);
          HSDP_RETURN_IF_ERROR(reader.read(in_t, c.start, c.start + c.count, buf.data()));
          HSDP_RETURN_IF_ERROR(files[w].pad(c.offset));
          HSDP_RETURN_IF_ERROR(files[w].write(buf.data(), c.count * 4));
          m.tensors[c.tensor].chunks.push_back(
              {w, c.offset, c.start, c.count, xxh64(buf.data(), c.count * 4)});
          ++next[w];
        }
      }
  }
  // User blobs go after rank 0's data, as a save puts them.
  for (const UserEntry& e : src.user) {
    HSDP_ASSIGN_OR_RETURN(const File* f, reader.file(e.file));
    std::string bytes(e.bytes, '\0');
    HSDP_RETURN_IF_ERROR(f->preadAll(bytes.data(), e.bytes, e.offset));
    if (xxh64(bytes.data(), bytes.size()) != e.xxh64)
      return invalidArgument("data file '", f->path(), "': user entry '", e.key,
                             "' fails its xxh64 checksum");
    HSDP_RETURN_IF_ERROR(files[0].pad(alignUp(files[0].at)));
    m.user.push_back({e.key, 0, files[0].at, e.bytes, e.xxh64});
    HSDP_RETURN_IF_ERROR(files[0].write(bytes.data(), bytes.size()));
  }
  for (int w = 0; w < W; ++w) {
    m.files[w].bytes = files[w].at;
    m.files[w].xxh64 = XXH64_digest(files[w].h);
    HSDP_RETURN_IF_ERROR(files[w].f.sync());
    HSDP_RETURN_IF_ERROR(files[w].f.close());
  }
  for (TensorDesc& td : m.tensors)
    std::sort(td.chunks.begin(), td.chunks.end(),
              [](const Chunk& a, const Chunk& b) { return a.start < b.start; });
  HSDP_RETURN_IF_ERROR(m.finish(out));
  HSDP_RETURN_IF_ERROR(replaceFileAtomically(tmp + "/" + kManifestName, serializeManifest(m)));
  HSDP_RETURN_IF_ERROR(renameDirIntoPlace(tmp, out));
  return syncDir(parent.empty() ? "." : parent);
}

}  // namespace hsdp
