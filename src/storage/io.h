// Internal to storage/: files for checkpoints. POSIX calls wrapped in RAII owners whose errors
// name the path and errno (a full disk is "No space left on device" or, under RLIMIT_FSIZE, "File
// too large", with the file), the atomic-commit helpers (fsync of files and directories, rename,
// a pointer file replaced atomically), and the reader that fetches any element range of a
// checkpoint tensor through the manifest's sorted chunk lists. No MPI.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/files_internal.h"
#include "hsdp/files.h"
#include "hsdp/status.h"
#include "storage/format.h"

namespace hsdp::ckpt {

// Files go through the file layer (hsdp/files.h): data files, manifest and `latest` are opened
// relative to the checkpoint directory, never through a symbolic link, and only when they are
// regular files; every whole-file read is bounded. Its internals (core/files_internal.h: direct
// I/O, the page-cache hints, the cache of open files) are used as they are.
using files::Dir;
using files::File;

// Whether `name` is one hsdp gives a checkpoint by default ("step-" and digits): pruning removes
// only such directories, and only when their manifest carries hsdp's format id.
bool isStepName(const std::string& name);

uint64_t xxh64(const void* data, size_t bytes);

// Refuses an allocation of `bytes` that a checkpoint's manifest asks for when it is more than
// this machine's memory (a manifest's sizes are checked against its files' lengths, which a
// sparse file can make anything): "<what> needs N bytes, more than this machine's M".
[[nodiscard]] Status checkFitsInMemory(uint64_t bytes, const std::string& what);

// A checkpoint directory for `path`: path itself when it holds a manifest, else the directory
// its `latest` pointer names. Errors name the path.
StatusOr<std::string> resolveCheckpointDir(const std::string& path);

// Data file f of a checkpoint in `dir`, opened, its size checked against the manifest (errors
// name the file: missing, unreadable, not a regular file, truncated or replaced).
StatusOr<File> openDataFile(const Manifest& m, const Dir& dir, int f, bool direct = false);

// The data files of a checkpoint in `dir` as a files::FileCache of files::openFileBudget() (least
// recently used closed first), so that a checkpoint of any number of ranks reads under `ulimit
// -n`: index f is data file f, opened by openDataFile on first use (the directory once); an index
// outside the manifest's files is an error. With `sequential` each is read front to back, all of
// it (the kernel reads ahead). `m` must outlive the cache.
files::FileCache dataFiles(const Manifest& m, std::string dir, bool direct = false,
                           bool sequential = false);

// Reads element ranges of a checkpoint's tensors. Each data file is opened on first use and its
// size checked against the manifest. With `verify` every chunk a read touches is read whole and
// its xxh64 checked (reads round out to chunks of <= kChunkElems); without, exactly the range.
// With `direct`, reads whose destination lines up with the file (a load into the mesh the
// checkpoint was saved on: the staging buffer is laid out as the file) go around the page cache.
class TensorReader {
 public:
  TensorReader(const Manifest& m, std::string dir, bool verify, bool direct = false)
      : m_(m), dir_(dir), verify_(verify), files_(dataFiles(m, std::move(dir), direct)) {}
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
  struct Piece;
  Status readPieces(const std::vector<Piece>& pieces, const std::vector<size_t>& whole);
  Status checkChunk(int t, const Chunk& c, const File& f, const float* data) const;
  const Manifest& m_;
  std::string dir_;
  bool verify_;
  files::FileCache files_;
  std::vector<float> buf_;
  uint64_t bytes_read_ = 0;
};

// "fc0.weight" for a tensor of the manifest.
std::string tensorName(const Manifest& m, int t);

}  // namespace hsdp::ckpt
