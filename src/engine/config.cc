#include "hsdp/config.h"

#include "engine/elastic_env.h"
#include "hsdp/env.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"
#include "offload/cpu_adam.h"

namespace hsdp {

namespace {
// Every chunk pays each level's latency and a staging copy: beyond a few thousand chunks a
// collective is all latency (a 1 GiB unit in 4096 chunks moves 256 KiB per chunk).
constexpr int kMaxPipelineChunks = 4096;

using env::BoolParam;
using env::IntParam;
using env::StringParam;

const BoolParam kHier{
    "HSDP_HIER", true,
    "Run the engine's all-gather and reduce-scatter as hierarchical schedules (inter then "
    "intra, intra then inter). 0 uses one flat collective over the shard group."};
const IntParam kPipelineChunks{
    "HSDP_PIPELINE_CHUNKS", env::Unset{"auto"}, 1, kMaxPipelineChunks,
    "Chunks per hierarchical all-gather/reduce-scatter: chunk c's intra-node phase overlaps "
    "chunk c+1's inter-node phase. Need not divide the size. Unset: up to 32, fewer for small "
    "units (HSDP_PIPELINE_MIN_CHUNK_BYTES); set: exactly this many."};
// No typed default: 1 MiB when HSDP_PIPELINE_CHUNKS is unset, else 0 (resolveEngineConfig).
const IntParam kPipelineMinChunkBytes{
    "HSDP_PIPELINE_MIN_CHUNK_BYTES", env::Unset{"1048576"}, 0, int64_t{1} << 40,
    "Smallest chunk (bytes of the gathered unit) when HSDP_PIPELINE_CHUNKS is unset: a unit "
    "under 2 MiB moves in one piece, a 64 MiB one in 32. Every chunk pays each level's latency "
    "once. 0: always HSDP_PIPELINE_CHUNKS."};
const StringParam kInterDtype{
    "HSDP_INTER_DTYPE", StringParam::Kind::kEnum, "float",
    "Wire type of the inter-node phase of the engine's hierarchical collectives: float or bf16 "
    "(halves the bytes across nodes; the reduction across nodes rounds to bf16). The shorthand "
    "for both inter wires: the default of HSDP_INTER_PARAM_WIRE and HSDP_INTER_GRAD_WIRE when "
    "they are unset."};
const StringParam kInterParamWire{
    "HSDP_INTER_PARAM_WIRE", StringParam::Kind::kEnum, "",
    "Inter-node wire of the engine's parameter all-gathers: fp32, bf16, int8 or int4 "
    "(block-quantized, one fp32 scale per HSDP_QUANT_BLOCK elements; the master shard is "
    "encoded once per step, every gather decodes the same codes). int8/int4 need zero3, "
    "hierarchical host collectives and fp32 parameters. Unset: HSDP_INTER_DTYPE's."};
const StringParam kInterGradWire{
    "HSDP_INTER_GRAD_WIRE", StringParam::Kind::kEnum, "",
    "Inter-node wire of the engine's gradient reduce-scatters: fp32, bf16, int8 or int4 "
    "(int8/int4: an all-to-all of encoded pieces, each rank sums its block in fp32; error "
    "feedback per HSDP_GRAD_ERROR_FEEDBACK). Unset: HSDP_INTER_DTYPE's."};
const StringParam kReplicaWire{
    "HSDP_REPLICA_WIRE", StringParam::Kind::kEnum, "fp32",
    "Wire of the all-reduce of gradient shards over the data-parallel replicas (mode none: the "
    "gradient over the world): fp32 (exact), bf16, int8 or int4 (all-to-all of encoded pieces "
    "summed in fp32, the sum encoded once and all-gathered). Host only."};
const IntParam kQuantBlock{
    "HSDP_QUANT_BLOCK", kDefaultQuantBlock, 16, kMaxQuantBlock,
    "Elements per fp32 scale of the int8/int4 wires: a multiple of 16 in [16, 1048576]. int8 "
    "moves 1 + 4/block bytes per element (0.2505x fp32 at 2048)."};
const BoolParam kGradErrorFeedback{
    "HSDP_GRAD_ERROR_FEEDBACK", true,
    "Error feedback for the encoded gradient wires (int8/int4 inter gradient wire, a bf16/int8/"
    "int4 replica wire): each rank adds what its last encoding dropped to what it sends next (a "
    "residual buffer per unit, allocated once)."};
const BoolParam kCkptDirectIo{
    "HSDP_CKPT_DIRECT_IO", true,
    "Checkpoint data files written by save and read by load go around the page cache (O_DIRECT) "
    "where the filesystem supports it (elsewhere, e.g. tmpfs before Linux 6.6, buffered); 0: "
    "always through the page cache. Also EngineConfig::checkpoint.direct_io."};

// An unset wire from its variable, else `fallback`; a bad value names the variable.
Status wireFromEnv(std::optional<Wire>* field, const StringParam& var, Wire fallback) {
  if (field->has_value()) return okStatus();
  const std::string v = var.get();
  if (v.empty()) {
    *field = fallback;
    return okStatus();
  }
  StatusOr<Wire> w = parseWire(v);
  if (!w.ok()) return invalidArgument(var.name(), "='", v, "': ", w.status().message());
  *field = *w;
  return okStatus();
}
}  // namespace

namespace {
const StringParam kElasticHost{
    "HSDP_ELASTIC_HOST", StringParam::Kind::kString, "",
    "Host this rank publishes beside its replica-level address (its group's alarm listens there). "
    "Unset: the local address of the route to HSDP_ELASTIC_ENDPOINT."};
const StringParam kElasticData{
    "HSDP_ELASTIC_DATA", StringParam::Kind::kEnum, "keep",
    "Data of an elastic group when groups are missing: keep (each group its own slice; the "
    "global batch shrinks) or redistribute (the groups present share the whole batch)."};

Status resolveElastic(ElasticPolicy* e) {
  if (!e->endpoint) e->endpoint = elastic_env::kEndpoint.get();
  if (!e->job) e->job = elastic_env::kJob.get();
  if (!e->host) e->host = kElasticHost.get();
  if (!e->data) {
    StatusOr<ElasticData> d = parseElasticData(kElasticData.get());
    if (!d.ok())
      return invalidArgument("HSDP_ELASTIC_DATA='", kElasticData.get(),
                             "': ", d.status().message());
    e->data = *d;
  }
  if (!e->group_index) {
    HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> v, elastic_env::kGroupIndex.get());
    if (v) e->group_index = static_cast<int>(*v);
  }
  if (!e->restarts) {
    HSDP_ASSIGN_OR_RETURN(int64_t v, elastic_env::kRestarts.value());
    e->restarts = static_cast<int>(v);
  }
  if (!e->groups) {
    HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> v, elastic_env::kGroups.get());
    if (v) e->groups = static_cast<int>(*v);
  }
  if (e->endpoint->empty()) return okStatus();
  if (!e->groups || *e->groups < 1)
    return invalidArgument("elastic mode (HSDP_ELASTIC_ENDPOINT='", *e->endpoint,
                           "') needs EngineConfig::elastic.groups >= 1 (HSDP_ELASTIC_GROUPS)");
  if (!e->group_index || *e->group_index < 0 || *e->group_index >= *e->groups)
    return invalidArgument("elastic mode needs EngineConfig::elastic.group_index in [0, ",
                           *e->groups, ") (HSDP_ELASTIC_GROUP_INDEX), got ",
                           e->group_index ? std::to_string(*e->group_index) : "none");
  if (e->endpoint->rfind("http://", 0) != 0)
    return invalidArgument("EngineConfig::elastic.endpoint='", *e->endpoint,
                           "' is not an http://host:port URL (HSDP_ELASTIC_ENDPOINT)");
  return okStatus();
}
}  // namespace

