// The file layer (hsdp/files.h): opening, reading, writing and removing files by the rules stated
// there. Only POSIX calls; every error names the path (quoted) and errno's text.
#include "hsdp/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/files_internal.h"

namespace hsdp::files {

// ---- messages ----------------------------------------------------------------------------------

namespace {
// Length of the UTF-8 sequence at s[i], or 0 when it is not valid UTF-8.
size_t utf8Length(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  if (n == 2 && c < 0xc2) return 0;  // overlong
  return n;
}
}  // namespace

namespace {
// Appends s[i..] escaped: a valid UTF-8 sequence other than a C1 control (U+0080-U+009F, which
// some terminals obey) is kept; a control byte, 0x7f, a C1 control or a byte that is not UTF-8
// is written \xNN (\n, \t by name). `text` keeps newlines and leaves quotes and backslashes
// alone (a whole message); otherwise they are escaped too (a field inside a message).
size_t escapeOne(std::string_view s, size_t i, bool text, std::string* out) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t len = utf8Length(s, i);
  const bool c1 = len == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0;
  if (len > 1 && !c1) {
    out->append(s.substr(i, len));
    return len;
  }
  if (c1) {
    *out += strCat("\\u00", "0123456789abcdef"[static_cast<unsigned char>(s[i + 1]) >> 4],
                   "0123456789abcdef"[s[i + 1] & 0xf]);
    return 2;
  }
  if (c == '\n')
    *out += text ? "\n" : "\\n";
  else if (c == '\t')
    *out += "\\t";
  else if (!text && c == '\\')
    *out += "\\\\";
  else if (!text && c == '\'')
    *out += "\\'";
  else if (c < 0x20 || c == 0x7f || len == 0) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    *out += buf;
  } else {
    *out += static_cast<char>(c);
  }
  return 1;
}
}  // namespace

std::string quote(std::string_view s, size_t cap) {
  std::string out;
  const size_t n = std::min(s.size(), cap);
  out.reserve(n + 16);
  for (size_t i = 0; i < n;) i += escapeOne(s.substr(0, n), i, /*text=*/false, &out);
  if (s.size() > cap) out += strCat("...(", s.size(), " bytes)");
  return out;
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) i += escapeOne(s, i, /*text=*/true, &out);
  return out;
}

Status errnoStatus(std::string_view what, std::string_view path, int err) {
  const bool bad_input = err == EACCES || err == EPERM || err == EROFS || err == ENOTDIR ||
                         err == EISDIR || err == ENOENT || err == ENAMETOOLONG || err == ELOOP ||
                         err == EEXIST || err == ENOTEMPTY || err == EXDEV || err == ENXIO ||
                         err == ETXTBSY || err == EINVAL;
  std::string text =
      err == ELOOP ? "a symbolic link (hsdp does not follow links there)" : std::strerror(err);
  return Status(bad_input ? StatusCode::kInvalidArgument : StatusCode::kInternal,
                strCat(what, " '", quote(path), "': ", text));
}

// ---- job marker and temporaries ----------------------------------------------------------------

namespace {
std::string& markerStorage() {
  static std::string marker = [] {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "host");
    std::string h;
    for (const char* p = host; *p && *p != '.'; ++p)
      h += (std::isalnum(static_cast<unsigned char>(*p)) || *p == '-') ? *p : '_';
    return strCat(h, ".", ::getpid());
  }();
  return marker;
}
}  // namespace

const std::string& jobMarker() { return markerStorage(); }
void setJobMarker(std::string marker) { markerStorage() = std::move(marker); }

std::string tempName(std::string_view base) { return strCat(".", base, ".tmp-", jobMarker()); }

bool isOwnTemp(std::string_view name) {
  const std::string suffix = ".tmp-" + jobMarker();
  return name.size() > suffix.size() + 1 && name[0] == '.' &&
         name.substr(name.size() - suffix.size()) == suffix;
}

// ---- kinds -------------------------------------------------------------------------------------

