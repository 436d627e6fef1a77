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

std::string quote(std::string_view s, size_t cap) {
  std::string out;
  const size_t n = std::min(s.size(), cap);
  out.reserve(n + 16);
  for (size_t i = 0; i < n;) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = utf8Length(s, i);
    if (len > 1) {
      out.append(s.substr(i, len));
      i += len;
      continue;
    }
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c == '\'') out += "\\'";
    else if (c < 0x20 || c == 0x7f || len == 0) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  if (s.size() > cap) out += strCat("...(", s.size(), " bytes)");
  return out;
}

Status errnoStatus(std::string_view what, std::string_view path, int err) {
  const bool bad_input = err == EACCES || err == EPERM || err == EROFS || err == ENOTDIR ||
                         err == EISDIR || err == ENOENT || err == ENAMETOOLONG || err == ELOOP ||
                         err == EEXIST || err == ENOTEMPTY || err == EXDEV || err == ENXIO ||
                         err == ETXTBSY || err == EINVAL;
  std::string text = err == ELOOP ? "a symbolic link (hsdp does not follow links there)"
                                  : std::strerror(err);
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

namespace {
Kind kindOfMode(mode_t m) {
  return S_ISREG(m)    ? Kind::kRegular
         : S_ISDIR(m)  ? Kind::kDirectory
         : S_ISLNK(m)  ? Kind::kSymlink
         : S_ISFIFO(m) ? Kind::kFifo
         : S_ISCHR(m) || S_ISBLK(m) ? Kind::kDevice
         : S_ISSOCK(m) ? Kind::kSocket
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
    case Kind::kMissing: return "missing";
    case Kind::kRegular: return "a regular file";
    case Kind::kDirectory: return "a directory";
    case Kind::kSymlink: return "a symbolic link";
    case Kind::kFifo: return "a FIFO";
    case Kind::kDevice: return "a device node";
    case Kind::kSocket: return "a socket";
    case Kind::kOther: return "not a regular file";
  }
  return "?";
}

// ---- File --------------------------------------------------------------------------------------

namespace {
constexpr int kReadFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
constexpr int kCreateFlags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY;
}  // namespace

// The descriptor `fd` (just opened) must be a regular file; O_NONBLOCK, which kept a FIFO's open
// from blocking, is cleared. With `direct`, a second descriptor of the same inode is opened
// through /proc/self/fd (never by the name again, which may have changed meanwhile).
StatusOr<File> File::adopt(int fd, std::string path, bool direct, int direct_flags) {
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

StatusOr<File> File::openRead(const std::string& path, ReadOptions o) {
  if (path.empty()) return invalidArgument("empty file name");
  const int fd = ::open(path.c_str(), kReadFlags | (o.follow ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return notFound("cannot open '", quote(path), "': ", std::strerror(e));
    return errnoStatus("cannot open", path, e);
  }
  return adopt(fd, path, o.direct, O_RDONLY);
}

StatusOr<File> File::openReadAt(const Dir& dir, const std::string& name, bool direct) {
  HSDP_RETURN_IF_ERROR(checkComponent(dir.path(), name));
  const std::string path = dir.join(name);
  const int fd = ::openat(dir.fd(), name.c_str(), kReadFlags | O_NOFOLLOW);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return notFound("cannot open '", quote(path), "': ", std::strerror(e));
    return errnoStatus("cannot open", path, e);
  }
  return adopt(fd, path, direct, O_RDONLY);
}

StatusOr<File> File::createNew(const std::string& path, bool direct) {
  const int fd = ::open(path.c_str(), kCreateFlags, 0644);
  if (fd < 0) return errnoStatus("cannot create", path, errno);
  return adopt(fd, path, direct, O_WRONLY);
}

StatusOr<File> File::createNewAt(const Dir& dir, const std::string& name, bool direct) {
  HSDP_RETURN_IF_ERROR(checkComponent(dir.path(), name));
  const std::string path = dir.join(name);
  const int fd = ::openat(dir.fd(), name.c_str(), kCreateFlags, 0644);
  if (fd < 0) return errnoStatus("cannot create", path, errno);
  return adopt(fd, path, direct, O_WRONLY);
}

StatusOr<File> File::openWriteAt(const Dir& dir, const std::string& name, uint64_t pos) {
  HSDP_RETURN_IF_ERROR(checkComponent(dir.path(), name));
  const std::string path = dir.join(name);
  const int fd = ::openat(dir.fd(), name.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errnoStatus("cannot reopen", path, errno);
  HSDP_ASSIGN_OR_RETURN(File f, adopt(fd, path, false, 0));
  f.pos_ = pos;
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
// Direct I/O: the part of a read or write whose memory and file offset agree modulo kAlign, at
// least kMin bytes, goes around the page cache; the unaligned head and tail through it.
constexpr uint64_t kAlign = 4096;
constexpr size_t kMin = size_t{64} << 10;
struct DirectSplit {
  size_t head, mid;
};
DirectSplit splitDirect(const void* p, size_t bytes, uint64_t offset) {
  if (bytes < kMin || (reinterpret_cast<uintptr_t>(p) - offset) % kAlign != 0) return {bytes, 0};
  const size_t head = std::min<size_t>(bytes, (kAlign - offset % kAlign) % kAlign);
  return {head, (bytes - head) / kAlign * kAlign};
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
    if (fd == dfd_ && bytes % kAlign != 0) return pwriteAll(fd_, p, bytes);
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
      return invalidArgument("reading '", quote(path_), "': unexpected end of file at byte ", offset,
                             " (truncated)");
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
    // A short direct read (the file ends early) leaves the rest to the buffered descriptor,
    // which reports where the file ends.
    if (fd == dfd_ && bytes % kAlign != 0) return preadLoop(fd_, p, bytes, offset);
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

// ---- Dir ---------------------------------------------------------------------------------------

StatusOr<Dir> Dir::open(const std::string& path) {
  if (path.empty()) return invalidArgument("empty directory name");
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return notFound("no directory '", quote(path), "': ", std::strerror(e));
    return errnoStatus("cannot open directory", path, e);
  }
  return Dir(fd, path);
}

StatusOr<Dir> Dir::openAt(const Dir& parent, const std::string& name) {
  HSDP_RETURN_IF_ERROR(checkComponent(parent.path(), name));
  const std::string path = parent.join(name);
  const int fd =
      ::openat(parent.fd(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return notFound("no directory '", quote(path), "': ", std::strerror(e));
    if (e == ENOTDIR || e == ELOOP) {
      const Kind k = parent.kindOf(name);
      return invalidArgument("'", quote(path), "' is ", kindName(k), ", not a directory");
    }
    return errnoStatus("cannot open directory", path, e);
  }
  return Dir(fd, path);
}

Dir::~Dir() {
  if (fd_ >= 0) ::close(fd_);
}
Dir::Dir(Dir&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
Dir& Dir::operator=(Dir&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

std::string Dir::join(const std::string& name) const {
  return path_.empty() || path_ == "." ? name : path_ + "/" + name;
}

StatusOr<std::vector<Dir::Entry>> Dir::list() const {
  // A fresh descriptor: readdir's position belongs to the open file description.
  const int fd = ::openat(fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errnoStatus("cannot list", path_, errno);
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    const int e = errno;
    ::close(fd);
    return errnoStatus("cannot list", path_, e);
  }
  std::vector<Entry> out;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    out.push_back({n, kindAt(fd_, n)});
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return errnoStatus("cannot list", path_, err);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  return out;
}

Status Dir::makeDir(const std::string& name, mode_t mode) const {
  HSDP_RETURN_IF_ERROR(checkComponent(path_, name));
  if (::mkdirat(fd_, name.c_str(), mode) != 0)
    return errnoStatus("cannot create directory", join(name), errno);
  return okStatus();
}

Status Dir::removeFile(const std::string& name) const {
  HSDP_RETURN_IF_ERROR(checkComponent(path_, name));
  if (::unlinkat(fd_, name.c_str(), 0) != 0 && errno != ENOENT)
    return errnoStatus("cannot remove", join(name), errno);
  return okStatus();
}

Status Dir::removeTree(const std::string& name) const {
  HSDP_RETURN_IF_ERROR(checkComponent(path_, name));
  const Kind k = kindOf(name);
  if (k == Kind::kMissing) return okStatus();
  if (k != Kind::kDirectory) return removeFile(name);
  {
    HSDP_ASSIGN_OR_RETURN(Dir sub, openAt(*this, name));
    HSDP_ASSIGN_OR_RETURN(std::vector<Entry> entries, sub.list());
    for (const Entry& e : entries) HSDP_RETURN_IF_ERROR(sub.removeTree(e.name));
  }
  if (::unlinkat(fd_, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
    return errnoStatus("cannot remove directory", join(name), errno);
  return okStatus();
}

Status Dir::rename(const std::string& from, const Dir& to_dir, const std::string& to,
                   Rename how) const {
  HSDP_RETURN_IF_ERROR(checkComponent(path_, from));
  HSDP_RETURN_IF_ERROR(checkComponent(to_dir.path(), to));
  const unsigned flags = how == Rename::kNoReplace  ? RENAME_NOREPLACE
                         : how == Rename::kExchange ? RENAME_EXCHANGE
                                                    : 0u;
  if (::renameat2(fd_, from.c_str(), to_dir.fd(), to.c_str(), flags) == 0) return okStatus();
  const int e = errno;
  if (how == Rename::kNoReplace && e == EEXIST)
    return invalidArgument("cannot rename '", quote(join(from)), "' to '", quote(to_dir.join(to)),
                           "': the target exists (not replaced)");
  return errnoStatus(strCat("cannot rename '", quote(join(from)), "' to"), to_dir.join(to), e);
}

Status Dir::replaceFile(const std::string& name, std::string_view content) const {
  HSDP_RETURN_IF_ERROR(checkComponent(path_, name));
  const Kind k = kindOf(name);
  if (k != Kind::kMissing && k != Kind::kRegular && k != Kind::kSymlink)
    return invalidArgument("cannot write '", quote(join(name)), "': it is ", kindName(k));
  const std::string tmp = tempName(name);
  HSDP_RETURN_IF_ERROR(removeFile(tmp));  // this job's own leftover, never another's
  TempGuard guard(*this, tmp);
  {
    HSDP_ASSIGN_OR_RETURN(File f, File::createNewAt(*this, tmp));
    HSDP_RETURN_IF_ERROR(f.writeAll(content.data(), content.size()));
    HSDP_RETURN_IF_ERROR(f.sync());
    HSDP_RETURN_IF_ERROR(f.close());
  }
  // A symbolic link at `name` is replaced by the file (rename never writes through it).
  HSDP_RETURN_IF_ERROR(rename(tmp, name, Rename::kReplace));
  guard.release();
  return sync();
}

Status Dir::sync() const {
  if (::fsync(fd_) != 0 && errno != EINVAL) return errnoStatus("fsync of directory", path_, errno);
  return okStatus();
}

TempGuard::~TempGuard() {
  if (dir_ != nullptr) (void)dir_->removeTree(name_);
}

// ---- paths -------------------------------------------------------------------------------------

StatusOr<PathParts> splitPath(const std::string& path) {
  if (path.empty()) return invalidArgument("empty path");
  const size_t slash = path.rfind('/');
  PathParts p;
  p.name = slash == std::string::npos ? path : path.substr(slash + 1);
  p.dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (p.name.empty() || p.name == "." || p.name == "..")
    return invalidArgument("'", quote(path), "' does not end in a file or directory name");
  return p;
}

Status makeDirs(const std::string& path) {
  if (path.empty()) return invalidArgument("empty directory name");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return okStatus();
    return invalidArgument("'", quote(path), "' exists and is ", kindName(kindOfMode(st.st_mode)),
                           ", not a directory");
  }
  if (errno != ENOENT) return errnoStatus("cannot create directory", path, errno);
  const size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) HSDP_RETURN_IF_ERROR(makeDirs(path.substr(0, slash)));
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
    return errnoStatus("cannot create directory", path, errno);
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return invalidArgument("'", quote(path), "' exists and is not a directory");
  return okStatus();
}

Status writeFileAtomically(const std::string& path, std::string_view content) {
  HSDP_ASSIGN_OR_RETURN(PathParts parts, splitPath(path));
  HSDP_ASSIGN_OR_RETURN(Dir dir, Dir::open(parts.dir));
  const Kind k = dir.kindOf(parts.name);
  if (k == Kind::kSymlink)
    return invalidArgument("cannot write '", quote(path),
                           "': it is a symbolic link (hsdp does not write through links)");
  return dir.replaceFile(parts.name, content);
}

namespace {
struct Id {
  dev_t dev;
  ino_t ino;
  bool operator==(const Id& o) const { return dev == o.dev && ino == o.ino; }
};

// Every directory from `path` up to "/" (resolved), as ids: the chain `path` lies in.
std::vector<Id> ancestry(const std::string& path) {
  std::vector<Id> ids;
  char* real = ::realpath(path.c_str(), nullptr);
  if (real == nullptr) return ids;
  std::string p = real;
  std::free(real);
  for (;;) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0) ids.push_back({st.st_dev, st.st_ino});
    if (p == "/" || p.empty()) break;
    const size_t slash = p.rfind('/');
    p = slash == 0 ? "/" : p.substr(0, slash);
  }
  return ids;
}
}  // namespace

Status checkOutputTarget(const std::string& out, OutputTarget t,
                         const std::vector<std::string>& inputs) {
  HSDP_ASSIGN_OR_RETURN(PathParts parts, splitPath(out));
  if (!out.empty() && out.back() == '/')
    return invalidArgument("output '", quote(out), "' ends in '/': name the new file or directory");
  struct stat pst;
  if (::stat(parts.dir.c_str(), &pst) != 0)
    return errnoStatus("output's directory", parts.dir, errno);
  if (!S_ISDIR(pst.st_mode))
    return invalidArgument("output's directory '", quote(parts.dir), "' is not a directory");
  const Kind k = kindOf(out);
  const char* want = t.directory ? "directory" : "file";
  if (k == Kind::kSymlink)
    return invalidArgument("output '", quote(out),
                           "' is a symbolic link: hsdp does not write through links");
  if (k == Kind::kFifo || k == Kind::kDevice || k == Kind::kSocket || k == Kind::kOther)
    return invalidArgument("output '", quote(out), "' is ", kindName(k), ", not a ", want);
  if (k == Kind::kDirectory && !(t.directory && t.replace_dir))
    return invalidArgument("output '", quote(out), "' is an existing directory",
                           t.directory ? " (not replaced)" : "", "; give a new ", want, " name");
  if (k == Kind::kRegular && t.directory)
    return invalidArgument("output '", quote(out), "' is an existing file, not a directory");
  // The target's identity: the file itself where it exists, else its directory plus the name.
  const std::vector<Id> out_chain = ancestry(parts.dir);
  struct stat ost;
  const bool exists = ::stat(out.c_str(), &ost) == 0;
  for (const std::string& in : inputs) {
    struct stat ist;
    if (::stat(in.c_str(), &ist) != 0) continue;
    const Id in_id{ist.st_dev, ist.st_ino};
    if (exists && Id{ost.st_dev, ost.st_ino} == in_id)
      return invalidArgument("output '", quote(out), "' is the input '", quote(in), "'");
    // Inside the input: the input directory is one of the output's ancestors.
    if (std::find(out_chain.begin(), out_chain.end(), in_id) != out_chain.end())
      return invalidArgument("output '", quote(out), "' is inside the input '", quote(in), "'");
    // The input inside the output: replacing the output would remove the input.
    if (exists && S_ISDIR(ost.st_mode)) {
      const std::vector<Id> in_chain = ancestry(in);
      if (std::find(in_chain.begin(), in_chain.end(), Id{ost.st_dev, ost.st_ino}) !=
          in_chain.end())
        return invalidArgument("output '", quote(out), "' contains the input '", quote(in), "'");
    }
  }
  return okStatus();
}

// ---- FileCache ---------------------------------------------------------------------------------

StatusOr<std::shared_ptr<const File>> FileCache::get(int index) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->index != index) continue;
    lru_.splice(lru_.begin(), lru_, it);
    return lru_.front().file;
  }
  // Close the least recently used files nobody else holds until there is room.
  for (auto it = lru_.end(); lru_.size() >= capacity_ && it != lru_.begin();) {
    --it;
    if (it->file.use_count() == 1) it = lru_.erase(it);
  }
  HSDP_ASSIGN_OR_RETURN(File f, open_(ctx_, index));
  lru_.push_front({index, std::make_shared<const File>(std::move(f))});
  return lru_.front().file;
}

size_t openFileBudget() {
  struct rlimit rl;
  uint64_t soft = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) soft = rl.rlim_cur;
  return static_cast<size_t>(std::clamp<uint64_t>(soft / 4, 4, 256));
}

}  // namespace hsdp::files
