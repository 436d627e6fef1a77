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
//
// What needs no job (hsdp-ckpt's inspect, verify, reshard, diff and export; the CheckpointReader
// of the Python binding) is declared in hsdp/checkpoint_offline.h, included here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "hsdp/checkpoint_offline.h"  // the offline calls, the reader, ExportOptions
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
  // Elastic mode (docs/elastic.md, "Checkpoints"): one group of the quorum that committed the
  // saved step writes it, the lowest group index present; on the others the save writes nothing
  // (written = false, bytes 0) and returns at once. writer_group: that group; -1 without elastic.
  bool written = true;
  int writer_group = -1;
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
