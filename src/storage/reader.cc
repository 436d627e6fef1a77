// CheckpointReader (hsdp/checkpoint_offline.h): a checkpoint's tensors, whole, without a job.
// What the Python binding's hsdp.checkpoint.open serves: a tensor that lies in one data file as
// one run is mapped in place (copy on write, so a numpy array over it is writable and the file is
// never changed), any other is assembled from its chunks. Data files come from dataFiles()
// (io.h: the file rules, the manifest's sizes, at most the open-file budget open at once).
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <mutex>
#include <optional>

#include "hsdp/checkpoint_offline.h"
#include "storage/io.h"
#include "storage/offline.h"

namespace hsdp {

using namespace ckpt;

const char* tensorStateName(TensorState s) { return stateName(static_cast<State>(s)); }

// ---- TensorData ----

TensorData::~TensorData() { release(); }

TensorData::TensorData(TensorData&& o) noexcept { *this = std::move(o); }

TensorData& TensorData::operator=(TensorData&& o) noexcept {
  if (this != &o) {
    release();
    data_ = o.data_;
    size_ = o.size_;
    map_base_ = o.map_base_;
    map_bytes_ = o.map_bytes_;
    heap_ = o.heap_;
    o.data_ = nullptr, o.size_ = 0, o.map_base_ = nullptr, o.map_bytes_ = 0, o.heap_ = nullptr;
  }
  return *this;
}

void TensorData::release() {
  if (map_base_) munmap(map_base_, map_bytes_);
  delete[] heap_;
  data_ = nullptr, size_ = 0, map_base_ = nullptr, map_bytes_ = 0, heap_ = nullptr;
}

// ---- CheckpointReader ----

struct CheckpointReader::Impl {
  std::string dir;
  Manifest m;
  std::vector<CheckpointTensor> tensors;
  std::vector<int> first_tensor;  // per entry of `tensors`: the manifest index of its master
  std::mutex mu;                  // guards the readers
  std::optional<hsdp::files::FileCache> files;  // every read's and mapping's data files
  XXH64_state_t* hash = nullptr;
  ~Impl() { XXH64_freeState(hash); }
};

CheckpointReader::CheckpointReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointReader::~CheckpointReader() = default;

StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  HSDP_ASSIGN_OR_RETURN(impl->dir, resolveCheckpointDir(path));
  HSDP_ASSIGN_OR_RETURN(impl->m, readManifest(impl->dir));
  const Manifest& m = impl->m;
  for (size_t u = 0; u < m.units.size(); ++u)
    for (size_t p = 0; p < m.units[u].params.size(); ++p) {
      const ParamDesc& pd = m.units[u].params[p];
      impl->tensors.push_back({ckpt::joinedName(m.units[u].name, pd.name), m.units[u].name, pd.name,
                               pd.shape, pd.numel(), !m.units[u].frozen});
      impl->first_tensor.push_back(
          m.tensorIndex(static_cast<int>(u), static_cast<int>(p), State::kParam));
    }
  impl->files.emplace(dataFiles(impl->m, impl->dir));
  impl->hash = XXH64_createState();
  if (!impl->hash) return Status(StatusCode::kResourceExhausted, "XXH64_createState failed");
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(std::move(impl)));
}

const std::string& CheckpointReader::dir() const { return impl_->dir; }
int64_t CheckpointReader::step() const { return impl_->m.step; }
const std::vector<CheckpointTensor>& CheckpointReader::tensors() const { return impl_->tensors; }

int CheckpointReader::find(const std::string& name) const {
  for (size_t i = 0; i < impl_->tensors.size(); ++i)
    if (impl_->tensors[i].name == name) return static_cast<int>(i);
  return -1;
}

StatusOr<std::string> CheckpointReader::summaryJson(bool checksums) const {
  if (!checksums) return checkpointSummaryJson(impl_->dir, impl_->m, nullptr);
  std::vector<Status> checks;
  for (size_t f = 0; f < impl_->m.files.size(); ++f)
    checks.push_back(verifyDataFile(impl_->dir, impl_->m, static_cast<int>(f)));
  // A machine's failure (an I/O error, the open-file limit) is the answer, not a checksum result.
  for (const Status& s : checks)
    if (!s.ok() && s.code() != StatusCode::kInvalidArgument && s.code() != StatusCode::kNotFound)
      return s;
  return checkpointSummaryJson(impl_->dir, impl_->m, &checks);
}

Status CheckpointReader::verify() const {
  for (size_t f = 0; f < impl_->m.files.size(); ++f)
    HSDP_RETURN_IF_ERROR(verifyDataFile(impl_->dir, impl_->m, static_cast<int>(f)));
  return okStatus();
}

