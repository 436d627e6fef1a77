// The one file layer: every file hsdp reads or writes (checkpoints, safetensors, topology inputs,
// the GPT corpus, the planner's inputs and charts, the tools' outputs) goes through it. Its rules
// (docs/checkpoint.md, "File rules"):
//
// - Reads open with O_NONBLOCK and fstat the descriptor: anything that is not a regular file (a
//   FIFO, a device, a socket, a directory) is an error naming the path, never a hang. A path the
//   user typed may be a symbolic link (it is followed, as a shell would); a name found inside a
//   directory hsdp manages (a checkpoint's data files, manifest, `latest`) is opened relative to
//   that directory's descriptor with O_NOFOLLOW: a symbolic link there is an error.
// - Every whole-file read is bounded (readBounded): the limit is part of the error.
// - Writes never follow a symbolic link and never truncate what exists: a file is created with
//   O_CREAT|O_EXCL under a temporary name that carries this job's marker (tempName), written,
//   fsynced and renamed into place (renameat2 RENAME_NOREPLACE where nothing may be replaced).
//   An output target is checked first (checkOutputTarget): not a device, FIFO, socket or
//   symbolic link, not an existing directory unless asked for, never equal to or inside an input.
// - A failed write removes its temporaries (TempGuard).
// - Messages echo at most kEchoBytes of a path or of file content, escaped (quote()); whatever
//   the programs print passes through printable().
//
// Errors: what can never work (a missing file, a symbolic link, a FIFO, no permission, a file over
// its limit) is kInvalidArgument (exit 2 in the programs); a failing disk (ENOSPC, EIO) is
// kInternal (exit 3).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hsdp/status.h"

namespace hsdp::files {

// The most bytes of a path or of a file's content that an error message echoes.
constexpr size_t kEchoBytes = 200;

// `s` for a message: control characters, quotes, backslashes and bytes that are not UTF-8 escaped
// (\n, \x1b, ...), cut after `cap` bytes with "...(N bytes)" appended. Never throws.
std::string quote(std::string_view s, size_t cap = kEchoBytes);
// A whole text for a terminal (a message, a table the tools print): every byte a terminal would
// act on -- control bytes other than newline, 0x7f, C1 controls (U+0080-U+009F), bytes that are
// not UTF-8 -- escaped as quote() escapes them; quotes, backslashes and newlines kept. What the
// tools, the examples and the Python package print passes through it (after quote() of each
// field inside), so nothing from a file reaches a terminal raw. Never throws.
std::string printable(std::string_view s);

// Status for a failed system call on `path`: "<what> '<path>': <strerror>", kInvalidArgument
// for errors of the input (ENOENT, EACCES, ELOOP, ENOTDIR, ...), kInternal for the disk's.
Status errnoStatus(std::string_view what, std::string_view path, int err);

// This job's marker, the same on every rank of an MPI job that called setJobMarker with rank 0's
// value: "<host>.<pid>" of the process by default. Temporaries carry it; cleanup touches only
// names that carry it.
const std::string& jobMarker();
void setJobMarker(std::string marker);
// ".<base>.tmp-<marker>": a temporary beside its target, hidden, recognisably this job's.
std::string tempName(std::string_view base);
// Whether `name` is a temporary of this job (made by tempName with this marker).
bool isOwnTemp(std::string_view name);

// Which kind of object a path names, without following a final symbolic link.
enum class Kind { kMissing, kRegular, kDirectory, kSymlink, kFifo, kDevice, kSocket, kOther };
Kind kindOf(const std::string& path);
Kind kindAt(int dirfd, const std::string& name);
const char* kindName(Kind k);  // "a FIFO", "a device node", ...

class Dir;
namespace detail {
struct FileAccess;  // the file layer's internals (core/files_internal.h)
}

// An open regular file, closed on destruction.
class File {
 public:
  struct ReadOptions {
    bool follow = true;  // follow a final symbolic link (a path the user typed)
  };
  // A regular file for reading (see the rules above).
  static StatusOr<File> openRead(const std::string& path, ReadOptions o);
  static StatusOr<File> openRead(const std::string& path) { return openRead(path, ReadOptions{}); }
  // `name` (one path component) inside `dir`, never following a symbolic link.
  static StatusOr<File> openReadAt(const Dir& dir, const std::string& name);
  // A new file: O_CREAT|O_EXCL|O_NOFOLLOW; an existing name (even a dangling link) is an error.
  static StatusOr<File> createNew(const std::string& path);
  static StatusOr<File> createNewAt(const Dir& dir, const std::string& name);
  // An existing regular file `name` in `dir` (one this job created), reopened for writing at
  // `pos` (writeAll appends from there); never follows a symbolic link, never truncates.
  static StatusOr<File> openWriteAt(const Dir& dir, const std::string& name, uint64_t pos);

  File() = default;
  ~File();
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Appends at the end of what this File wrote.
  [[nodiscard]] Status writeAll(const void* data, size_t bytes);
  [[nodiscard]] Status preadAll(void* data, size_t bytes, uint64_t offset) const;
  bool isOpen() const { return fd_ >= 0; }
  [[nodiscard]] Status sync();   // fsync
  [[nodiscard]] Status close();  // reports close()'s error (NFS reports write errors there)
  StatusOr<uint64_t> size() const;
  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

