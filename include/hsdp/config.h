// Engine configuration: sharding mode and optimizer.
#pragma once

#include <string_view>

#include "hsdp/dtype.h"
#include "hsdp/optimizer.h"
#include "hsdp/status.h"

namespace hsdp {

enum class ShardMode {
  kNone,   // plain data parallel: parameters, gradients, optimizer state replicated
  kZero1,  // optimizer state sharded; parameters and full gradients replicated
  kZero2,  // optimizer state and gradients sharded; parameters replicated
  kZero3,  // parameters, gradients, optimizer state sharded over the shard group
};

StatusOr<ShardMode> parseShardMode(std::string_view name);  // "none", "zero1", "zero2", "zero3"
const char* shardModeName(ShardMode mode);

// Where the engine keeps model state (ShardedModel, sharded_model.h).
enum class Device {
  kHost,  // host memory; the collectives run on the mesh's transports (MPI, UCX)
  kCuda,  // device memory of the CUDA device current at ShardedModel::create(); NCCL mesh
};

StatusOr<Device> parseDevice(std::string_view name);  // "cpu" -> kHost, "cuda" -> kCuda
const char* deviceName(Device d);                     // "cpu" | "cuda"

struct EngineConfig {
  ShardMode mode = ShardMode::kZero3;
  AdamConfig adam;
  // Clip the global gradient norm (over every shard and replica) to this value before the
  // optimizer step; 0 disables clipping.
  float clip_norm = 0.0f;
  // Optimizer state (fp32 master, Adam moments) in NUMA-local host memory, stepped by the SIMD
  // CPU Adam on a worker thread as soon as each unit's gradient is reduced, overlapping the rest
  // of backward. Needs a sharded optimizer (zero1, zero2, zero3).
  bool offload_cpu = false;
  // Mixed precision (shard groups larger than one): the dtype parameters are all-gathered in
  // (bf16: the fp32 master shard is rounded to bf16, gathered as 2-byte data and upcast for
  // compute) and the dtype gradients are reduce-scattered in (bf16: summed in bf16 hop by hop,
  // upcast into the fp32 gradient shard). Master weights and optimizer state stay fp32.
  DType param_dtype = DType::kFloat32;
  DType reduce_dtype = DType::kFloat32;
  // hpZ (ZeRO++ secondary partition; zero3 with intra_shard > 1 and inter_shard > 1): after a
  // unit's forward, keep its parameters sharded over the intra-node group only (1/I of the unit
  // per rank), so re-gathers until the next step() stay inside the node.
  bool hpz = false;
  // Rate limiter (zero3): at most this many units gathered at once; an unshard() beyond it is
  // issued when an earlier unit is resharded (or when it is waited for). 0: no limit.
  int max_gathered_units = 0;
  // Where parameters, gradients and optimizer state live. kCuda needs a build with CUDA and a
  // mesh whose communicators are NCCL (ShardedModel::create says which is missing).
  Device device = Device::kHost;
};

}  // namespace hsdp
