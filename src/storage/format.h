// Internal to storage/: the checkpoint's on-disk format (docs/checkpoint.md is its spec). A
// checkpoint is a directory holding manifest.json and one data file per writing rank; this file
// is the manifest as data (Manifest), its JSON reader and writer, and the layout arithmetic that
// decides which rank writes which bytes where (one plan for the engine's save, the offline
// reshard and every reader). Nothing here needs MPI: hsdp-ckpt links it without starting a job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "hsdp/mesh_shape.h"
#include "hsdp/status.h"

namespace hsdp::ckpt {

constexpr int kFormatVersion = 1;
// A semi-synchronous save (docs/checkpoint.md, "Semi-synchronous replicas"): the same layout
// rules, other units (every replica's own copy, and the outer state), and `replica_sync`.
constexpr int kSemiSyncFormatVersion = 2;
constexpr const char* kFormatName = "hsdp-checkpoint";
// Size limits of the small files of a checkpoint (docs/checkpoint.md, "File rules").
constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;
constexpr uint64_t kMaxPointerBytes = 4096;  // `latest`
constexpr uint64_t kMaxPartBytes = uint64_t{256} << 20;
constexpr uint64_t kMaxUserEntryBytes = uint64_t{1} << 30;  // SaveOptions::user blobs

constexpr const char* kManifestName = "manifest.json";
constexpr const char* kLatestName = "latest";
// Every chunk starts at a multiple of this in its data file (mmap, SIMD loads).
constexpr uint64_t kAlign = 64;
// A chunk holds at most this many elements (4 MiB of fp32): the unit of checksums, so a reader
// that reads part of a tensor verifies what it read by reading whole chunks.
constexpr uint64_t kChunkElems = uint64_t{1} << 20;

// The per-parameter arrays a checkpoint holds: the fp32 master and Adam's two moments (frozen
// units have no moments).
enum class State { kParam = 0, kExpAvg = 1, kExpAvgSq = 2 };
const char* stateName(State s);
constexpr int kStates = 3;

struct ParamDesc {
  std::string name;
  std::vector<int64_t> shape;
  bool weight_decay = true;
  uint64_t numel() const;
};

// The name a checkpoint and a safetensors file give parameter `param` of unit `unit`:
// "<unit>.<param>", or `param` alone in the root unit (the unit named "": a model's own
// parameters, hsdp.torch's root).
std::string joinedName(std::string_view unit, std::string_view param);

struct UnitDesc {
  std::string name;
  bool frozen = false;
  std::vector<ParamDesc> params;
  uint64_t numel() const;
  uint64_t offset(size_t param) const;  // of param in the unit's flat buffer, in elements
  int states() const { return frozen ? 1 : kStates; }
};

// What a checkpoint was laid out and saved under (the manifest's "mesh" object): the mesh it was
// saved on (hsdp/mesh_shape.h's MeshShape), the shard and replica counts that decide the layout
// (shards is the engine's shard count: 1 in mode none), and the rest, informational.
struct SavedUnder {
  MeshShape mesh{1, 1, 1, 1, 1};  // world_size, num_nodes, ranks_per_node, intra and inter shard
  int shards = 1;
  int replicas = 1;
  std::string mode = "none";
  bool hpz = false;
  bool offload_cpu = false;
  std::string param_dtype = "float32";
  std::string reduce_dtype = "float32";
  std::string device = "cpu";
  // An elastic replica group's save (docs/elastic.md): the job, this group, the step whose
  // quorum it was saved under and the groups that quorum had. Empty job: not elastic.
  std::string elastic_job;
  int elastic_group = -1;
  int64_t elastic_step = -1;
  std::vector<int> elastic_present;
};

struct OptimDesc {
  std::string kind = "adamw";
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, clip_norm = 0;
};

// Elements [start, start + count) of one tensor, at byte `offset` of data file `file`,
// little-endian fp32, with the xxHash64 (seed 0) of its count*4 bytes.
struct Chunk {
  int file = 0;
  uint64_t offset = 0;
  uint64_t start = 0;
  uint64_t count = 0;
  uint64_t xxh64 = 0;
};

struct TensorDesc {
  int unit = 0;
  int param = 0;
  State state = State::kParam;
  std::vector<Chunk> chunks;  // sorted by start, tiling [0, numel) exactly
};

struct FileDesc {
  std::string name;  // relative to the checkpoint directory
  int rank = 0;      // the world rank that wrote it, and its place in the mesh
  int shard = 0;
  int replica = 0;
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;  // of the whole file
};

// One user blob: `bytes` bytes at `offset` of data file `file`.
struct UserEntry {
  std::string key;
  int file = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

// The manifest's `replica_sync` object (format_version 2 only): the policy a semi-synchronous
// checkpoint was saved under. Its units are the model's once per replica
// (replicaUnitName) and, for diloco, the outer anchor and momentum of every trainable unit
// (outerUnitName), frozen (one state each).
struct ReplicaSyncDesc {
  std::string policy;  // local_sgd or diloco
  int sync_every = 1, fragments = 1, replicas = 2;
  int sync_delay = 0;  // streaming's tau; written only when > 0 (older manifests: 0)
  float outer_lr = 0, outer_momentum = 0;
  int64_t step_in_period = 0;  // step % sync_every
  int model_units = 0;         // units per replica
};
// "replica<r>/<unit>", "outer_anchor/<unit>", "outer_momentum/<unit>".
std::string replicaUnitName(int replica, std::string_view unit);
std::string outerUnitName(bool momentum, std::string_view unit);

struct Manifest {
  int version = kFormatVersion;
  int64_t step = 0;
  std::string created;  // UTC, ISO 8601
  std::vector<UnitDesc> units;
  SavedUnder saved;
  OptimDesc optim;
  std::vector<FileDesc> files;
  std::vector<TensorDesc> tensors;  // unit order, then parameter order, then state order
  std::vector<UserEntry> user;
  bool semi_sync = false;  // format_version 2: `replica_sync` holds the policy
  ReplicaSyncDesc replica_sync;

