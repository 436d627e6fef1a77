#include "storage/io.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <thread>

namespace hsdp::ckpt {

bool isStepName(const std::string& name) {
  return name.size() > 5 && name.compare(0, 5, "step-") == 0 &&
         name.find_first_not_of("0123456789", 5) == std::string::npos;
}

uint64_t xxh64(const void* data, size_t bytes) { return XXH64(data, bytes, 0); }

Status checkFitsInMemory(uint64_t bytes, const std::string& what) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  const uint64_t mem = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page : 0;
  if (mem == 0 || bytes <= mem) return okStatus();
  return Status(StatusCode::kResourceExhausted,
                strCat(files::quote(what), " needs ", bytes, " bytes, more than this machine's ",
                       mem, " bytes of memory (a manifest whose sizes do not fit its data)"));
}

StatusOr<std::string> resolveCheckpointDir(const std::string& path) {
  using files::Kind;
  using files::quote;
  if (path.empty()) return invalidArgument("empty checkpoint path");
  const Kind k = files::kindOf(path);
  if (k == Kind::kMissing)
    return notFound("no checkpoint at '", quote(path), "': no such file or directory");
  // The pointer file itself ("<root>/latest") names a checkpoint beside it.
  std::string root = path, pointer = kLatestName;
  if (k != Kind::kDirectory && !(k == Kind::kSymlink && files::Dir::open(path).ok())) {
    HSDP_ASSIGN_OR_RETURN(files::PathParts parts, files::splitPath(path));
    if (parts.name != kLatestName)
      return invalidArgument("'", quote(path), "' is ", files::kindName(k),
                             ", not a checkpoint directory or its '", kLatestName, "' pointer");
    root = parts.dir;
    pointer = parts.name;
  }
  HSDP_ASSIGN_OR_RETURN(Dir dir, Dir::open(root));
  if (root == path && dir.kindOf(kManifestName) != Kind::kMissing) return path;
  if (dir.kindOf(pointer) == Kind::kMissing)
    return notFound("'", quote(path), "' has no ", kManifestName,
                    " (not a committed checkpoint) and no '", kLatestName, "' pointer");
  HSDP_ASSIGN_OR_RETURN(std::string name,
                        dir.readFile(pointer, kMaxPointerBytes, "checkpoint pointer"));
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const bool printable = std::all_of(name.begin(), name.end(), [](char c) {
    return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
  });
  if (name.empty() || !printable || name.find('/') != std::string::npos || name[0] == '.')
    return invalidArgument("'", quote(dir.join(pointer)), "' does not name a checkpoint directory ",
                           "(it holds '", quote(name, 64), "')");
  return dir.join(name);
}

std::string tensorName(const Manifest& m, int t) {
  const TensorDesc& d = m.tensors[t];
  std::string s = joinedName(m.units[d.unit].name, m.units[d.unit].params[d.param].name);
  if (d.state != State::kParam) s += strCat(" (", stateName(d.state), ")");
  return s;
}

StatusOr<File> openDataFile(const Manifest& m, const Dir& dir, int f, bool direct) {
  StatusOr<File> opened = files::openReadAt(dir, m.files[f].name, direct);
  if (!opened.ok())
    return Status(opened.status().code(),
                  strCat("data file missing or unreadable: ", opened.status().message()));
  HSDP_ASSIGN_OR_RETURN(uint64_t size, opened->size());
  if (size != m.files[f].bytes)
    return invalidArgument("data file '", files::quote(opened->path()), "' is ", size,
                           " bytes, the manifest says ", m.files[f].bytes,
                           " (truncated or replaced)");
  return opened;
}

files::FileCache dataFiles(const Manifest& m, std::string dir, bool direct, bool sequential) {
  auto opened = std::make_shared<std::optional<StatusOr<Dir>>>();  // on first use
  return files::FileCache(
      files::openFileBudget(),
      [&m, dir = std::move(dir), direct, sequential, opened](int f) -> StatusOr<File> {
        if (f < 0 || static_cast<size_t>(f) >= m.files.size())
          return invalidArgument("data file index ", f, " out of range");
        if (!*opened) *opened = Dir::open(dir);
        const StatusOr<Dir>& d = **opened;
        if (!d.ok()) return d.status();
        HSDP_ASSIGN_OR_RETURN(File file, openDataFile(m, *d, f, direct));
        if (sequential) {
          // Read front to back, all of it: the kernel reads ahead while the reader works.
          files::adviseSequential(file);
          files::willNeed(file, 0, 0);
        }
        return file;
      });
}

