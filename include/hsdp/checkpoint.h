// Sharded checkpoints: save, exact resume, resume on another mesh, offline tools and the
// safetensors export. docs/checkpoint.md specifies the format; in short, a checkpoint is a
// directory
//     <root>/step-00000042/manifest.json    format version, model, mesh and mode, optimizer,
//                                           every data file's size and xxHash64, and for every
//                                           parameter's master and Adam moments where each of
//                                           its chunks lives (file, offset, elements, xxHash64)
//     <root>/step-00000042/data-00003.bin   one per rank: little-endian fp32 at 64-byte
//                                           aligned offsets (mmap-able)
//     <root>/latest                         the name of the newest committed checkpoint
//
// Saving (ShardedModel::save / saveAsync, collective over the world). Replicas hold the same
// shard, so each rank writes 1/world of the state: shard k's replicas split it into pieces and
// replica r writes piece r (no byte written twice, every rank's disk bandwidth used). The
// commit is atomic: data files go into <root>/.tmp-<name>/, each is fsynced, rank 0 writes the
// manifest last (fsynced), renames the directory into place, fsyncs the root and replaces
// `latest` atomically; keep_last deletes older checkpoints only after that. A process killed
// at any moment leaves the previous checkpoint intact and loadable (a stale .tmp-* directory
// is removed by the next save).
//
// Loading (ShardedModel::load, collective): on any mesh (world size, nodes, intra/inter factors,
// mode, hpZ, offload, precision). Each rank computes the piece of its new shard it reads (its
// replica index splits the shard as on save), finds the saved chunks overlapping it by binary
// search in each tensor's sorted chunk list, reads only those, checks their xxHash64, and the
// replicas all-gather the pieces over the replica group (no file read twice). Everything is
// read and checked before the engine's state is touched: a failed load (a missing or corrupt
// file, a checkpoint of another model) is the same error on every rank and leaves the model
// as it was.
//
// Export and import of full weights (exportSafetensors, loadWeights): safetensors files with
// one tensor per parameter named "<unit>.<param>" (a unit named "h.0" with parameter
// "ln_1.weight" gives "h.0.ln_1.weight", GPT-2's names), HF-style shards plus
// "<stem>.safetensors.index.json" above ExportOptions::max_shard_bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "hsdp/config.h"
#include "hsdp/dtype.h"
#include "hsdp/status.h"

namespace hsdp {

struct SaveOptions {
  // The checkpoint's directory under the root; empty: "step-<8 digits of stepCount()>". An
  // existing checkpoint of that name is replaced atomically.
  std::string name;
  // After the commit, delete all but the newest keep_last checkpoints (directories under the
  // root with a manifest, by step) of the root; 0 keeps all.
  int keep_last = 0;
  // Small user state saved with the checkpoint (data position, RNG seeds, schedule state):
  // key -> bytes. Rank 0's map is saved; load returns it.
  std::map<std::string, std::string> user;
  // How long rank 0 waits for every rank's data file before the commit fails (a rank died).
  double commit_timeout_s = 600;
};

struct SaveResult {
  std::string dir;  // the committed checkpoint directory
  int64_t step = 0;
  uint64_t bytes = 0;           // data bytes of every rank's file
  uint64_t rank_bytes = 0;      // this rank's file
  double snapshot_seconds = 0;  // what saveAsync blocked for (checks; device copies started)
  double seconds = 0;           // saveAsync's start to the commit
};

// Whose optimizer settings (kind, learning rate, betas, eps, weight decay) a model steps with
// after loading a checkpoint's optimizer state (LoadOptions::optimizer_from).
enum class OptimizerFrom {
  kCheckpoint,  // the checkpoint's, as PyTorch's optimizer.load_state_dict restores them
  kConfig,      // the model's own: EngineConfig::adam (and setLearningRate's rate since)
};

struct LoadOptions {
  // Also Adam's moments, the step count and the optimizer settings (optimizer_from); false: the
  // parameters only, the optimizer state and settings stay as they are (fine-tuning).
  bool optimizer_state = true;
  // With optimizer_state: the settings the model steps with from now on. Either way the
  // checkpoint's settings are checked as EngineConfig::adam is (validate(AdamConfig), and a clip
  // norm finite and >= 0): a value out of range (a NaN, a learning rate <= 0, a beta outside
  // [0, 1)) is InvalidArgument naming the checkpoint, the setting and the value, on every rank,
  // and the model is unchanged. LoadResult::optimizer returns them, to compare.
  OptimizerFrom optimizer_from = OptimizerFrom::kCheckpoint;
  // With kCheckpoint: false keeps the model's learning rate (the other settings are restored).
  bool restore_learning_rate = true;
  // Read every touched chunk whole and check its xxHash64 (default); false reads exactly the
  // overlapping bytes and checks nothing but sizes.
  bool verify = true;
};

struct LoadResult {
  std::string dir;  // the checkpoint read (`latest` resolved)
  int64_t step = 0;
  std::map<std::string, std::string> user;
  uint64_t bytes_read = 0;  // by this rank
  double seconds = 0;
  // The optimizer settings the checkpoint holds (with LoadOptions::optimizer_state; checked),
  // whichever LoadOptions::optimizer_from chose; its clip norm is informational (the model keeps
  // EngineConfig::clip_norm).
  AdamConfig optimizer;
  float clip_norm = 0;
};

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

  struct Impl;  // engine/checkpoint/reader.cc

 private:
  explicit CheckpointReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- with a running model: ShardedModel::save / saveAsync / load / loadWeights /
// exportSafetensors (hsdp/sharded_model.h); their options: ----

struct LoadWeightsOptions {
  // Every parameter of the model must be in the file(s) and every tensor of the file(s) in the
  // model; false: parameters not found keep their values and unknown tensors are ignored.
  bool strict = true;
  // Names a parameter's tensor may have: "<prefix><unit>.<param>" for each prefix, in order (the
  // first found wins); {""}: "<unit>.<param>" only. HF's GPT-2 files: {"", "transformer."}.
  std::vector<std::string> prefixes = {""};
  // Tensors of the file(s) that are not parameters (HF's tied "lm_head.weight", attention-mask
  // buffers): skipped, also with strict.
  std::set<std::string> ignore;
};
// ShardedModel::loadWeights(path): initialises parameters from full weights: a .safetensors
// file, or an index (*.safetensors.index.json, or a path "<stem>.safetensors" whose
// "<stem>.safetensors.index.json" exists). Tensors are float32 or bfloat16 (upcast), named
// "<unit>.<param>", of the parameter's shape. Every rank reads only its piece of its shard (the
// replicas all-gather the pieces); the optimizer state and step are untouched. Errors name the
// file and tensor, on every rank, and leave the model as it was.
//
// ShardedModel::exportSafetensors(out): the full parameters (gatherFullParameters of every unit,
// one unit at a time), written by rank 0 exactly as exportCheckpoint writes a checkpoint of the
// same parameters (the same bytes). Returns the files written, on every rank.

}  // namespace hsdp
