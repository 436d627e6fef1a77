#include "engine/checkpoint/io.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

namespace hsdp::ckpt {
namespace {
// A path that can never work (no permission, read-only, not a directory) is bad input; a full
// disk or an I/O error is a failure of the run.
Status errnoStatus(const char* what, const std::string& path, int err) {
  const bool bad_input = err == EACCES || err == EPERM || err == EROFS || err == ENOTDIR ||
                         err == EISDIR || err == ENOENT || err == ENAMETOOLONG;
  return Status(bad_input ? StatusCode::kInvalidArgument : StatusCode::kInternal,
                strCat(what, " '", path, "': ", std::strerror(err)));
}
}  // namespace

StatusOr<File> File::openRead(const std::string& path, bool direct) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return notFound("cannot open '", path, "': ", std::strerror(e));
    return errnoStatus("cannot open", path, e);
  }
  File f(fd, path);
  if (direct) f.openDirect(O_RDONLY);
  return f;
}

StatusOr<File> File::create(const std::string& path, bool direct) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errnoStatus("cannot create", path, errno);
  File f(fd, path);
  if (direct) f.openDirect(O_WRONLY);
  return f;
}

// A filesystem without O_DIRECT (tmpfs: EINVAL) leaves dfd_ at -1: everything is buffered.
void File::openDirect(int flags) { dfd_ = ::open(path_.c_str(), flags | O_DIRECT | O_CLOEXEC); }

File::~File() {
  if (fd_ >= 0) ::close(fd_);
  if (dfd_ >= 0) ::close(dfd_);
}
File::File(File&& o) noexcept : fd_(o.fd_), dfd_(o.dfd_), pos_(o.pos_), path_(std::move(o.path_)) {
  o.fd_ = o.dfd_ = -1;
}
File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    if (dfd_ >= 0) ::close(dfd_);
    fd_ = o.fd_;
    dfd_ = o.dfd_;
    pos_ = o.pos_;
    path_ = std::move(o.path_);
    o.fd_ = o.dfd_ = -1;
  }
  return *this;
}

namespace {
// [head, head + mid) of (p, bytes, offset) is what direct I/O can take: memory and file offset
// on kDirectAlign boundaries, a whole number of blocks; mid == 0 when p and offset disagree.
struct DirectSplit {
  size_t head, mid;
};
DirectSplit splitDirect(const void* p, size_t bytes, uint64_t offset) {
  if (bytes < kDirectMin || (reinterpret_cast<uintptr_t>(p) - offset) % kDirectAlign != 0)
    return {bytes, 0};
  const size_t head =
      std::min<size_t>(bytes, (kDirectAlign - offset % kDirectAlign) % kDirectAlign);
  return {head, (bytes - head) / kDirectAlign * kDirectAlign};
}
}  // namespace

Status File::pwriteAll(int fd, const char* p, size_t bytes) {
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd, p, std::min<size_t>(bytes, size_t{1} << 30), static_cast<off_t>(pos_));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("writing", path_, errno);
    }
    if (n == 0) return internalError("writing '", path_, "': no progress");
    p += n;
    pos_ += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
    // A short direct write (a file size limit) leaves the rest unaligned: the buffered
    // descriptor writes it, or reports why it cannot.
    if (fd == dfd_ && bytes % kDirectAlign != 0) return pwriteAll(fd_, p, bytes);
  }
  return okStatus();
}

Status File::writeAll(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  DirectSplit d = dfd_ >= 0 ? splitDirect(p, bytes, pos_) : DirectSplit{bytes, 0};
  HSDP_RETURN_IF_ERROR(pwriteAll(fd_, p, d.head));
  if (d.mid > 0) HSDP_RETURN_IF_ERROR(pwriteAll(dfd_, p + d.head, d.mid));
  return pwriteAll(fd_, p + d.head + d.mid, bytes - d.head - d.mid);
}

Status File::preadLoop(int fd, char* p, size_t bytes, uint64_t offset) const {
  while (bytes > 0) {
    ssize_t n = ::pread(fd, p, std::min<size_t>(bytes, size_t{1} << 30), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("reading", path_, errno);
    }
    if (n == 0)
      return invalidArgument("reading '", path_, "': unexpected end of file at byte ", offset,
                             " (truncated)");
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
    // A short direct read (the file ends early) leaves the rest to the buffered descriptor,
    // which reports where the file ends.
    if (fd == dfd_ && bytes % kDirectAlign != 0) return preadLoop(fd_, p, bytes, offset);
  }
  return okStatus();
}

