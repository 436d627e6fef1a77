// ShardedModel: creation (the configuration checks), unit registration, the small accessors,
// setParameter and gatherFullParameters. The lifecycle lives beside it, one file per concept
// (engine/sharded_model_impl.h lists them).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"
#include "hsdp/watchdog.h"
#include "storage/format.h"

namespace hsdp {

using engine::Unit;

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

// Every combination the engine cannot run is named here, before anything is allocated, so every
// rank reaches the same verdict with no collective.
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
  HSDP_RETURN_IF_ERROR(engine::checkClipNorm(cfg.clip_norm));
  if (cfg.pipeline.max_gathered_units < 0)
    return invalidArgument("EngineConfig::pipeline.max_gathered_units=",
                           cfg.pipeline.max_gathered_units, " must be >= 0");
  return checkWires(s, cfg);
}

}  // namespace

Status engine::checkClipNorm(float clip_norm) {
  if (!std::isfinite(clip_norm) || clip_norm < 0)
    return invalidArgument("clip_norm=", clip_norm, " must be finite and >= 0");
  return okStatus();
}

Status ShardedModel::Impl::checkUnit(int u, const char* verb) const {
  if (!finalized) return failedPrecondition(verb, ": call finalize() first");
  if (u < 0 || u >= static_cast<int>(units.size()))
    return outOfRange(verb, ": unit ", u, " outside [0, ", units.size(), ")");
  return okStatus();
}

ShardedModel::ShardedModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardedModel::~ShardedModel() = default;

StatusOr<std::unique_ptr<ShardedModel>> ShardedModel::create(const Mesh& mesh,
                                                             EngineConfig config) {
  HSDP_ASSIGN_OR_RETURN(EngineConfig cfg, resolveEngineConfig(std::move(config)));
  HSDP_RETURN_IF_ERROR(checkConfig(mesh, cfg));
  HSDP_RETURN_IF_ERROR(watchdog::setTimeout(*cfg.failure.timeout_s));
  auto impl = std::make_unique<Impl>();
  impl->mesh = &mesh;
  HSDP_ASSIGN_OR_RETURN(impl->opt, engine::OptimizerStep::create(cfg));
  SpaceBundle space;
  if (cfg.device == Device::kHost) {  // host shards are stepped by the SIMD CPU Adam
    space = hostMemorySpace(
        [adam = impl->opt->cpuAdam()](const AdamConfig& c, int64_t t, const AdamShard& s,
                                      float scale) { return adam->step(c, t, s, scale); });
  } else {
    HSDP_ASSIGN_OR_RETURN(space, createMemorySpace(cfg.device, /*compute_stream=*/nullptr));
  }
  impl->space = std::move(space.memory);
  impl->opt->setSpace(std::move(space.kernels), std::move(space.host_copies));
  impl->cfg = cfg;
  impl->shards = cfg.mode == ShardMode::kNone ? 1 : mesh.shape().shardGroupSize();
  bool hierarchical = *cfg.pipeline.hierarchical;
  // The two-level schedules stage chunks with host memcpy. On a device one collective over the
  // shard group does it: NCCL runs its own intra/inter hierarchy inside a communicator (and
  // UnitCollectives binds the communicators to the space's lanes).
  if (cfg.device != Device::kHost) hierarchical = false;
  engine::UnitCollectives::Options copt;
  copt.shards = impl->shards;
  copt.hierarchical = hierarchical;
  copt.on_device = impl->onDevice();
  copt.hpz = cfg.hpz;
  copt.gather.chunks = copt.reduce.chunks = *cfg.pipeline.chunks;
  copt.gather.min_chunk_bytes = copt.reduce.min_chunk_bytes = *cfg.pipeline.min_chunk_bytes;
  // The wires per direction (inter_dtype, their shorthand, is already resolved into them).
  copt.gather.gather_wire = {*cfg.wires.inter_param_wire, *cfg.wires.quant_block};
  copt.reduce.reduce_wire = {*cfg.wires.inter_grad_wire, *cfg.wires.quant_block};
  copt.replica_wire = {*cfg.wires.replica_wire, *cfg.wires.quant_block};
  HSDP_ASSIGN_OR_RETURN(impl->coll,
                        engine::UnitCollectives::create(mesh, std::move(space.collectives), copt));
  return std::unique_ptr<ShardedModel>(new ShardedModel(std::move(impl)));
}

StatusOr<int> ShardedModel::addUnit(std::string name, std::vector<ParamSpec> params,
                                    UnitOptions options) {
  Impl& m = *impl_;
  if (m.finalized) return failedPrecondition("addUnit('", name, "') after finalize()");
  for (size_t i = 0; i < m.units.size(); ++i)
    if (m.units[i].name == name)
      return invalidArgument("addUnit('", name, "'): duplicate unit name '", name, "' (unit ", i,
                             " has it)");
  StatusOr<FlatLayout> created = FlatLayout::create(std::move(params), m.shards);
  if (!created.ok()) return created.status().withContext(strCat("addUnit('", name, "')"));
  FlatLayout layout = std::move(*created);
  // Checkpoints and safetensors name tensors "<unit>.<param>": no two may join to one name.
  std::vector<ckpt::UnitDesc> descs = m.unitDescs();
  ckpt::UnitDesc mine{name, options.frozen, {}};
  for (const ParamSpec& p : layout.params()) mine.params.push_back({p.name, p.shape});
  descs.push_back(std::move(mine));
  HSDP_RETURN_IF_ERROR(ckpt::checkTensorNames(descs, strCat("addUnit('", name, "')")));
  Unit u;
  u.name = std::move(name);
  u.layout = std::move(layout);
  u.frozen = options.frozen;
  m.units.push_back(std::move(u));
  return static_cast<int>(m.units.size()) - 1;
}

