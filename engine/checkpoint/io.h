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

// Direct I/O (O_DIRECT): the part of a read or write whose memory and file offset agree modulo
// kDirectAlign, at least kDirectMin bytes, goes around the page cache; the unaligned head and
// tail (and everything on a filesystem without O_DIRECT, such as tmpfs before Linux 6.6) go
// through it. On these VMs the page cache costs more than the disk (docs/checkpoint.md, "Direct
// I/O").
constexpr uint64_t kDirectAlign = 4096;
constexpr size_t kDirectMin = size_t{64} << 10;

// An open file descriptor, closed on destruction; with `direct`, a second descriptor of the same
// file opened with O_DIRECT (none where the filesystem refuses it).
class File {
 public:
  static StatusOr<File> openRead(const std::string& path, bool direct = false);
  static StatusOr<File> create(const std::string& path, bool direct = false);  // write, truncated
  File() = default;
  ~File();
  File(File&& o) noexcept;
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Appends at the end of what this File wrote.
  [[nodiscard]] Status writeAll(const void* data, size_t bytes);
  [[nodiscard]] Status preadAll(void* data, size_t bytes, uint64_t offset) const;
  // Whether reads and writes can go around the page cache (see kDirectAlign).
  bool direct() const { return dfd_ >= 0; }
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
  void openDirect(int flags);
  [[nodiscard]] Status pwriteAll(int fd, const char* p, size_t bytes);
  [[nodiscard]] Status preadLoop(int fd, char* p, size_t bytes, uint64_t offset) const;
  int fd_ = -1;
  int dfd_ = -1;      // O_DIRECT descriptor of the same file, or -1
  uint64_t pos_ = 0;  // where writeAll appends
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
StatusOr<File> openDataFile(const Manifest& m, const std::string& dir, int f, bool direct = false);

// Reads element ranges of a checkpoint's tensors. Each data file is opened on first use and its
// size checked against the manifest. With `verify` every chunk a read touches is read whole and
// its xxh64 checked (reads round out to chunks of <= kChunkElems); without, exactly the range.
// With `direct`, reads whose destination lines up with the file (a load into the mesh the
// checkpoint was saved on: the staging buffer is laid out as the file) go around the page cache.
class TensorReader {
 public:
  TensorReader(const Manifest& m, std::string dir, bool verify, bool direct = false)
      : m_(m), dir_(std::move(dir)), verify_(verify), direct_(direct), files_(m.files.size()) {}
  // Elements [begin, end) of tensor `t` into dst.
  [[nodiscard]] Status read(int t, uint64_t begin, uint64_t end, float* dst);
  // Every request, as read() would, in order; with `verify`, a whole chunk read in place is
  // fetched on a second thread while this one checks the chunk before it (the disk and the
  // hash overlap). Nothing else may use the reader meanwhile.
  struct Request {
    int t;
    uint64_t begin, end;
    float* dst;
  };
  [[nodiscard]] Status readMany(const std::vector<Request>& requests);
  // Tells the kernel that read(t, begin, end) comes (the bytes it will read, chunks rounded out
  // as read rounds them), so that a load's reads are in flight while earlier chunks are checked
  // and copied; best effort (a file that cannot be opened is left to read() to report).
  void willRead(int t, uint64_t begin, uint64_t end);
  [[nodiscard]] Status readUser(const UserEntry& e, std::string* out);
  uint64_t bytesRead() const { return bytes_read_; }
  std::string filePath(int f) const { return dir_ + "/" + m_.files[f].name; }

 private:
  StatusOr<const File*> file(int f);
  Status checkChunk(int t, const Chunk& c, const File& f, const float* data) const;
  const Manifest& m_;
  std::string dir_;
  bool verify_;
  bool direct_;
  std::vector<std::optional<File>> files_;
  std::vector<float> buf_;
  uint64_t bytes_read_ = 0;
};

// "fc0.weight" for a tensor of the manifest.
std::string tensorName(const Manifest& m, int t);

}  // namespace hsdp::ckpt