 private:
  friend struct detail::FileAccess;
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  [[nodiscard]] Status pwriteAll(int fd, const char* p, size_t bytes);
  [[nodiscard]] Status preadLoop(int fd, char* p, size_t bytes, uint64_t offset) const;
  int fd_ = -1;
  int dfd_ = -1;      // a second descriptor of the file (core/files_internal.h), or -1
  uint64_t pos_ = 0;  // where writeAll appends
  std::string path_;
};

// An open directory, closed on destruction. Every operation names its entries relative to the
// descriptor, one path component at a time, and never follows a symbolic link inside it.
class Dir {
 public:
  struct Entry {
    std::string name;
    Kind kind;
  };
  // A directory the user named (a symbolic link to a directory is followed).
  static StatusOr<Dir> open(const std::string& path);
  // `name` inside `parent`; a symbolic link is an error.
  static StatusOr<Dir> openAt(const Dir& parent, const std::string& name);
  Dir() = default;
  ~Dir();
  Dir(Dir&& o) noexcept;
  Dir& operator=(Dir&& o) noexcept;
  Dir(const Dir&) = delete;
  Dir& operator=(const Dir&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::string join(const std::string& name) const;  // path() + "/" + name, for messages
  Kind kindOf(const std::string& name) const { return kindAt(fd_, name); }
  // Entries (not . and ..), sorted by name.
  StatusOr<std::vector<Entry>> list() const;
  [[nodiscard]] Status makeDir(const std::string& name, mode_t mode = 0755) const;  // new only
  // Removes `name` and, for a directory, everything under it, never following a symbolic link (a
  // link is removed, not what it names). A missing name is fine.
  [[nodiscard]] Status removeTree(const std::string& name) const;
  [[nodiscard]] Status removeFile(const std::string& name) const;  // unlink; missing is fine
  // renameat2 within this directory or into `to_dir`: kNoReplace fails when `to` exists,
  // kExchange swaps two existing names, kReplace is rename(2).
  enum class Rename { kReplace, kNoReplace, kExchange };
  [[nodiscard]] Status rename(const std::string& from, const Dir& to_dir, const std::string& to,
                              Rename how) const;
  [[nodiscard]] Status rename(const std::string& from, const std::string& to, Rename how) const {
    return rename(from, *this, to, how);
  }
  // The content of the regular file `name`, at most `limit` bytes (readBounded's rules).
  StatusOr<std::string> readFile(const std::string& name, uint64_t limit,
                                 std::string_view what) const;
  // Writes `content` to a new temporary in this directory and renames it over `name`
  // (kReplace; an existing directory, device, FIFO or socket named `name` is an error).
  [[nodiscard]] Status replaceFile(const std::string& name, std::string_view content) const;
  [[nodiscard]] Status sync() const;  // fsync of the directory

 private:
  Dir(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// The split of a path into its directory and its last component ("a/b" -> "a", "b"; "b" ->
// ".", "b"). A path ending in "/", ".", ".." or empty has no last component: an error naming it.
struct PathParts {
  std::string dir, name;
};
StatusOr<PathParts> splitPath(const std::string& path);

// mkdir -p of a path the user named; the result must be a directory.
[[nodiscard]] Status makeDirs(const std::string& path);

// The whole content of the regular file `path` (a path the user typed: a final symbolic link is
// followed), refused when it is over `limit` bytes: "<what> 'path' is N bytes, over the limit
// of L bytes". `what` names the kind of file ("manifest", "topology file").
StatusOr<std::string> readBounded(const std::string& path, uint64_t limit, std::string_view what);

// Writes `content` to `path` atomically (a new temporary in the same directory, fsynced, renamed
// over `path`); `path` must not be a directory, device, FIFO, socket or symbolic link. On any
// error the temporary is removed and `path` is untouched.
[[nodiscard]] Status writeFileAtomically(const std::string& path, std::string_view content);

// Checks a path about to be written (a file, or a directory when `directory`): its parent is an
// existing directory; it is not a symbolic link (dangling or not), a device, a FIFO or a socket;
// an existing directory is accepted only with `directory && replace_dir`, an existing file only
// without `directory`; it is neither equal to, inside, nor a parent of any of `inputs` (compared
// by device and inode after resolving the parent). Errors name the path and say what is wrong.
struct OutputTarget {
  bool directory = false;
  bool replace_dir = false;
};
[[nodiscard]] Status checkOutputTarget(const std::string& out, OutputTarget t,
                                       const std::vector<std::string>& inputs);

// Removes the temporary `name` in `dir` on destruction unless release()d: a failed write leaves
// nothing behind.
class TempGuard {
 public:
  TempGuard(const Dir& dir, std::string name) : dir_(&dir), name_(std::move(name)) {}
  ~TempGuard();
  TempGuard(const TempGuard&) = delete;
  TempGuard& operator=(const TempGuard&) = delete;
  void release() { dir_ = nullptr; }
  const std::string& name() const { return name_; }

 private:
  const Dir* dir_;
  std::string name_;
};

}  // namespace hsdp::files