int ShardedModel::numUnits() const { return static_cast<int>(impl_->units.size()); }
const std::string& ShardedModel::unitName(int u) const { return impl_->units.at(u).name; }
const FlatLayout& ShardedModel::layout(int u) const { return impl_->units.at(u).layout; }
bool ShardedModel::frozen(int u) const { return impl_->units.at(u).frozen; }
const EngineConfig& ShardedModel::config() const { return impl_->cfg; }
int64_t ShardedModel::stepCount() const { return impl_->step; }
ShardMode ShardedModel::mode() const { return impl_->cfg.mode; }
int ShardedModel::shardCount() const { return impl_->shards; }
bool ShardedModel::hierarchical() const { return impl_->coll->hierarchical(); }
Device ShardedModel::device() const { return impl_->cfg.device; }
void ShardedModel::setComputeStream(void* cuda_stream) {
  impl_->space->setComputeStream(cuda_stream);
}

Status ShardedModel::setParameter(int unit, std::string_view name, const float* full,
                                  size_t numel) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "setParameter"));
  Unit& u = m.units[unit];
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  const ParamSpec& p = u.layout.params()[i];
  if (numel != p.numel())
    return invalidArgument("setParameter('", u.name, ".", name, "'): ", numel,
                           " values for a parameter of ", p.numel());
  HSDP_RETURN_IF_ERROR(m.waitForStep(u));
  HSDP_RETURN_IF_ERROR(m.waitForSnapshot());  // a save in flight may still read the shard
  MemorySpace& sp = *m.space;                 // `full` is host memory; the buffers are the space's
  // Our slice of the parameter, exact, into the fp32 master shard.
  auto copySlice = [&]() -> Status {
    auto [sb, se] = u.layout.shardRange(m.shardIndex());
    const size_t pb = u.layout.offset(i), pe = pb + p.numel();
    const size_t b = std::max(sb, pb), e = std::min(se, pe);
    if (b >= e) return okStatus();
    return sp.copyFromHost(u.param_shard.as<float>() + (b - sb), full + (b - pb),
                           (e - b) * sizeof(float));
  };
  if (m.replicatedParams()) {  // every rank holds the whole parameter
    float* dst = u.full_params.as<float>() + u.layout.offset(i);
    if (m.bf16Params()) {
      // Keep our slice exact in the fp32 master, and the compute copy as the bf16 rounding.
      HSDP_RETURN_IF_ERROR(copySlice());
      std::vector<float> rounded(full, full + numel);
      for (float& x : rounded) x = toFloat(toBf16(x));
      HSDP_RETURN_IF_ERROR(sp.copyFromHost(dst, rounded.data(), numel * sizeof(float)));
    } else {
      HSDP_RETURN_IF_ERROR(sp.copyFromHost(dst, full, numel * sizeof(float)));
    }
  } else {
    HSDP_RETURN_IF_ERROR(copySlice());
  }
  if (m.stagedOffload() && !u.frozen)  // the host master mirrors the shard
    HSDP_RETURN_IF_ERROR(
        sp.copyToHost(u.host_master.data(), m.master(u), u.layout.shardNumel() * sizeof(float)));
  HSDP_RETURN_IF_ERROR(m.refreshEncoded(u));
  return m.refresh16(u);
}

Status ShardedModel::gatherFullParameters(int unit, std::vector<float>* out) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "gatherFullParameters"));
  Unit& u = m.units[unit];
  HSDP_RETURN_IF_ERROR(m.waitForStep(u));
  out->resize(u.layout.numel());
  // `out` is host memory: on a device the host waits here for the data (copyToHost).
  if (m.shards == 1 || (m.replicatedParams() && !m.bf16Params())) {
    const void* src = m.shards == 1 ? u.param_shard.data() : u.full_params.data();
    return m.space->copyToHost(out->data(), src, u.layout.numel() * sizeof(float));
  }
  HSDP_ASSIGN_OR_RETURN(void* block, m.blocks.pool.acquire(/*zero=*/false));
  // The fp32 masters (with bf16 parameters the gathered compute copies are roundings; an
  // int8/int4 parameter wire is bypassed: this gather is exact).
  watchdog::Label label(u.name, "shard group");
  auto w = m.coll->gatherExact(m.master(u), block, u.layout.shardNumel());
  watchdog::WaitScope wait("gatherFullParameters", u.name);
  Status s = w.ok()
                 ? m.coll->reached(*w, Lane::kCompute, /*block=*/true, /*exposed=*/false).status()
                 : w.status();
  if (s.ok()) s = m.space->copyToHost(out->data(), block, u.layout.numel() * sizeof(float));
  HSDP_RETURN_IF_ERROR(m.blocks.pool.release(block));
  return s;
}

}  // namespace hsdp
