// Checkpoints without a job (no MPI, no model): what build/tools/hsdp-ckpt runs and the Python
// binding's hsdp.checkpoint.open reads through. Inspect, verify, reshard for another mesh, diff
// two checkpoints, export a checkpoint's parameters as safetensors, and read any tensor whole.
// The storage module's (src/storage/); hsdp/checkpoint.h includes this header and adds what a
// running model saves and loads with, so a program includes that one. docs/checkpoint.md
// specifies the format.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hsdp/dtype.h"
#include "hsdp/mesh_shape.h"
#include "hsdp/status.h"

namespace hsdp {

// ---- offline (no MPI, no job): what build/tools/hsdp-ckpt runs ----

// Progress of the long offline calls (verifyCheckpoint, reshardCheckpoint, exportCheckpoint,
// diffCheckpoints): `phase` ("planning", "copying", "writing files", "verifying", "exporting",
// "comparing"), `done` of `total` in `unit` ("bytes", "files", "ranks"). The callback set by
// setOfflineProgress (none by default) runs on the calling thread, often (throttle in it).
// The same calls poll hsdp::stopRequested() (hsdp/stop.h; hsdp-ckpt installs SIGINT and SIGTERM):
// once a stop is requested they remove what they created (temporaries, a partial output) and
// return kAborted "stopped by SIGTERM while <phase>: <done> of <total> <unit> done; <what was
// left>", the input untouched.
struct OfflineProgress {
  const char* phase = "";
  const char* unit = "";
  uint64_t done = 0, total = 0;
};
void setOfflineProgress(std::function<void(const OfflineProgress&)> fn);

// A table (or with `json` the manifest's summary as JSON): step, mode and mesh, units and
// parameters with shapes, bytes per file, and whether every file's checksum holds.
StatusOr<std::string> inspectCheckpoint(const std::string& path, bool json);
// Recomputes every data file's xxHash64 (and, for a failing file, every chunk's); the error
// names the file and the byte range that fails, or the missing/truncated file.
[[nodiscard]] Status verifyCheckpoint(const std::string& path);

// The mesh a checkpoint is laid out for: the ranks of a job as consecutive nodes of
// ranks_per_node (HSDP_RANKS_PER_NODE's layout).
struct MeshTarget {
  int world_size = 1;
  int ranks_per_node = 1;
  int intra_shard = 1;
  int inter_shard = 1;
  ShardMode mode = ShardMode::kZero3;
};
// Writes the checkpoint at `in` (a checkpoint directory or a root with `latest`) laid out for
// `target` into the new directory `out` (committed as save commits), streaming: memory stays at
// one chunk buffer, whatever the model size. Every input chunk's checksum is checked on the way.
// Loading `out` on that mesh reads each rank's own chunks only.
[[nodiscard]] Status reshardCheckpoint(const std::string& in, const std::string& out,
                                       const MeshTarget& target);

struct TensorDiff {
  std::string name;  // "fc0.weight", "fc0.weight (exp_avg)"
  double max_abs = 0;
  double max_rel = 0;  // max |a - b| / max |b|
};
struct CheckpointDiff {
  int64_t step_a = 0, step_b = 0;
  std::vector<TensorDiff> tensors;  // every tensor both hold (a frozen unit has no moments)
  bool identical() const;           // same step, every difference 0
};
// Per tensor (parameters and moments) of two checkpoints of one model, on any meshes; streams
// both, checking every chunk's checksum. Checkpoints of different models are InvalidArgument
// naming the first difference.
StatusOr<CheckpointDiff> diffCheckpoints(const std::string& a, const std::string& b);

struct ExportOptions {
  DType dtype = DType::kFloat32;  // kFloat32 or kBFloat16 (rounded to nearest even)
  // Above this many bytes of tensor data, HF-style shards "<stem>-00001-of-0000n.safetensors"
  // beside `out` plus "<stem>.safetensors.index.json" instead of one file.
  uint64_t max_shard_bytes = uint64_t{4} << 30;
};
// The full (unsharded) fp32 master parameters of a checkpoint as safetensors; returns the files
// written (the index last when sharded). Streams tensor by tensor.
StatusOr<std::vector<std::string>> exportCheckpoint(const std::string& ckpt, const std::string& out,
                                                    const ExportOptions& options = {});

// ---- reading tensors without a job (the Python binding's hsdp.checkpoint.open) ----

// The arrays a checkpoint keeps per parameter: the fp32 master and Adam's two moments.
enum class TensorState { kParam = 0, kExpAvg = 1, kExpAvgSq = 2 };
const char* tensorStateName(TensorState s);  // "param", "exp_avg", "exp_avg_sq"

struct CheckpointTensor {
  std::string name;  // "<unit>.<param>", the name exportCheckpoint gives it
  std::string unit, param;
  std::vector<int64_t> shape;
  uint64_t numel = 0;
  bool has_moments = false;  // false in a frozen unit (no Adam state)
};

// One tensor's fp32 elements, owned: either the data file's bytes mapped in place (copy on write:
// writing to it changes this copy only, never the file) or a buffer they were assembled into.
class TensorData {
 public:
  TensorData() = default;
  ~TensorData();
  TensorData(TensorData&& o) noexcept;
  TensorData& operator=(TensorData&& o) noexcept;
  float* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool mapped() const { return map_base_ != nullptr; }

 private:
  friend class CheckpointReader;
  void release();
  float* data_ = nullptr;
  uint64_t size_ = 0;
  void* map_base_ = nullptr;  // mmap'ed: munmap(map_base_, map_bytes_)
  size_t map_bytes_ = 0;
  float* heap_ = nullptr;  // assembled: delete[]
};

// An opened checkpoint (a directory, or a root whose `latest` names one): the manifest is read and
// checked on open; data files are opened when a tensor is read (the same file rules as every
// other reader: no symbolic links, regular files of the manifest's sizes). Safe to use from
// several threads (reads are serialised).
class CheckpointReader {
 public:
  static StatusOr<std::unique_ptr<CheckpointReader>> open(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::string& dir() const;  // `latest` resolved
  int64_t step() const;
  const std::vector<CheckpointTensor>& tensors() const;  // unit order, then parameter order
  int find(const std::string& name) const;               // index in tensors(), -1 if absent
  // inspectCheckpoint's JSON; with `checksums` every data file is hashed (reads every byte),
  // without, "checksum_ok" and "checksums_ok" are null.
  StatusOr<std::string> summaryJson(bool checksums) const;
  // Every data file's checksum, as verifyCheckpoint.
  [[nodiscard]] Status verify() const;
  // Whether tensor t's state lies in one data file as one run of bytes (a checkpoint saved on one
  // rank, or a tensor inside one rank's piece): read() then maps it instead of copying.
  bool contiguous(int t, TensorState s) const;
  // Tensor t's state, whole: mapped in place when contiguous() and `map`, else assembled from
  // the chunks of every file that holds a piece. With `verify` every chunk's xxHash64 is checked
  // (the error names the file and byte range). NotFound for a frozen unit's moments; a tensor too
  // large for this machine's memory is an error naming it, before anything is allocated.
  StatusOr<TensorData> read(int t, TensorState s, bool verify = true, bool map = true);
  // Tensor t's state, whole, assembled into the caller's `dst` (tensors()[t].numel floats), e.g.
  // an array its own allocator made; the same checks as read().
  [[nodiscard]] Status readInto(int t, TensorState s, float* dst, bool verify = true);

  struct Impl;  // storage/reader.cc

 private:
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hsdp