namespace {
// The first chunk that ends after element `begin` (chunks are sorted and tile the tensor).
std::vector<Chunk>::const_iterator firstChunkEndingAfter(const std::vector<Chunk>& chunks,
                                                         uint64_t begin) {
  return std::upper_bound(chunks.begin(), chunks.end(), begin,
                          [](uint64_t v, const Chunk& c) { return v < c.start + c.count; });
}
}  // namespace

Status TensorReader::read(int t, uint64_t begin, uint64_t end, float* dst) {
  if (begin >= end) return okStatus();
  const std::vector<Chunk>& chunks = m_.tensors[t].chunks;
  auto it = firstChunkEndingAfter(chunks, begin);
  for (; it != chunks.end() && it->start < end; ++it) {
    const Chunk& c = *it;
    HSDP_ASSIGN_OR_RETURN(std::shared_ptr<const File> f, files_.get(c.file));
    const uint64_t b = std::max(begin, c.start), e = std::min(end, c.start + c.count);
    if (!verify_) {
      HSDP_RETURN_IF_ERROR(f->preadAll(dst + (b - begin), (e - b) * sizeof(float),
                                       c.offset + (b - c.start) * sizeof(float)));
      bytes_read_ += (e - b) * sizeof(float);
      continue;
    }
    // A whole chunk is read and checked in place (a load into the same mesh reads only whole
    // chunks); a part of one goes through buf_.
    const bool whole = b == c.start && e == c.start + c.count;
    float* to = whole ? dst + (b - begin) : nullptr;
    if (!whole) {
      buf_.resize(c.count);
      to = buf_.data();
    }
    HSDP_RETURN_IF_ERROR(f->preadAll(to, c.count * sizeof(float), c.offset));
    bytes_read_ += c.count * sizeof(float);
    HSDP_RETURN_IF_ERROR(checkChunk(t, c, *f, to));
    if (!whole) std::memcpy(dst + (b - begin), to + (b - c.start), (e - b) * sizeof(float));
  }
  return okStatus();
}

Status TensorReader::checkChunk(int t, const Chunk& c, const File& f, const float* data) const {
  if (xxh64(data, c.count * sizeof(float)) == c.xxh64) return okStatus();
  return invalidArgument("data file '", files::quote(f.path()), "': bytes [", c.offset, ", ",
                         c.offset + c.count * 4, ") of tensor ", tensorName(m_, t),
                         " fail their xxh64 checksum (corrupt file)");
}

// A request cut at a chunk: a whole chunk lands in place (with verify: fetched on the second
// thread), a part of one goes through read().
struct TensorReader::Piece {
  int t;
  const Chunk* c;
  std::shared_ptr<const File> f;  // held open while the batch runs
  uint64_t begin, end;            // elements of the tensor
  float* dst;
  bool fetched;  // a whole chunk read by the fetcher
};

Status TensorReader::readMany(const std::vector<Request>& requests) {
  // Every request cut at the chunks it touches, in order, in batches that hold at most half the
  // open-file budget (the other half serves read()'s partial chunks); each batch's files are
  // told what comes.
  const size_t max_files = std::max<size_t>(1, files_.capacity() / 2);
  std::vector<Piece> pieces;
  std::vector<size_t> whole;  // indices into pieces of the fetched ones
  std::vector<int> batch_files;
  for (const Request& r : requests) {
    const std::vector<Chunk>& chunks = m_.tensors[r.t].chunks;
    for (auto it = firstChunkEndingAfter(chunks, r.begin); it != chunks.end() && it->start < r.end;
         ++it) {
      if (std::find(batch_files.begin(), batch_files.end(), it->file) == batch_files.end()) {
        if (batch_files.size() == max_files) {
          HSDP_RETURN_IF_ERROR(readPieces(pieces, whole));
          pieces.clear();
          whole.clear();
          batch_files.clear();
        }
        batch_files.push_back(it->file);
      }
      HSDP_ASSIGN_OR_RETURN(std::shared_ptr<const File> f, files_.get(it->file));
      const uint64_t b = std::max(r.begin, it->start), e = std::min(r.end, it->start + it->count);
      const bool w = verify_ && b == it->start && e == it->start + it->count;
      if (w) whole.push_back(pieces.size());
      if (!files::isDirect(*f))
        files::willNeed(*f, it->offset + (b - it->start) * sizeof(float), (e - b) * sizeof(float));
      pieces.push_back({r.t, &*it, std::move(f), b, e, r.dst + (b - r.begin), w});
    }
  }
  return readPieces(pieces, whole);
}