Status File::preadAll(void* data, size_t bytes, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  DirectSplit d = dfd_ >= 0 ? splitDirect(p, bytes, offset) : DirectSplit{bytes, 0};
  HSDP_RETURN_IF_ERROR(preadLoop(fd_, p, d.head, offset));
  if (d.mid > 0) HSDP_RETURN_IF_ERROR(preadLoop(dfd_, p + d.head, d.mid, offset + d.head));
  return preadLoop(fd_, p + d.head + d.mid, bytes - d.head - d.mid, offset + d.head + d.mid);
}

Status File::sync() {
  if (::fsync(fd_) != 0) return errnoStatus("fsync of", path_, errno);
  return okStatus();
}

Status File::close() {
  if (dfd_ >= 0) ::close(dfd_);
  dfd_ = -1;
  int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0) return errnoStatus("closing", path_, errno);
  return okStatus();
}

StatusOr<uint64_t> File::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) return errnoStatus("fstat of", path_, errno);
  return static_cast<uint64_t>(st.st_size);
}

void File::dropCache() const { (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED); }

void File::adviseSequential() const { (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL); }

void File::willNeed(uint64_t offset, uint64_t bytes) const {
  (void)::posix_fadvise(fd_, static_cast<off_t>(offset), static_cast<off_t>(bytes),
                        POSIX_FADV_WILLNEED);
}

void File::startWriteback(uint64_t offset, uint64_t bytes) const {
  (void)::sync_file_range(fd_, static_cast<off64_t>(offset), static_cast<off64_t>(bytes),
                          SYNC_FILE_RANGE_WRITE);
}

bool pathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool isDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status makeDirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return errnoStatus("cannot create directory", path, ec.value());
  if (!isDirectory(path)) return invalidArgument("'", path, "' exists and is not a directory");
  return okStatus();
}

Status syncDir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errnoStatus("cannot open directory", path, errno);
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) return errnoStatus("fsync of directory", path, e);
  return okStatus();
}

Status removeTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return internalError("cannot remove '", path, "': ", ec.message());
  return okStatus();
}

StatusOr<std::vector<std::string>> listDir(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    names.push_back(it->path().filename().string());
  if (ec) return internalError("cannot list '", dir, "': ", ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

StatusOr<std::string> readWholeFile(const std::string& path) {
  HSDP_ASSIGN_OR_RETURN(File f, File::openRead(path));
  HSDP_ASSIGN_OR_RETURN(uint64_t n, f.size());
  std::string s(n, '\0');
  HSDP_RETURN_IF_ERROR(f.preadAll(s.data(), n, 0));
  return s;
}

Status replaceFileAtomically(const std::string& path, std::string_view content) {
  const std::string tmp = path + ".tmp";
  {
    HSDP_ASSIGN_OR_RETURN(File f, File::create(tmp));
    HSDP_RETURN_IF_ERROR(f.writeAll(content.data(), content.size()));
    HSDP_RETURN_IF_ERROR(f.sync());
    HSDP_RETURN_IF_ERROR(f.close());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return errnoStatus("cannot rename to", path, errno);
  return syncDir(std::filesystem::path(path).parent_path().string());
}

Status renameDirIntoPlace(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) == 0) return okStatus();
  const int e = errno;
  if (e != ENOTEMPTY && e != EEXIST) return errnoStatus("cannot rename directory to", to, e);
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0)
    return errnoStatus("cannot exchange directory with", to, errno);
  return removeTree(from);
}

uint64_t xxh64(const void* data, size_t bytes) { return XXH64(data, bytes, 0); }

StatusOr<std::string> resolveCheckpointDir(const std::string& path) {
  if (pathExists(path + "/" + kManifestName)) return path;
  if (!pathExists(path))
    return notFound("no checkpoint at '", path, "': no such file or directory");
  // The pointer file itself ("<root>/latest") names a checkpoint beside it.
  const std::filesystem::path p(path);
  const bool is_pointer = !isDirectory(path) && p.filename() == kLatestName;
  const std::string root = is_pointer ? p.parent_path().string() : path;
  const std::string latest = is_pointer ? path : path + "/" + kLatestName;
  if (!pathExists(latest))
    return notFound("'", path, "' has no ", kManifestName, " (not a committed checkpoint) and no '",
                    kLatestName, "' pointer");
  HSDP_ASSIGN_OR_RETURN(std::string name, readWholeFile(latest));
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
    return invalidArgument("'", latest, "' does not name a checkpoint directory");
  return (root.empty() ? "." : root) + "/" + name;
}

std::string tensorName(const Manifest& m, int t) {
  const TensorDesc& d = m.tensors[t];
  std::string s = m.units[d.unit].name + "." + m.units[d.unit].params[d.param].name;
  if (d.state != State::kParam) s += strCat(" (", stateName(d.state), ")");
  return s;
}