namespace {

// The manifest index of tensor t's state, or NotFound naming it.
StatusOr<int> manifestIndex(const Manifest& m, const std::vector<CheckpointTensor>& tensors,
                            const std::vector<int>& first, int t, TensorState s) {
  if (t < 0 || t >= static_cast<int>(tensors.size()))
    return invalidArgument("tensor index ", t, " of a checkpoint of ", tensors.size(), " tensors");
  if (s != TensorState::kParam && !tensors[t].has_moments)
    return notFound("tensor ", tensors[t].name, " has no ", tensorStateName(s), " (its unit '",
                    tensors[t].unit, "' was frozen when saved)");
  const int i = first[t] + static_cast<int>(s);
  if (first[t] < 0 || i >= static_cast<int>(m.tensors.size()) ||
      m.tensors[i].state != static_cast<State>(s))
    return internalError("checkpoint manifest has no ", tensorStateName(s), " for ",
                         tensors[t].name);
  return i;
}

bool isContiguous(const TensorDesc& d) {
  for (size_t i = 1; i < d.chunks.size(); ++i) {
    const Chunk& a = d.chunks[i - 1];
    const Chunk& b = d.chunks[i];
    if (b.file != a.file || b.offset != a.offset + a.count * sizeof(float)) return false;
  }
  return !d.chunks.empty();
}

// Manifest tensor i into dst from every file that holds a chunk of it. With verify each chunk is
// read in blocks small enough to stay in cache and each block hashed as soon as it lands, so the
// checksum reads the cache and not memory again (on this 2-core VM the read and hash of a chunk
// whole, even overlapped on two threads, ran at half the speed of a plain read).
Status assemble(CheckpointReader::Impl& im, int i, float* dst, bool verify) {
  const TensorDesc& d = im.m.tensors[i];
  constexpr uint64_t kBlock = uint64_t{256} << 10;
  for (const Chunk& c : d.chunks) {
    HSDP_ASSIGN_OR_RETURN(std::shared_ptr<const File> f, im.files->get(c.file));
    char* to = reinterpret_cast<char*>(dst + c.start);
    const uint64_t bytes = c.count * sizeof(float);
    if (!verify) {
      HSDP_RETURN_IF_ERROR(f->preadAll(to, bytes, c.offset));
      continue;
    }
    XXH64_reset(im.hash, 0);
    for (uint64_t at = 0; at < bytes; at += kBlock) {
      const size_t n = static_cast<size_t>(std::min(kBlock, bytes - at));
      HSDP_RETURN_IF_ERROR(f->preadAll(to + at, n, c.offset + at));
      XXH64_update(im.hash, to + at, n);
    }
    if (XXH64_digest(im.hash) != c.xxh64)
      return invalidArgument("data file '", files::quote(f->path()), "': bytes [", c.offset, ", ",
                             c.offset + bytes, ") of tensor ", tensorName(im.m, i),
                             " fail their xxh64 checksum (corrupt file)");
  }
  return okStatus();
}

}  // namespace

bool CheckpointReader::contiguous(int t, TensorState s) const {
  auto i = manifestIndex(impl_->m, impl_->tensors, impl_->first_tensor, t, s);
  return i.ok() && isContiguous(impl_->m.tensors[*i]);
}

StatusOr<TensorData> CheckpointReader::read(int t, TensorState s, bool verify, bool map) {
  Impl& im = *impl_;
  HSDP_ASSIGN_OR_RETURN(int i, manifestIndex(im.m, im.tensors, im.first_tensor, t, s));
  const TensorDesc& d = im.m.tensors[i];
  const uint64_t n = im.tensors[t].numel;
  const std::string what = strCat("tensor ", tensorName(im.m, i));
  TensorData out;
  if (n == 0) return out;
  std::lock_guard<std::mutex> lock(im.mu);
  if (map && isContiguous(d)) {
    HSDP_ASSIGN_OR_RETURN(std::shared_ptr<const File> f, im.files->get(d.chunks.front().file));
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t offset = d.chunks.front().offset, aligned = offset / page * page;
    const size_t bytes = static_cast<size_t>(offset - aligned + n * sizeof(float));
    // Private and writable: numpy and DLPack consumers get a writable array, and a write lands in
    // this process's copy of the page only. (Not MAP_POPULATE: on a private writable mapping it
    // write-faults, copying every page.) With verify every page is read at once, in order.
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE, f->fd(),
                      static_cast<off_t>(aligned));
    if (base == MAP_FAILED) return files::errnoStatus("mmap for " + what, f->path(), errno);
    madvise(base, bytes, verify ? MADV_WILLNEED : MADV_NORMAL);
    out.map_base_ = base;
    out.map_bytes_ = bytes;
    out.data_ = reinterpret_cast<float*>(static_cast<char*>(base) + (offset - aligned));
    out.size_ = n;
    if (verify)
      for (const Chunk& c : d.chunks)
        if (xxh64(out.data_ + c.start, c.count * sizeof(float)) != c.xxh64)
          return invalidArgument("data file '", files::quote(f->path()), "': bytes [", c.offset,
                                 ", ", c.offset + c.count * 4, ") of ", what,
                                 " fail their xxh64 checksum (corrupt file)");
    return out;
  }
  HSDP_RETURN_IF_ERROR(checkFitsInMemory(n * sizeof(float), what));
  out.heap_ = new (std::nothrow) float[n];
  if (!out.heap_)
    return Status(StatusCode::kResourceExhausted,
                  strCat(what, " needs ", n * sizeof(float), " bytes: allocation failed"));
  out.data_ = out.heap_;
  out.size_ = n;
  HSDP_RETURN_IF_ERROR(assemble(im, i, out.data_, verify));
  return out;
}

Status CheckpointReader::readInto(int t, TensorState s, float* dst, bool verify) {
  Impl& im = *impl_;
  HSDP_ASSIGN_OR_RETURN(int i, manifestIndex(im.m, im.tensors, im.first_tensor, t, s));
  // As read(): a size only a sparse file can back is refused before a byte lands in dst.
  HSDP_RETURN_IF_ERROR(checkFitsInMemory(im.tensors[t].numel * sizeof(float),
                                         strCat("tensor ", tensorName(im.m, i))));
  std::lock_guard<std::mutex> lock(im.mu);
  return assemble(im, i, dst, verify);
}

}  // namespace hsdp