namespace detail {
Kind kindOfMode(mode_t m) {
  return S_ISREG(m)                 ? Kind::kRegular
         : S_ISDIR(m)               ? Kind::kDirectory
         : S_ISLNK(m)               ? Kind::kSymlink
         : S_ISFIFO(m)              ? Kind::kFifo
         : S_ISCHR(m) || S_ISBLK(m) ? Kind::kDevice
         : S_ISSOCK(m)              ? Kind::kSocket
                                    : Kind::kOther;
}

// `name` must be one path component: no '/', not empty, not . or ..
Status checkComponent(const std::string& dir, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    return invalidArgument("'", quote(name), "' in '", quote(dir),
                           "' is not a plain file name (no '/', not '.' or '..')");
  return okStatus();
}

}  // namespace detail

namespace {
using detail::checkComponent;
using detail::kindOfMode;

Status notRegular(const std::string& path, Kind k) {
  return invalidArgument("'", quote(path), "' is ", kindName(k), ", not a regular file");
}
}  // namespace

Kind kindOf(const std::string& path) { return kindAt(AT_FDCWD, path); }

Kind kindAt(int dirfd, const std::string& name) {
  struct stat st;
  if (::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Kind::kMissing;
  return kindOfMode(st.st_mode);
}

const char* kindName(Kind k) {
  switch (k) {
    case Kind::kMissing:
      return "missing";
    case Kind::kRegular:
      return "a regular file";
    case Kind::kDirectory:
      return "a directory";
    case Kind::kSymlink:
      return "a symbolic link";
    case Kind::kFifo:
      return "a FIFO";
    case Kind::kDevice:
      return "a device node";
    case Kind::kSocket:
      return "a socket";
    case Kind::kOther:
      return "not a regular file";
  }
  return "?";
}

// ---- File --------------------------------------------------------------------------------------

namespace {
constexpr int kReadFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
constexpr int kCreateFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY;
}  // namespace

// What the file layer's functions (core/files_internal.h) reach inside a File.
struct detail::FileAccess {
  // The descriptor `fd` (just opened) must be a regular file; O_NONBLOCK, which kept a FIFO's
  // open from blocking, is cleared. With `direct`, a second descriptor of the same inode is
  // opened through /proc/self/fd (never by the name again, which may have changed meanwhile).
  static StatusOr<File> adopt(int fd, std::string path, bool direct, int direct_flags) {
    File f(fd, std::move(path));
    struct stat st;
    if (::fstat(fd, &st) != 0) return errnoStatus("fstat of", f.path_, errno);
    if (!S_ISREG(st.st_mode)) return notRegular(f.path_, kindOfMode(st.st_mode));
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0 && (fl & O_NONBLOCK)) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (direct) {
      const std::string self = strCat("/proc/self/fd/", fd);
      // A filesystem without O_DIRECT (tmpfs: EINVAL) leaves dfd_ at -1: everything is buffered.
      f.dfd_ = ::open(self.c_str(), direct_flags | O_DIRECT | O_CLOEXEC);
    }
    return f;
  }
  static void setPos(File& f, uint64_t pos) { f.pos_ = pos; }
  static bool direct(const File& f) { return f.dfd_ >= 0; }
};

namespace {
using detail::FileAccess;

StatusOr<File> openReadFollow(const std::string& path, bool follow, bool direct) {
  if (path.empty()) return invalidArgument("empty file name");
  const int fd = ::open(path.c_str(), kReadFlags | (follow ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return notFound("cannot open '", quote(path), "': ", std::strerror(e));
    return errnoStatus("cannot open", path, e);
  }
  return FileAccess::adopt(fd, path, direct, O_RDONLY);
}
}  // namespace

StatusOr<File> openRead(const std::string& path, bool direct) {
  return openReadFollow(path, /*follow=*/true, direct);
}

StatusOr<File> openReadAt(const Dir& dir, const std::string& name, bool direct) {
  HSDP_RETURN_IF_ERROR(checkComponent(dir.path(), name));
  const std::string path = dir.join(name);
  const int fd = ::openat(dir.fd(), name.c_str(), kReadFlags | O_NOFOLLOW);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return notFound("cannot open '", quote(path), "': ", std::strerror(e));
    return errnoStatus("cannot open", path, e);
  }
  return FileAccess::adopt(fd, path, direct, O_RDONLY);
}

