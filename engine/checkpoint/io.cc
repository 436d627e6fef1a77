#include "engine/checkpoint/io.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

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

StatusOr<File> File::openRead(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return notFound("cannot open '", path, "': ", std::strerror(e));
    return errnoStatus("cannot open", path, e);
  }
  return File(fd, path);
}

StatusOr<File> File::create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errnoStatus("cannot create", path, errno);
  return File(fd, path);
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}
File::File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

Status File::writeAll(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, std::min<size_t>(bytes, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoStatus("writing", path_, errno);
    }
    if (n == 0) return internalError("writing '", path_, "': no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return okStatus();
}

Status File::preadAll(void* data, size_t bytes, uint64_t offset) const {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pread(fd_, p, std::min<size_t>(bytes, size_t{1} << 30), offset);
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
  }
  return okStatus();
}

Status File::sync() {
  if (::fsync(fd_) != 0) return errnoStatus("fsync of", path_, errno);
  return okStatus();
}

Status File::close() {
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

StatusOr<File> openDataFile(const Manifest& m, const std::string& dir, int f) {
  const std::string path = dir + "/" + m.files[f].name;
  StatusOr<File> opened = File::openRead(path);
  if (!opened.ok())
    return Status(opened.status().code(),
                  strCat("data file missing or unreadable: ", opened.status().message()));
  HSDP_ASSIGN_OR_RETURN(uint64_t size, opened->size());
  if (size != m.files[f].bytes)
    return invalidArgument("data file '", path, "' is ", size, " bytes, the manifest says ",
                           m.files[f].bytes, " (truncated or replaced)");
  return opened;
}

StatusOr<const File*> TensorReader::file(int f) {
  if (!files_[f]) {
    HSDP_ASSIGN_OR_RETURN(File opened, openDataFile(m_, dir_, f));
    files_[f] = std::move(opened);
  }
  return &*files_[f];
}

Status TensorReader::read(int t, uint64_t begin, uint64_t end, float* dst) {
  if (begin >= end) return okStatus();
  const std::vector<Chunk>& chunks = m_.tensors[t].chunks;
  // The first chunk that ends after `begin` (chunks are sorted and tile the tensor).
  auto it = std::upper_bound(chunks.begin(), chunks.end(), begin,
                             [](uint64_t v, const Chunk& c) { return v < c.start + c.count; });
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
    if (xxh64(to, c.count * sizeof(float)) != c.xxh64)
      return invalidArgument("data file '", f->path(), "': bytes [", c.offset, ", ",
                             c.offset + c.count * 4, ") of tensor ", tensorName(m_, t),
                             " fail their xxh64 checksum (corrupt file)");
    if (!whole) std::memcpy(dst + (b - begin), to + (b - c.start), (e - b) * sizeof(float));
  }
  return okStatus();
}

void TensorReader::willRead(int t, uint64_t begin, uint64_t end) {
  const std::vector<Chunk>& chunks = m_.tensors[t].chunks;
  auto it = std::upper_bound(chunks.begin(), chunks.end(), begin,
                             [](uint64_t v, const Chunk& c) { return v < c.start + c.count; });
  for (; it != chunks.end() && it->start < end; ++it) {
    const Chunk& c = *it;
    StatusOr<const File*> f = file(c.file);
    if (!f.ok()) return;
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
