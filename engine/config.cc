#include "hsdp/config.h"

#include "hsdp/env.h"
#include "hsdp/watchdog.h"

namespace hsdp {

namespace {
// Every chunk pays each level's latency and a staging copy: beyond a few thousand chunks a
// collective is all latency (a 1 GiB unit in 4096 chunks moves 256 KiB per chunk).
constexpr int kMaxPipelineChunks = 4096;

// An unset wire from its variable, else `fallback`; a bad value names the variable.
Status wireFromEnv(std::optional<Wire>* field, const char* var, Wire fallback) {
  if (field->has_value()) return okStatus();
  const std::string v = env::getString(var);
  if (v.empty()) {
    *field = fallback;
    return okStatus();
  }
  StatusOr<Wire> w = parseWire(v);
  if (!w.ok()) return invalidArgument(var, "='", v, "': ", w.status().message());
  *field = *w;
  return okStatus();
}
}  // namespace

StatusOr<EngineConfig> resolveEngineConfig(EngineConfig cfg) {
  if (!cfg.hierarchical) {
    HSDP_ASSIGN_OR_RETURN(cfg.hierarchical, env::getBool("HSDP_HIER"));
  }
  // Pipelining: unset, deep pipelines for large units and one piece for small ones (each chunk
  // pays both levels' latency); set, exactly that many chunks unless a minimum is set too.
  const bool chunks_given = cfg.pipeline_chunks.has_value();
  if (!cfg.pipeline_chunks) {
    HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> c, env::getInt("HSDP_PIPELINE_CHUNKS"));
    if (c) cfg.pipeline_chunks = static_cast<int>(*c);
  }
  const bool chunks_set = chunks_given || cfg.pipeline_chunks.has_value();
  if (!cfg.pipeline_min_chunk_bytes) {
    HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> m, env::getInt("HSDP_PIPELINE_MIN_CHUNK_BYTES"));
    cfg.pipeline_min_chunk_bytes = m ? static_cast<size_t>(*m) : (chunks_set ? 0 : size_t{1} << 20);
  }
  if (!cfg.pipeline_chunks) cfg.pipeline_chunks = 32;
  if (*cfg.pipeline_chunks < 1 || *cfg.pipeline_chunks > kMaxPipelineChunks)
    return invalidArgument("EngineConfig::pipeline_chunks=", *cfg.pipeline_chunks,
                           " must be in [1, ", kMaxPipelineChunks, "]");
  if (!cfg.inter_dtype) {
    const std::string wire = env::getString("HSDP_INTER_DTYPE");
    cfg.inter_dtype = DType::kFloat32;
    if (!wire.empty()) {
      StatusOr<DType> t = parseDType(wire);
      if (!t.ok()) return invalidArgument("HSDP_INTER_DTYPE='", wire, "': ", t.status().message());
      cfg.inter_dtype = *t;
    }
  }
  if (*cfg.inter_dtype != DType::kFloat32 && *cfg.inter_dtype != DType::kBFloat16)
    return invalidArgument("inter-node wire dtype ", dtypeName(*cfg.inter_dtype),
                           " is not float or bf16");
  // The wires: HSDP_INTER_DTYPE is the default of both inter wires.
  const Wire alias = *cfg.inter_dtype == DType::kBFloat16 ? Wire::kBf16 : Wire::kFp32;
  HSDP_RETURN_IF_ERROR(wireFromEnv(&cfg.inter_param_wire, "HSDP_INTER_PARAM_WIRE", alias));
  HSDP_RETURN_IF_ERROR(wireFromEnv(&cfg.inter_grad_wire, "HSDP_INTER_GRAD_WIRE", alias));
  HSDP_RETURN_IF_ERROR(wireFromEnv(&cfg.replica_wire, "HSDP_REPLICA_WIRE", Wire::kFp32));
  const char* block_from = "EngineConfig::quant_block";
  if (!cfg.quant_block) {
    HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> b, env::getInt("HSDP_QUANT_BLOCK"));
    if (b && *b > kMaxQuantBlock)
      return invalidArgument("HSDP_QUANT_BLOCK=", *b, " exceeds ", kMaxQuantBlock);
    cfg.quant_block = b ? static_cast<uint32_t>(*b) : kDefaultQuantBlock;
    block_from = "HSDP_QUANT_BLOCK";
  }
  if (Status s = validate(WireFormat{Wire::kInt8, *cfg.quant_block}); !s.ok())
    return invalidArgument(block_from, "=", *cfg.quant_block, ": ", s.message());
  if (!cfg.grad_error_feedback) {
    HSDP_ASSIGN_OR_RETURN(cfg.grad_error_feedback, env::getBool("HSDP_GRAD_ERROR_FEEDBACK"));
  }
  if (!cfg.cpu_adam_threads) {
    // One thread per rank unless HSDP_CPU_ADAM_THREADS says otherwise: ranks share the node's
    // cores, and the CPU Adam's pool does not know about the other ranks.
    HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> t, env::getInt("HSDP_CPU_ADAM_THREADS"));
    cfg.cpu_adam_threads = t ? static_cast<int>(*t) : 1;
  }
  if (*cfg.cpu_adam_threads < 1)
    return invalidArgument("EngineConfig::cpu_adam_threads=", *cfg.cpu_adam_threads,
                           " must be >= 1");
  if (!cfg.timeout_s) {
    HSDP_ASSIGN_OR_RETURN(watchdog::Config wd, watchdog::resolveConfig({}));
    cfg.timeout_s = wd.timeout_s;
  }
  if (!(*cfg.timeout_s > 0))
    return invalidArgument("EngineConfig::timeout_s=", *cfg.timeout_s, " must be > 0");
  if (!cfg.checkpoint_direct_io) {
    HSDP_ASSIGN_OR_RETURN(cfg.checkpoint_direct_io, env::getBool("HSDP_CKPT_DIRECT_IO"));
  }
  if (!cfg.cpu_adam_isa) {
    HSDP_ASSIGN_OR_RETURN(cfg.cpu_adam_isa, cpuAdamIsaFromEnv());
  } else if (!cpuIsaSupported(*cfg.cpu_adam_isa)) {
    return failedPrecondition("EngineConfig::cpu_adam_isa=", cpuIsaName(*cfg.cpu_adam_isa),
                              " is not supported by this CPU or build");
  }
  return cfg;
}

StatusOr<ShardMode> parseShardMode(std::string_view name) {
  if (name == "none") return ShardMode::kNone;
  if (name == "zero1") return ShardMode::kZero1;
  if (name == "zero2") return ShardMode::kZero2;
  if (name == "zero3") return ShardMode::kZero3;
  return invalidArgument("unknown mode '", name, "' (expected none, zero1, zero2 or zero3)");
}

const char* shardModeName(ShardMode mode) {
  switch (mode) {
    case ShardMode::kNone: return "none";
    case ShardMode::kZero1: return "zero1";
    case ShardMode::kZero2: return "zero2";
    case ShardMode::kZero3: return "zero3";
  }
  return "?";
}

StatusOr<Device> parseDevice(std::string_view name) {
  if (name == "cpu") return Device::kHost;
  if (name == "cuda") return Device::kCuda;
  return invalidArgument("unknown device '", name, "' (expected cpu or cuda)");
}

const char* deviceName(Device d) {
  switch (d) {
    case Device::kHost: return "cpu";
    case Device::kCuda: return "cuda";
  }
  return "?";
}

}  // namespace hsdp
