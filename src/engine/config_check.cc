// The configuration checks of ShardedModel::create (config_check.h).
#include "engine/config_check.h"

#include <cmath>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/memory_space.h"
#include "engine/outer_step.h"
#include "hsdp/quantize.h"

namespace hsdp::engine {

namespace {

// The inter wires (config.h): int8/int4 run in the hierarchical host schedules, gather fp32
// masters (zero3 only: zero1/zero2 gather into the replicated parameters that hold the master)
// and reduce fp32 gradients; the encoded replica wire is host only. Nothing is quantized where
// nothing crosses nodes (inter_shard 1), so those settings are accepted there.
Status checkWires(const MeshShape& s, const EngineConfig& cfg) {
  const Wire pw = *cfg.wires.inter_param_wire, gw = *cfg.wires.inter_grad_wire,
             rw = *cfg.wires.replica_wire;
  if (cfg.device == Device::kCuda && (wireQuantized(pw) || wireQuantized(gw) || rw != Wire::kFp32))
    return invalidArgument("the ",
                           wireQuantized(pw)   ? "parameter"
                           : wireQuantized(gw) ? "gradient"
                                               : "replica",
                           " wire ",
                           wireName(wireQuantized(pw)   ? pw
                                    : wireQuantized(gw) ? gw
                                                        : rw),
                           " runs in the hierarchical host schedules; on a device parameters and "
                           "gradients move with NCCL (use fp32 or bf16 wires)");
  if (s.inter_shard < 2) return okStatus();
  for (auto [w, what, var] : {std::tuple{pw, "parameter", "HSDP_INTER_PARAM_WIRE"},
                              std::tuple{gw, "gradient", "HSDP_INTER_GRAD_WIRE"}}) {
    if (!wireQuantized(w)) continue;
    if (!*cfg.pipeline.hierarchical)
      return invalidArgument("the ", wireName(w), " inter ", what, " wire (", var,
                             ") needs the hierarchical schedules (HSDP_HIER=1)");
  }
  if (wireQuantized(pw) && cfg.mode != ShardMode::kZero3)
    return invalidArgument("the ", wireName(pw), " inter parameter wire needs mode zero3 (got ",
                           shardModeName(cfg.mode),
                           "): zero1/zero2 gather into the replicated "
                           "parameters that hold the fp32 master");
  if (wireQuantized(pw) && cfg.precision.param_dtype != DType::kFloat32)
    return invalidArgument("the ", wireName(pw),
                           " inter parameter wire encodes the fp32 master; "
                           "precision.param_dtype ",
                           dtypeName(cfg.precision.param_dtype), " would gather bf16: pick one");
  if (wireQuantized(gw) && cfg.precision.reduce_dtype != DType::kFloat32)
    return invalidArgument("the ", wireName(gw),
                           " inter gradient wire encodes fp32 gradients; "
                           "precision.reduce_dtype ",
                           dtypeName(cfg.precision.reduce_dtype), ": pick one");
  return okStatus();
}

}  // namespace

Status checkConfig(const Mesh& mesh, const EngineConfig& cfg) {
  HSDP_RETURN_IF_ERROR(validate(cfg.adam));
  const MeshShape& s = mesh.shape();
  if (!cfg.elastic.endpoint->empty()) {
    // The groups are the replicas: each group is one shard group on host memory, and the
    // replica level runs between groups (docs/elastic.md).
    if (cfg.device != Device::kHost)
      return unimplemented(
          "elastic mode (HSDP_ELASTIC_ENDPOINT) runs on host memory only; "
          "EngineConfig::device is ",
          deviceName(cfg.device));
    if (cfg.mode == ShardMode::kNone)
      return invalidArgument("elastic mode needs a sharded mode (zero1, zero2, zero3), not none");
    if (s.replicas() != 1)
      return invalidArgument("elastic mode: the mesh has ", s.replicas(),
                             " replicas; in an elastic job each group is one shard group (the "
                             "groups are the replicas): set intra_shard x inter_shard = ",
                             s.world_size);
  }
  if (cfg.device == Device::kCuda) {
    HSDP_RETURN_IF_ERROR(memorySpaceAvailable(Device::kCuda));  // e.g. built without CUDA
    // Device buffers move only over NCCL: the communicators the engine uses must be NCCL.
    std::vector<std::pair<const char*, Comm*>> comms = {
        {"shard-group", &mesh.shardGroup()},
        {"shard-group-reduce", &mesh.shardGroupReduce()},
        {"replica", &mesh.replica()}};
    if (cfg.hpz) comms.push_back({"intra-shard", &mesh.intraShard()});
    for (auto [role, comm] : comms)
      if (std::string_view(comm->transportName()) != "nccl")
        return invalidArgument("Device::kCuda needs NCCL communicators, but the mesh's ", role,
                               " communicator runs on '", comm->transportName(),
                               "'; build the mesh over an NCCL world "
                               "(hsdp::nccl::createNcclComm, hsdp/nccl.h)");
  }
  if (cfg.mode == ShardMode::kNone && s.shardGroupSize() != 1)
    return invalidArgument(
        "mode none replicates everything and needs intra_shard=1 and "
        "inter_shard=1 (got intra_shard=",
        s.intra_shard, ", inter_shard=", s.inter_shard, "); use mode zero3 to shard");
  if (cfg.offload.cpu && cfg.mode == ShardMode::kNone)
    return invalidArgument(
        "CPU offload needs a sharded optimizer: mode none keeps the optimizer "
        "state with every replica; use zero1, zero2 or zero3");
  if (cfg.hpz && cfg.mode != ShardMode::kZero3)
    return invalidArgument("hpZ needs mode zero3 (got ", shardModeName(cfg.mode),
                           "): only zero3 re-gathers parameters in backward");
  if (cfg.hpz && (s.intra_shard < 2 || s.inter_shard < 2))
    return invalidArgument("hpZ needs intra_shard > 1 and inter_shard > 1 (got intra_shard=",
                           s.intra_shard, ", inter_shard=", s.inter_shard,
                           "): the secondary partition is over the node's shard ranks and only "
                           "saves traffic when the shard group spans nodes");
  for (DType t : {cfg.precision.param_dtype, cfg.precision.reduce_dtype})
    if (t != DType::kFloat32 && t != DType::kBFloat16)
      return invalidArgument("mixed precision dtype ", dtypeName(t), " is not float or bf16");
  HSDP_RETURN_IF_ERROR(checkClipNorm(cfg.clip_norm));
  HSDP_RETURN_IF_ERROR(checkReplicaSync(cfg.replica_sync, s.replicas()));
  if (cfg.replica_sync.policy != ReplicaPolicy::kSync) {
    const char* name = replicaPolicyName(cfg.replica_sync.policy);
    if (cfg.device != Device::kHost)
      return unimplemented("replica policy ", name, " runs on host memory only (device ",
                           deviceName(cfg.device), "); use sync");
    if (!cfg.elastic.endpoint->empty())
      return unimplemented("replica policy ", name,
                           " with elastic mode (HSDP_ELASTIC_ENDPOINT) is not built; use sync");
  }
  if (cfg.pipeline.max_gathered_units < 0)
    return invalidArgument("EngineConfig::pipeline.max_gathered_units=",
                           cfg.pipeline.max_gathered_units, " must be >= 0");
  return checkWires(s, cfg);
}

Status checkClipNorm(float clip_norm) {
  if (!std::isfinite(clip_norm) || clip_norm < 0)
    return invalidArgument("clip_norm=", clip_norm, " must be finite and >= 0");
  return okStatus();
}

}  // namespace hsdp::engine
