// Engine configuration: sharding mode, optimizer, precision, offload and the collectives'
// settings. Every setting the engine has is a field here; the fields that also have an HSDP_*
// environment variable are optionals: left unset, ShardedModel::create() fills them from the
// environment, else from the default (resolveEngineConfig). docs/api.md lists every field.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "hsdp/cpu_isa.h"
#include "hsdp/dtype.h"
#include "hsdp/mesh_shape.h"
#include "hsdp/optimizer.h"
#include "hsdp/status.h"
#include "hsdp/wire.h"

namespace hsdp {

// ShardMode (none, zero1, zero2, zero3), parseShardMode and shardModeName: hsdp/mesh_shape.h.

// Where the engine keeps model state (ShardedModel, sharded_model.h).
enum class Device {
  kHost,  // host memory; the collectives run on the mesh's transports (MPI, UCX)
  kCuda,  // device memory of the CUDA device current at ShardedModel::create(); NCCL mesh
};

StatusOr<Device> parseDevice(std::string_view name);  // "cpu" -> kHost, "cuda" -> kCuda
const char* deviceName(Device d);                     // "cpu" | "cuda"

// The settings, grouped by what they decide. The top-level fields say what is sharded and how it
// is optimized; each policy below is one concern. Fields that also have an HSDP_* variable are
// optionals: left unset, resolveEngineConfig() fills them from the environment, else from the
// default. Errors about a field name it by its path, e.g. "EngineConfig::pipeline.chunks".

// The dtypes parameters and gradients move in (shard groups larger than one). bf16 parameters:
// the fp32 master shard is rounded to bf16, gathered as 2-byte data and upcast for compute. bf16
// gradients: reduce-scattered in bf16, summed hop by hop, upcast into the fp32 gradient shard.
// Master weights and optimizer state stay fp32.
struct PrecisionPolicy {
  DType param_dtype = DType::kFloat32;
  DType reduce_dtype = DType::kFloat32;
};

// The wires across nodes and replicas (docs/collectives.md, "Wire formats").
struct WirePolicy {
  // Wire type of the inter-node phase for float32 data: kFloat32 or kBFloat16 (half the bytes
  // across nodes; the reduction across nodes rounds to bf16). HSDP_INTER_DTYPE; default float32.
  // The shorthand for both inter wires below: it is the default of any of them left unset.
  std::optional<DType> inter_dtype;
  // Inter-node wire of the parameter all-gathers: fp32, bf16, int8 or int4 (block-quantized:
  // the fp32 master shard is encoded once per step, after the optimizer step, and every gather
  // of the step decodes the same codes). int8/int4 need zero3, the hierarchical host schedules
  // and fp32 param_dtype; with inter_shard 1 nothing crosses nodes and nothing is quantized.
  // HSDP_INTER_PARAM_WIRE; default: inter_dtype's (fp32 or bf16).
  std::optional<Wire> inter_param_wire;
  // Inter-node wire of the gradient reduce-scatters: fp32, bf16, int8 or int4 (int8/int4: an
  // all-to-all of encoded pieces, each rank sums its block in fp32, with error feedback). Needs
  // the hierarchical host schedules and fp32 reduce_dtype. HSDP_INTER_GRAD_WIRE; default:
  // inter_dtype's.
  std::optional<Wire> inter_grad_wire;
  // Wire of the all-reduce of gradient shards over the data-parallel replicas (mode none: the
  // whole gradient over the world): fp32 (exact, the transport's own all-reduce), or bf16, int8,
  // int4 (an all-to-all of encoded pieces summed in fp32, the sum encoded once and all-gathered:
  // every replica decodes the same bytes). Host only. HSDP_REPLICA_WIRE; default fp32.
  std::optional<Wire> replica_wire;
  // Elements per fp32 scale of the int8/int4 wires: a multiple of 16 in [16, 2^20].
  // HSDP_QUANT_BLOCK; default 2048 (int8 then moves 0.2505x the bytes of fp32).
  std::optional<uint32_t> quant_block;
  // Error feedback for the encoded gradient wires (int8/int4 inter gradient wire, any encoded
  // replica wire): each rank keeps what its encoding dropped (a buffer per unit, allocated once)
  // and adds it to what it sends next step. HSDP_GRAD_ERROR_FEEDBACK; default on.
  std::optional<bool> grad_error_feedback;
};

// How gathers and reductions are scheduled and how far ahead units are gathered.
struct PipelinePolicy {
  // Gathers and reductions as two-level schedules over the intra and inter levels (true), or as
  // one collective over the shard group (false). HSDP_HIER; default true. Ignored on a device
  // (NCCL runs its own hierarchy inside one communicator).
  std::optional<bool> hierarchical;
  // Chunks per hierarchical collective, pipelined (chunk c's intra phase overlaps chunk c+1's
  // inter phase); in [1, 4096]. HSDP_PIPELINE_CHUNKS. Unset: up to 32 chunks of at least
  // min_chunk_bytes each; set: exactly this many, unless a minimum is set too.
  std::optional<int> chunks;
  // Smallest chunk (bytes of the gathered unit) when pipelining; 0: always `chunks`.
  // HSDP_PIPELINE_MIN_CHUNK_BYTES; default 1 MiB when `chunks` is unset, else 0.
  std::optional<size_t> min_chunk_bytes;
  // Rate limiter (zero3): at most this many units gathered at once; an unshard() beyond it is
  // issued when an earlier unit is resharded (or when it is waited for). 0: no limit.
  int max_gathered_units = 0;
};

// The optimizer step on the CPU (host shards and CPU offload).
struct OffloadPolicy {
  // Optimizer state (fp32 master, Adam moments) in NUMA-local host memory, stepped by the SIMD
  // CPU Adam on a worker thread as soon as each unit's gradient is reduced, overlapping the rest
  // of backward. Needs a sharded optimizer (zero1, zero2, zero3).
  bool cpu = false;
  // Threads of the CPU Adam step (host shards, with or without offload), the caller included;
  // >= 1. HSDP_CPU_ADAM_THREADS; default 1 (ranks share a node's cores, and the pool does not
  // know about the other ranks).
  std::optional<int> adam_threads;
  // The CPU Adam's kernel: avx512, avx2 or scalar. HSDP_CPU_ADAM_ISA; default the best this CPU
  // runs.
  std::optional<CpuIsa> adam_isa;
};

// Checkpoints (hsdp/checkpoint.h).
struct CheckpointPolicy {
  // The data files of save and load go around the page cache (O_DIRECT) where the filesystem
  // allows it (elsewhere, e.g. tmpfs before Linux 6.6, buffered): no page-cache copy, and where
  // fresh memory is slow to fault in, no page cache to fill. HSDP_CKPT_DIRECT_IO; default on.
  // docs/checkpoint.md, "Direct I/O".
  std::optional<bool> direct_io;
};

// What a stalled or failed peer costs.
struct FailurePolicy {
  // Seconds a wait of the engine or a transport may go without progress before the watchdog
  // ends the job, naming the collective and the ranks that did not arrive (hsdp/watchdog.h,
  // docs/reliability.md); > 0, the same on every rank. HSDP_TIMEOUT_S; default 600. The
  // watchdog is one per process: ShardedModel::create sets its timeout (the last model wins).
  std::optional<double> timeout_s;
};

// Elastic replica groups (docs/elastic.md): this process's group is one replica of the model, its
// own MPI job; the replica level between groups runs over TCP, and membership and each step's
// commit over etcd. Off while `endpoint` is empty. With it on, the mesh must have no replicas of
// its own (the groups are the replicas), the state lives in host memory, and the training loop
// calls beginStep() before each step's forward and repeats a step that returns kAborted.
enum class ElasticData {
  // Each group trains on its own slice of the global batch (slot = its group index, of
  // `groups`): with a group missing, the global batch shrinks by its share.
  kKeepSlice,
  // The groups present share the whole global batch (slot = the group's place in the step's
  // quorum, of the quorum's size): the batch stays the same, each group's share grows.
  kRedistribute,
};
StatusOr<ElasticData> parseElasticData(std::string_view name);  // "keep", "redistribute"
const char* elasticDataName(ElasticData d);

struct ElasticPolicy {
  // etcd's client URL ("http://host:2379"); "" turns elastic mode off. HSDP_ELASTIC_ENDPOINT.
  std::optional<std::string> endpoint;
  // The job's name in etcd ([A-Za-z0-9_.-]+). HSDP_ELASTIC_JOB; default "hsdp".
  std::optional<std::string> job;
  // This group's index in [0, groups) (its name is "g<index>") and the number of groups the job
  // starts with (the first step waits for all of them). HSDP_ELASTIC_GROUP_INDEX,
  // HSDP_ELASTIC_GROUPS; hsdp-elastic sets both.
  std::optional<int> group_index;
  std::optional<int> groups;
  // The host this rank publishes beside its replica-level (UCX) address, where its group's alarm
  // listens. HSDP_ELASTIC_HOST; default: the local address of the route to the etcd endpoint.
  std::optional<std::string> host;
  // Times the launcher restarted this group (HSDP_ELASTIC_RESTARTS; hsdp-elastic sets it). > 0:
  // the group's predecessor is dead, and its member key, still on its lease, is replaced.
  std::optional<int> restarts;
  // Which data a group trains on when groups are missing (the slot beginStep() returns).
  // HSDP_ELASTIC_DATA (keep | redistribute); default keep.
  std::optional<ElasticData> data;
};

// Semi-synchronous replicas (docs/semi_sync.md): how the replica groups (the shard groups of the
// mesh) keep their copies of the model together. kSync averages every step's gradient over the
// replicas (today's data parallelism). The other two reduce gradients inside the shard group only
// and let each replica take `sync_every` (H) inner optimizer steps on its own data, then: kLocalSgd
// averages the parameter shards over the replicas; kDiloco averages the outer gradient (the
// parameters at the last sync minus the current ones) and applies it with outer Nesterov SGD
// (outer_lr, outer_momentum; the momentum and the anchor sharded like the inner state).
enum class ReplicaPolicy { kSync, kLocalSgd, kDiloco };
StatusOr<ReplicaPolicy> parseReplicaPolicy(std::string_view name);  // sync, local_sgd, diloco
const char* replicaPolicyName(ReplicaPolicy p);

struct ReplicaSyncPolicy {
  ReplicaPolicy policy = ReplicaPolicy::kSync;
  // H: inner steps between two syncs (>= 1); ignored by kSync.
  int sync_every = 1;
  // kDiloco's outer Nesterov SGD (the DiLoCo paper's values): lr finite and > 0, momentum in
  // [0, 1).
  float outer_lr = 0.7f;
  float outer_momentum = 0.9f;
  // Streaming: the units split into F fragments synced at staggered steps; in [1, units].
  int fragments = 1;
  // Streaming DiLoCo's delay tau: a fragment's outer all-reduce, started after inner step t,
  // overlaps the next tau inner steps and is applied after step t + tau (the paper's mixing
  // alpha = 0: the fragment takes the synced value). In [0, H); 0: waited for at once.
  int sync_delay = 0;
};

struct EngineConfig {
  ShardMode mode = ShardMode::kZero3;
  AdamConfig adam;
  // Clip the global gradient norm (over every shard and replica) to this value before the
  // optimizer step; 0 disables clipping.
  float clip_norm = 0.0f;
  // hpZ (ZeRO++ secondary partition; zero3 with intra_shard > 1 and inter_shard > 1): after a
  // unit's forward, keep its parameters sharded over the intra-node group only (1/I of the unit
  // per rank), so re-gathers until the next step() stay inside the node.
  bool hpz = false;
  // Where parameters, gradients and optimizer state live. kCuda needs a build with CUDA and a
  // mesh whose communicators are NCCL (ShardedModel::create says which is missing).
  Device device = Device::kHost;

  PrecisionPolicy precision;
  WirePolicy wires;
  PipelinePolicy pipeline;
  OffloadPolicy offload;
  CheckpointPolicy checkpoint;
  FailurePolicy failure;
  ElasticPolicy elastic;
  ReplicaSyncPolicy replica_sync;
  // Step timeline: each rank writes <trace_dir>/trace.rank<N>.json (docs/trace.md). "": the
  // HSDP_TRACE variable's, unset = no trace.
  std::string trace_dir;
};

// `cfg` with every unset optional filled from its HSDP_* variable, else its default, so that every
// field has a value. A malformed variable is an InvalidArgument naming it and its value; a field
// out of range (pipeline.chunks < 1, an inter dtype other than float32/bf16, a quantization
// block that is not a multiple of 16 in [16, 2^20], offload.adam_threads < 1) names the field.
// ShardedModel::create() calls it; call it yourself to see what a run will use.
StatusOr<EngineConfig> resolveEngineConfig(EngineConfig cfg);

}  // namespace hsdp