  // Index into `tensors` of (unit, param, state); -1 when absent (a frozen unit's moments).
  int tensorIndex(int unit, int param, State s) const;
  uint64_t dataBytes() const;
  std::vector<int> first_tensor;  // per unit: index of its first tensor (filled by finish())
  // Fills first_tensor and checks that the tensors are exactly those of `units`, in order.
  [[nodiscard]] Status finish(const std::string& where);
};

// Parses and checks a manifest: every field's type and range, every tensor's chunks tiling its
// parameter, every chunk inside its file. Errors are InvalidArgument naming `where` (the path)
// and the field.
StatusOr<Manifest> parseManifest(std::string_view json, const std::string& where);
std::string serializeManifest(const Manifest& m);
// A semi-synchronous checkpoint holds one copy of the model per replica: the tools that read it as
// one model (reshard, export, the tensor reader) refuse it, naming `verb`, the directory and the
// policy. OK for any other checkpoint.
[[nodiscard]] Status refuseSemiSync(const Manifest& m, const std::string& dir,
                                    std::string_view verb);
// "<dir>/manifest.json", read and parsed; a missing file is NotFound naming it.
StatusOr<Manifest> readManifest(const std::string& dir);

// The first difference between a checkpoint's units and a model's (names, shapes; with
// `moments`, a unit frozen when saved but trainable now), as InvalidArgument naming `where`.
[[nodiscard]] Status compareUnits(const std::vector<UnitDesc>& saved,
                                  const std::vector<UnitDesc>& model, const std::string& where,
                                  bool moments);
std::string shapeString(const std::vector<int64_t>& shape);  // "[1000, 32]"
// The names checkpoints and safetensors files give tensors, "<unit>.<param>", are unique: two
// units of one name, two parameters of one name in a unit, and two (unit, parameter) pairs whose
// joined names collide (unit 'a.b' parameter 'c', unit 'a' parameter 'b.c') are InvalidArgument
// naming both, prefixed by `where` (when not empty).
[[nodiscard]] Status checkTensorNames(const std::vector<UnitDesc>& units, const std::string& where);
// The first key that some object of the JSON text `json` holds twice (nlohmann-json, like most
// parsers, silently keeps the last), as "'key' in <path>" ("'lr' in optimizer", "'w' at the top
// level"); "" when no key repeats, or when `json` is not valid JSON (the parse reports that).
std::string duplicateJsonKey(std::string_view json);

// "0123456789abcdef" and back.
std::string hex64(uint64_t v);

// ---- the layout: which rank writes which elements, where in its file ----
// Shard k of a unit holds flat elements [k*s, (k+1)*s), s = ceil(numel / shards); its R
// replicas split it into pieces of p = ceil(s / R) elements, and replica r writes piece r. So
// every world rank writes 1/world of the model and no byte is written twice.
struct Piece {
  uint64_t begin = 0, end = 0;  // flat elements, clipped to the unit's numel (may be empty)
};
Piece pieceOf(uint64_t numel, int shards, int replicas, int shard, int replica);

// One planned chunk of a rank's data file, for tensor `tensor` of the manifest order.
struct PlannedChunk {
  int tensor = 0;
  uint64_t start = 0, count = 0;  // elements of the parameter
  uint64_t flat = 0;              // where they start in the unit's flat buffer
  uint64_t offset = 0;            // byte offset in the data file
};
struct FilePlan {
  std::vector<PlannedChunk> chunks;  // in file order
  uint64_t bytes = 0;                // data bytes, before any user blobs
};
// The tensors of `units` in manifest order: (unit, param, state).
std::vector<TensorDesc> tensorList(const std::vector<UnitDesc>& units);
// The chunks the rank at (shard, replica) writes, for tensors as tensorList orders them.
FilePlan planFile(const std::vector<UnitDesc>& units, int shards, int replicas, int shard,
                  int replica);
uint64_t alignUp(uint64_t v, uint64_t a = kAlign);

// The name of world rank w's data file: "data-00003.bin".
std::string dataFileName(int rank);

}  // namespace hsdp::ckpt