StatusOr<File> openDataFile(const Manifest& m, const std::string& dir, int f, bool direct) {
  const std::string path = dir + "/" + m.files[f].name;
  StatusOr<File> opened = File::openRead(path, direct);
  if (!opened.ok())
    return Status(opened.status().code(),
                  strCat("data file missing or unreadable: ", opened.status().message()));
  HSDP_ASSIGN_OR_RETURN(uint64_t size, opened->size());
  if (size != m.files[f].bytes)
    return invalidArgument("data file '", path, "' is ", size, " bytes, the manifest says ",
                           m.files[f].bytes, " (truncated or replaced)");
  return opened;
}

namespace {
// The first chunk that ends after element `begin` (chunks are sorted and tile the tensor).
std::vector<Chunk>::const_iterator firstChunkEndingAfter(const std::vector<Chunk>& chunks,
                                                         uint64_t begin) {
  return std::upper_bound(chunks.begin(), chunks.end(), begin,
                          [](uint64_t v, const Chunk& c) { return v < c.start + c.count; });
}
}  // namespace

StatusOr<const File*> TensorReader::file(int f) {
  if (!files_[f]) {
    HSDP_ASSIGN_OR_RETURN(File opened, openDataFile(m_, dir_, f, direct_));
    files_[f] = std::move(opened);
  }
  return &*files_[f];
}

Status TensorReader::read(int t, uint64_t begin, uint64_t end, float* dst) {
  if (begin >= end) return okStatus();
  const std::vector<Chunk>& chunks = m_.tensors[t].chunks;
  auto it = firstChunkEndingAfter(chunks, begin);
  for (; it != chunks.end() && it->start < end; ++it) {
    const Chunk& c = *it;
    HSDP_ASSIGN_OR_RETURN(const File* f, file(c.file));
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
  return invalidArgument("data file '", f.path(), "': bytes [", c.offset, ", ",
                         c.offset + c.count * 4, ") of tensor ", tensorName(m_, t),
                         " fail their xxh64 checksum (corrupt file)");
}

Status TensorReader::readMany(const std::vector<Request>& requests) {
  // Every request cut at the chunks it touches, in order: a whole chunk lands in place (with
  // verify: fetched on the second thread), a part of one goes through read(). Every file is
  // opened here (file() is not thread-safe) and the buffered ones told what comes.
  struct Piece {
    int t;
    const Chunk* c;
    const File* f;
    uint64_t begin, end;  // elements of the tensor
    float* dst;
    bool fetched;  // a whole chunk read by the fetcher
  };
  std::vector<Piece> pieces;
  std::vector<size_t> whole;  // indices into pieces of the fetched ones
  for (const Request& r : requests) {
    willRead(r.t, r.begin, r.end);
    const std::vector<Chunk>& chunks = m_.tensors[r.t].chunks;
    for (auto it = firstChunkEndingAfter(chunks, r.begin); it != chunks.end() && it->start < r.end;
         ++it) {
      HSDP_ASSIGN_OR_RETURN(const File* f, file(it->file));
      const uint64_t b = std::max(r.begin, it->start), e = std::min(r.end, it->start + it->count);
      const bool w = verify_ && b == it->start && e == it->start + it->count;
      if (w) whole.push_back(pieces.size());
      pieces.push_back({r.t, &*it, f, b, e, r.dst + (b - r.begin), w});
    }
  }
  if (whole.size() < 2) {
    for (const Request& r : requests) HSDP_RETURN_IF_ERROR(read(r.t, r.begin, r.end, r.dst));
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
    StatusOr<const File*> f = file(c.file);
    if (!f.ok()) return;
    // Read-ahead fills the page cache, which a direct read would then read around: twice the
    // disk's work. (A read that cannot go direct then waits for the disk, chunk by chunk.)
    if ((*f)->direct()) continue;
    const uint64_t b = verify_ ? c.start : std::max(begin, c.start);
    const uint64_t e = verify_ ? c.start + c.count : std::min(end, c.start + c.count);
    (*f)->willNeed(c.offset + (b - c.start) * sizeof(float), (e - b) * sizeof(float));
  }
}

Status TensorReader::readUser(const UserEntry& e, std::string* out) {
  HSDP_ASSIGN_OR_RETURN(const File* f, file(e.file));
  out->resize(e.bytes);
  HSDP_RETURN_IF_ERROR(f->preadAll(out->data(), e.bytes, e.offset));
  if (xxh64(out->data(), e.bytes) != e.xxh64)
    return invalidArgument("data file '", f->path(), "': user entry '", e.key, "' (bytes [",
                           e.offset, ", ", e.offset + e.bytes, ")) fails its xxh64 checksum");
  return okStatus();
}

}  // namespace hsdp::ckpt