StatusOr<File> createNew(const std::string& path, bool direct) {
  const int fd = ::open(path.c_str(), kCreateFlags, 0644);
  if (fd < 0) return errnoStatus("cannot create", path, errno);
  return FileAccess::adopt(fd, path, direct, O_WRONLY);
}

StatusOr<File> createNewAt(const Dir& dir, const std::string& name, bool direct) {
  HSDP_RETURN_IF_ERROR(checkComponent(dir.path(), name));
  const std::string path = dir.join(name);
  const int fd = ::openat(dir.fd(), name.c_str(), kCreateFlags, 0644);
  if (fd < 0) return errnoStatus("cannot create", path, errno);
  return FileAccess::adopt(fd, path, direct, O_WRONLY);
}

bool isDirect(const File& f) { return FileAccess::direct(f); }

StatusOr<File> File::openRead(const std::string& path, ReadOptions o) {
  return openReadFollow(path, o.follow, /*direct=*/false);
}
StatusOr<File> File::openReadAt(const Dir& dir, const std::string& name) {
  return files::openReadAt(dir, name, /*direct=*/false);
}
StatusOr<File> File::createNew(const std::string& path) {
  return files::createNew(path, /*direct=*/false);
}
StatusOr<File> File::createNewAt(const Dir& dir, const std::string& name) {
  return files::createNewAt(dir, name, /*direct=*/false);
}

StatusOr<File> File::openWriteAt(const Dir& dir, const std::string& name, uint64_t pos) {
  HSDP_RETURN_IF_ERROR(checkComponent(dir.path(), name));
  const std::string path = dir.join(name);
  const int fd = ::openat(dir.fd(), name.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errnoStatus("cannot reopen", path, errno);
  HSDP_ASSIGN_OR_RETURN(File f, FileAccess::adopt(fd, path, false, 0));
  FileAccess::setPos(f, pos);
  return f;
}

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
// Direct I/O (core/files_internal.h): the aligned middle on the O_DIRECT descriptor.
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
    if (n == 0) return internalError("writing '", quote(path_), "': no progress");
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
      return invalidArgument("reading '", quote(path_), "': unexpected end of file at byte ",
                             offset, " (truncated)");
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

void dropCache(const File& f) { (void)::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_DONTNEED); }

void adviseSequential(const File& f) { (void)::posix_fadvise(f.fd(), 0, 0, POSIX_FADV_SEQUENTIAL); }

void willNeed(const File& f, uint64_t offset, uint64_t bytes) {
  (void)::posix_fadvise(f.fd(), static_cast<off_t>(offset), static_cast<off_t>(bytes),
                        POSIX_FADV_WILLNEED);
}

void startWriteback(const File& f, uint64_t offset, uint64_t bytes) {
  (void)::sync_file_range(f.fd(), static_cast<off64_t>(offset), static_cast<off64_t>(bytes),
                          SYNC_FILE_RANGE_WRITE);
}

// ---- bounded reads -----------------------------------------------------------------------------

namespace {
StatusOr<std::string> readOpened(const File& f, uint64_t limit, std::string_view what) {
  HSDP_ASSIGN_OR_RETURN(uint64_t n, f.size());
  if (n > limit)
    return invalidArgument(what, " '", quote(f.path()), "' is ", n, " bytes, over the limit of ",
                           limit, " bytes");
  std::string s(n, '\0');
  HSDP_RETURN_IF_ERROR(f.preadAll(s.data(), n, 0));
  return s;
}
}  // namespace

StatusOr<std::string> readBounded(const std::string& path, uint64_t limit, std::string_view what) {
  StatusOr<File> f = File::openRead(path);
  if (!f.ok()) return f.status().withContext(what);
  return readOpened(*f, limit, what);
}

StatusOr<std::string> Dir::readFile(const std::string& name, uint64_t limit,
                                    std::string_view what) const {
  StatusOr<File> f = File::openReadAt(*this, name);
  if (!f.ok()) return f.status().withContext(what);
  return readOpened(*f, limit, what);
}

}  // namespace hsdp::files