StatusOr<ElasticData> parseElasticData(std::string_view name) {
  if (name == "keep") return ElasticData::kKeepSlice;
  if (name == "redistribute") return ElasticData::kRedistribute;
  return invalidArgument("unknown elastic data policy '", name,
                         "' (expected keep or redistribute)");
}

const char* elasticDataName(ElasticData d) {
  return d == ElasticData::kKeepSlice ? "keep" : "redistribute";
}

StatusOr<ReplicaPolicy> parseReplicaPolicy(std::string_view name) {
  if (name == "sync") return ReplicaPolicy::kSync;
  if (name == "local_sgd") return ReplicaPolicy::kLocalSgd;
  if (name == "diloco") return ReplicaPolicy::kDiloco;
  return invalidArgument("unknown replica policy '", name,
                         "' (expected sync, local_sgd or diloco)");
}

const char* replicaPolicyName(ReplicaPolicy p) {
  switch (p) {
    case ReplicaPolicy::kSync:
      return "sync";
    case ReplicaPolicy::kLocalSgd:
      return "local_sgd";
    case ReplicaPolicy::kDiloco:
      return "diloco";
  }
  return "?";
}

StatusOr<EngineConfig> resolveEngineConfig(EngineConfig cfg) {
  if (!cfg.pipeline.hierarchical) {
    HSDP_ASSIGN_OR_RETURN(cfg.pipeline.hierarchical, kHier.get());
  }
  if (cfg.device != Device::kHost && kHier.isSet()) {
    // The two-level schedules stage chunks with host memcpy; on a device NCCL runs its own
    // intra/inter hierarchy inside one communicator (ShardedModel::create).
    static bool logged = false;
    if (!logged)
      HSDP_INFO(kShard,
                "HSDP_HIER is ignored on a device: parameters and gradients move with one "
                "NCCL collective over the shard group");
    logged = true;
  }
  // Pipelining: unset, deep pipelines for large units and one piece for small ones (each chunk
  // pays both levels' latency); set, exactly that many chunks unless a minimum is set too.
  const bool chunks_given = cfg.pipeline.chunks.has_value();
  if (!cfg.pipeline.chunks) {
    HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> c, kPipelineChunks.get());
    if (c) cfg.pipeline.chunks = static_cast<int>(*c);
  }
  const bool chunks_set = chunks_given || cfg.pipeline.chunks.has_value();
  if (!cfg.pipeline.min_chunk_bytes) {
    HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> m, kPipelineMinChunkBytes.get());
    cfg.pipeline.min_chunk_bytes = m ? static_cast<size_t>(*m) : (chunks_set ? 0 : size_t{1} << 20);
  }
  if (!cfg.pipeline.chunks) cfg.pipeline.chunks = 32;
  if (*cfg.pipeline.chunks < 1 || *cfg.pipeline.chunks > kMaxPipelineChunks)
    return invalidArgument("EngineConfig::pipeline.chunks=", *cfg.pipeline.chunks,
                           " must be in [1, ", kMaxPipelineChunks, "]");
  if (!cfg.wires.inter_dtype) {
    const std::string wire = kInterDtype.get();
    cfg.wires.inter_dtype = DType::kFloat32;
    if (kInterDtype.isSet()) {
      StatusOr<DType> t = parseDType(wire);
      if (!t.ok()) return invalidArgument("HSDP_INTER_DTYPE='", wire, "': ", t.status().message());
      cfg.wires.inter_dtype = *t;
    }
  }
  if (*cfg.wires.inter_dtype != DType::kFloat32 && *cfg.wires.inter_dtype != DType::kBFloat16)
    return invalidArgument("inter-node wire dtype ", dtypeName(*cfg.wires.inter_dtype),
                           " is not float or bf16");
  // The wires: HSDP_INTER_DTYPE is the default of both inter wires.
  const Wire alias = *cfg.wires.inter_dtype == DType::kBFloat16 ? Wire::kBf16 : Wire::kFp32;
  HSDP_RETURN_IF_ERROR(wireFromEnv(&cfg.wires.inter_param_wire, kInterParamWire, alias));
  HSDP_RETURN_IF_ERROR(wireFromEnv(&cfg.wires.inter_grad_wire, kInterGradWire, alias));
  HSDP_RETURN_IF_ERROR(wireFromEnv(&cfg.wires.replica_wire, kReplicaWire, Wire::kFp32));
  const char* block_from = "EngineConfig::wires.quant_block";
  if (!cfg.wires.quant_block) {
    HSDP_ASSIGN_OR_RETURN(int64_t b, kQuantBlock.value());
    cfg.wires.quant_block = static_cast<uint32_t>(b);
    block_from = "HSDP_QUANT_BLOCK";
  }
  if (Status s = validate(WireFormat{Wire::kInt8, *cfg.wires.quant_block}); !s.ok())
    return invalidArgument(block_from, "=", *cfg.wires.quant_block, ": ", s.message());
  if (!cfg.wires.grad_error_feedback) {
    HSDP_ASSIGN_OR_RETURN(cfg.wires.grad_error_feedback, kGradErrorFeedback.get());
  }
  if (!cfg.offload.adam_threads) {
    // One thread per rank unless HSDP_CPU_ADAM_THREADS says otherwise (its one default: ranks
    // share the node's cores, and the CPU Adam's pool does not know about the other ranks).
    HSDP_ASSIGN_OR_RETURN(cfg.offload.adam_threads, cpuAdamThreadsFromEnv());
  }
  if (*cfg.offload.adam_threads < 1)
    return invalidArgument("EngineConfig::offload.adam_threads=", *cfg.offload.adam_threads,
                           " must be >= 1");
  if (!cfg.failure.timeout_s) {
    HSDP_ASSIGN_OR_RETURN(watchdog::Config wd, watchdog::resolveConfig({}));
    cfg.failure.timeout_s = wd.timeout_s;
  }
  if (!(*cfg.failure.timeout_s > 0))
    return invalidArgument("EngineConfig::failure.timeout_s=", *cfg.failure.timeout_s,
                           " must be > 0");
  if (!cfg.checkpoint.direct_io) {
    HSDP_ASSIGN_OR_RETURN(cfg.checkpoint.direct_io, kCkptDirectIo.get());
  }
  HSDP_RETURN_IF_ERROR(resolveElastic(&cfg.elastic));
  if (!cfg.offload.adam_isa) {
    HSDP_ASSIGN_OR_RETURN(cfg.offload.adam_isa, cpuAdamIsaFromEnv());
  } else if (!cpuIsaSupported(*cfg.offload.adam_isa)) {
    return failedPrecondition("EngineConfig::offload.adam_isa=", cpuIsaName(*cfg.offload.adam_isa),
                              " is not supported by this CPU or build");
  }
  return cfg;
}

StatusOr<Device> parseDevice(std::string_view name) {
  if (name == "cpu") return Device::kHost;
  if (name == "cuda") return Device::kCuda;
  return invalidArgument("unknown device '", name, "' (expected cpu or cuda)");
}

const char* deviceName(Device d) {
  switch (d) {
    case Device::kHost:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "?";
}

}  // namespace hsdp
