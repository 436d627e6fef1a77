// Internal to the engine: files for checkpoints. POSIX calls wrapped in RAII owners whose errors
// name the path and errno (a full disk is "No space left on device" or, under RLIMIT_FSIZE, "File
// too large", with the file), the atomic-commit helpers (fsync of files and directories, rename,
// a pointer file replaced atomically), and the reader that fetches any element range of a
// checkpoint tensor through the manifest's sorted chunk lists. No MPI.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/checkpoint/format.h"
#include "hsdp/status.h"

namespace hsdp::ckpt {

// An open file descriptor, closed on destruction.
class File {
 public:
  static StatusOr<File> openRead(const std::string& path);
  static StatusOr<File> create(const std::string& path);  // write-only, truncated
  File() = default;
  ~File();
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  [[nodiscard]] Status writeAll(const void* data, size_t bytes);
  [[nodiscard]] Status preadAll(void* data, size_t bytes, uint64_t offset) const;
  [[nodiscard]] Status sync();   // fsync
  [[nodiscard]] Status close();  // reports close()'s error (NFS reports write errors there)
  StatusOr<uint64_t> size() const;
  // Drops the file's pages from the page cache (benchmarks: cold reads).
  void dropCache() const;
  // Hints for streaming (hsdp-ckpt reshard, export): the file is read front to back, and
  // [offset, offset + bytes) will be read soon (the kernel starts reading it now); best effort.
  void adviseSequential() const;
  void willNeed(uint64_t offset, uint64_t bytes) const;
  // Starts writing back [offset, offset + bytes) of what was written (sync_file_range, no wait),
  // so that the disk works while the writer goes on and the closing fsync has little left to do.
  void startWriteback(uint64_t offset, uint64_t bytes) const;
  const std::string& path() const { return path_; }

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

bool pathExists(const std::string& path);
bool isDirectory(const std::string& path);
[[nodiscard]] Status makeDirs(const std::string& path);  // mkdir -p
[[nodiscard]] Status syncDir(const std::string& path);
[[nodiscard]] Status removeTree(const std::string& path);  // rm -rf; a missing path is fine
// Names in `dir` (not . and ..); an unreadable directory is an error.
StatusOr<std::vector<std::string>> listDir(const std::string& dir);
StatusOr<std::string> readWholeFile(const std::string& path);
// Writes `content` to path.tmp, fsyncs it, renames it over `path` and fsyncs the directory:
// readers see the old content or the new, never a part.
[[nodiscard]] Status replaceFileAtomically(const std::string& path, std::string_view content);
// Renames directory `from` to `to`; when `to` exists, the two are exchanged atomically
// (renameat2 RENAME_EXCHANGE) and the old one, now at `from`, is removed.
[[nodiscard]] Status renameDirIntoPlace(const std::string& from, const std::string& to);

uint64_t xxh64(const void* data, size_t bytes);

// A checkpoint directory for `path`: path itself when it holds a manifest, else the directory
// its `latest` pointer names. Errors name the path.
StatusOr<std::string> resolveCheckpointDir(const std::string& path);

// Data file f of a checkpoint in `dir`, opened, its size checked against the manifest (errors
// name the file: missing, unreadable, truncated or replaced).
StatusOr<File> openDataFile(const Manifest& m, const std::string& dir, int f);

// Reads element ranges of a checkpoint's tensors. Each data file is opened on first use and its
// size checked against the manifest. With `verify` every chunk a read touches is read whole and
// its xxh64 checked (reads round out to chunks of <= kChunkElems); without, exactly the range.
class TensorReader {
 public:
  TensorReader(const Manifest& m, std::string dir, bool verify)
      : m_(m), dir_(std::move(dir)), verify_(verify), files_(m.files.size()) {}
  // Elements [begin, end) of tensor `t` into dst.
  [[nodiscard]] Status read(int t, uint64_t begin, uint64_t end, float* dst);
  // Tells the kernel that read(t, begin, end) comes (the bytes it will read, chunks rounded out
  // as read rounds them), so that a load's reads are in flight while earlier chunks are checked
  // and copied; best effort (a file that cannot be opened is left to read() to report).
  void willRead(int t, uint64_t begin, uint64_t end);
  [[nodiscard]] Status readUser(const UserEntry& e, std::string* out);
  uint64_t bytesRead() const { return bytes_read_; }
  std::string filePath(int f) const { return dir_ + "/" + m_.files[f].name; }

 private:
  StatusOr<const File*> file(int f);
  const Manifest& m_;
  std::string dir_;
  bool verify_;
  std::vector<std::optional<File>> files_;
  std::vector<float> buf_;
  uint64_t bytes_read_ = 0;
};

// "fc0.weight" for a tensor of the manifest.
std::string tensorName(const Manifest& m, int t);

}  // namespace hsdp::ckpt