Status TensorReader::readPieces(const std::vector<Piece>& pieces,
                                const std::vector<size_t>& whole) {
  if (whole.size() < 2) {
    for (const Piece& p : pieces) HSDP_RETURN_IF_ERROR(read(p.t, p.begin, p.end, p.dst));
    return okStatus();
  }
  // The fetcher reads whole[i] and publishes i + 1 in `fetched` (release: the bytes and its
  // status are visible to whoever sees the count); `stop` ends it early on a failure here.
  std::vector<Status> fetch_status(whole.size());
  std::atomic<size_t> fetched{0};
  std::atomic<bool> stop{false};
  std::thread fetcher([&] {
    for (size_t i = 0; i < whole.size() && !stop.load(std::memory_order_relaxed); ++i) {
      const Piece& w = pieces[whole[i]];
      fetch_status[i] = w.f->preadAll(w.dst, w.c->count * sizeof(float), w.c->offset);
      fetched.store(i + 1, std::memory_order_release);
      fetched.notify_one();
      if (!fetch_status[i].ok()) break;
    }
    fetched.store(whole.size() + 1, std::memory_order_release);  // done, whatever happened
    fetched.notify_one();
  });
  Status result;
  size_t next = 0;  // the next fetched chunk to check
  for (size_t i = 0; i < pieces.size() && result.ok(); ++i) {
    const Piece& p = pieces[i];
    if (!p.fetched) {
      result = read(p.t, p.begin, p.end, p.dst);
      continue;
    }
    size_t seen;
    while ((seen = fetched.load(std::memory_order_acquire)) <= next) fetched.wait(seen);
    result = fetch_status[next++];
    if (result.ok()) result = checkChunk(p.t, *p.c, *p.f, p.dst);
    bytes_read_ += p.c->count * sizeof(float);
  }
  stop.store(true, std::memory_order_relaxed);
  fetcher.join();
  return result;
}

void TensorReader::willRead(int t, uint64_t begin, uint64_t end) {
  const std::vector<Chunk>& chunks = m_.tensors[t].chunks;
  auto it = firstChunkEndingAfter(chunks, begin);
  for (; it != chunks.end() && it->start < end; ++it) {
    const Chunk& c = *it;
    StatusOr<std::shared_ptr<const File>> f = files_.get(c.file);
    if (!f.ok()) return;
    // Read-ahead fills the page cache, which a direct read would then read around: twice the
    // disk's work. (A read that cannot go direct then waits for the disk, chunk by chunk.)
    if (files::isDirect(**f)) continue;
    const uint64_t b = verify_ ? c.start : std::max(begin, c.start);
    const uint64_t e = verify_ ? c.start + c.count : std::min(end, c.start + c.count);
    files::willNeed(**f, c.offset + (b - c.start) * sizeof(float), (e - b) * sizeof(float));
  }
}

Status TensorReader::readUser(const UserEntry& e, std::string* out) {
  HSDP_ASSIGN_OR_RETURN(std::shared_ptr<const File> f, files_.get(e.file));
  HSDP_RETURN_IF_ERROR(
      checkFitsInMemory(e.bytes, strCat("user entry '", files::quote(e.key), "'")));
  out->resize(e.bytes);
  HSDP_RETURN_IF_ERROR(f->preadAll(out->data(), e.bytes, e.offset));
  if (xxh64(out->data(), e.bytes) != e.xxh64)
    return invalidArgument("data file '", files::quote(f->path()), "': user entry '",
                           files::quote(e.key), "' (bytes [", e.offset, ", ", e.offset + e.bytes,
                           ")) fails its xxh64 checksum");
  return okStatus();
}

}  // namespace hsdp::ckpt
