// The file layer (hsdp/files.h), second half: directories by descriptor (Dir), the temporaries'
// guard, paths and output targets, and the cache of open files (files.cc: messages, kinds, File).
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
#include "hsdp/files.h"

namespace hsdp::files {

using detail::checkComponent;
using detail::kindOfMode;

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
  if (slash != std::string::npos && slash > 0)
    HSDP_RETURN_IF_ERROR(makeDirs(path.substr(0, slash)));
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
      if (std::find(in_chain.begin(), in_chain.end(), Id{ost.st_dev, ost.st_ino}) != in_chain.end())
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
  HSDP_ASSIGN_OR_RETURN(File f, open_(index));
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
