// Internal to hsdp: the file layer's (hsdp/files.h) implementation that the checkpoint storage
// uses directly -- direct I/O, the page-cache hints, the cache of open files -- and what files.cc
// and dir.cc share. Not installed; a program uses hsdp/files.h.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>

#include "hsdp/files.h"
#include "hsdp/status.h"

namespace hsdp::files {

// ---- direct I/O (O_DIRECT) ----
// A File opened with `direct` holds a second descriptor of the same inode opened with O_DIRECT
// (none where the filesystem refuses it: tmpfs, then every byte goes through the page cache).
// The part of a read or write whose memory and file offset agree modulo kDirectAlign, at least
// kDirectMin bytes, goes around the page cache on it; the unaligned head and tail through the
// cache.
constexpr uint64_t kDirectAlign = 4096;
constexpr size_t kDirectMin = size_t{64} << 10;

// File::openRead, openReadAt, createNew and createNewAt, with direct I/O when `direct`.
StatusOr<File> openRead(const std::string& path, bool direct);
StatusOr<File> openReadAt(const Dir& dir, const std::string& name, bool direct);
StatusOr<File> createNew(const std::string& path, bool direct);
StatusOr<File> createNewAt(const Dir& dir, const std::string& name, bool direct);
// Whether `f` has its O_DIRECT descriptor.
bool isDirect(const File& f);

// ---- page-cache hints, best effort ----
void dropCache(const File& f);         // drop the file's pages (benchmarks: cold reads)
void adviseSequential(const File& f);  // read front to back
void willNeed(const File& f, uint64_t offset, uint64_t bytes);        // read-ahead
void startWriteback(const File& f, uint64_t offset, uint64_t bytes);  // sync_file_range, no wait

// ---- open files ----
// At most `capacity` open files, least recently used closed first: readers of checkpoints with
// many data files (one per saved rank) stay under the open-file limit. get() opens through
// `open` on a miss; a file in use elsewhere (a shared_ptr held) is never closed under its user.
class FileCache {
 public:
  using Opener = std::function<StatusOr<File>(int index)>;
  FileCache(size_t capacity, Opener open) : capacity_(capacity), open_(std::move(open)) {}
  StatusOr<std::shared_ptr<const File>> get(int index);
  size_t capacity() const { return capacity_; }
  size_t openCount() const { return lru_.size(); }

 private:
  struct Slot {
    int index;
    std::shared_ptr<const File> file;
  };
  size_t capacity_;
  Opener open_;
  std::list<Slot> lru_;  // most recent first
};

// How many files a reader may keep open: a quarter of RLIMIT_NOFILE's soft limit, between 4 and
// 256.
size_t openFileBudget();

namespace detail {

Kind kindOfMode(mode_t m);
// `name` must be one path component: no '/', not empty, not . or ..
Status checkComponent(const std::string& dir, const std::string& name);

}  // namespace detail
}  // namespace hsdp::files
