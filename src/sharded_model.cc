#include "hsdp/sharded_model.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "hsdp/env.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/host_buffer.h"
#include "hsdp/log.h"
#include "src/buffer_pool.h"

namespace hsdp {

namespace {

struct Unit {
  std::string name;
  FlatLayout layout;
  // This rank's shard of the flat buffer: fp32 master parameters, gradient and Adam moments.
  HostBuffer param_shard, grad_shard, exp_avg, exp_avg_sq;
  float* gathered = nullptr;   // full parameters while unsharded (pool block, or the shard)
  float* full_grad = nullptr;  // full gradient while backward writes it (pool block, or shard)
  bool unsharded = false;
  bool grad_reduced = false;
};

}  // namespace

struct ShardedModel::Impl {
  const Mesh* mesh = nullptr;
  EngineConfig cfg;
  int shards = 1;  // shard group size used for layouts (1 in mode none)
  bool finalized = false;
  bool hierarchical = true;
  std::vector<Unit> units;
  BufferPool pool;
  std::unique_ptr<HierarchicalCollectives> hier;
  int64_t step = 0;

  Comm& dataParallel() const { return shards == 1 ? mesh->world() : mesh->replica(); }

  Status checkUnit(int u, const char* verb) const {
    if (!finalized) return failedPrecondition(verb, ": call finalize() first");
    if (u < 0 || u >= static_cast<int>(units.size()))
      return outOfRange(verb, ": unit ", u, " outside [0, ", units.size(), ")");
    return okStatus();
  }

  Status gather(const float* shard, float* full, size_t count) {
    if (hierarchical) return hier->allGather(shard, full, count, DType::kFloat32);
    return mesh->shardGroup().allGather(shard, full, count, DType::kFloat32);
  }

  Status reduceScatter(const float* full, float* shard, size_t count) {
    if (hierarchical) return hier->reduceScatter(full, shard, count, DType::kFloat32, RedOp::kAvg);
    return mesh->shardGroup().reduceScatter(full, shard, count, DType::kFloat32, RedOp::kAvg);
  }
};

ShardedModel::ShardedModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardedModel::~ShardedModel() = default;

StatusOr<std::unique_ptr<ShardedModel>> ShardedModel::create(const Mesh& mesh, EngineConfig cfg) {
  HSDP_RETURN_IF_ERROR(validate(cfg.adam));
  const MeshShape& s = mesh.shape();
  if (cfg.mode == ShardMode::kNone && s.shardGroupSize() != 1)
    return invalidArgument("mode none replicates everything and needs intra_shard=1 and "
                           "inter_shard=1 (got intra_shard=", s.intra_shard, ", inter_shard=",
                           s.inter_shard, "); use mode zero3 to shard");
  auto impl = std::make_unique<Impl>();
  impl->mesh = &mesh;
  impl->cfg = cfg;
  impl->shards = cfg.mode == ShardMode::kNone ? 1 : s.shardGroupSize();
  HSDP_ASSIGN_OR_RETURN(impl->hierarchical, env::getBool("HSDP_HIER"));
  impl->hier = std::make_unique<HierarchicalCollectives>(mesh.intraShard(), mesh.interShard());
  return std::unique_ptr<ShardedModel>(new ShardedModel(std::move(impl)));
}

StatusOr<int> ShardedModel::addUnit(std::string name, std::vector<ParamSpec> params) {
  Impl& m = *impl_;
  if (m.finalized) return failedPrecondition("addUnit('", name, "') after finalize()");
  for (const Unit& u : m.units)
    if (u.name == name) return invalidArgument("duplicate unit name '", name, "'");
  HSDP_ASSIGN_OR_RETURN(FlatLayout layout, FlatLayout::create(std::move(params), m.shards));
  Unit u;
  u.name = std::move(name);
  u.layout = std::move(layout);
  m.units.push_back(std::move(u));
  return static_cast<int>(m.units.size()) - 1;
}

Status ShardedModel::finalize() {
  Impl& m = *impl_;
  if (m.finalized) return failedPrecondition("finalize() called twice");
  // Every rank must hold the same units, or the collectives below would pair different buffers
  // and hang or corrupt. Compare a signature of all names and shapes across the world.
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  for (const Unit& u : m.units) {
    XXH64_update(st, u.name.data(), u.name.size() + 1);
    for (const ParamSpec& p : u.layout.params()) {
      XXH64_update(st, p.name.data(), p.name.size() + 1);
      XXH64_update(st, p.shape.data(), p.shape.size() * sizeof(int64_t));
      int64_t sep = -1;
      XXH64_update(st, &sep, sizeof(sep));
    }
  }
  int64_t mine[2] = {static_cast<int64_t>(m.units.size()),
                     static_cast<int64_t>(XXH64_digest(st))};
  XXH64_freeState(st);
  Comm& world = m.mesh->world();
  std::vector<int64_t> all(2 * world.size());
  HSDP_RETURN_IF_ERROR(world.allGather(mine, all.data(), 2, DType::kInt64));
  for (int r = 1; r < world.size(); ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      return invalidArgument("unit registrations differ across ranks: rank 0 registered ", all[0],
                             " units (signature ", std::hex, static_cast<uint64_t>(all[1]),
                             std::dec, "), rank ", r, " registered ", all[2 * r],
                             " units (signature ", std::hex, static_cast<uint64_t>(all[2 * r + 1]),
                             std::dec, "); every rank must add the same units and parameters");
  }
  if (m.units.empty()) return failedPrecondition("finalize(): no units registered");

  size_t max_shard = 0, max_padded = 0;
  for (Unit& u : m.units) {
    const size_t bytes = u.layout.shardNumel() * sizeof(float);
    HSDP_ASSIGN_OR_RETURN(u.param_shard, HostBuffer::allocate(bytes));
    HSDP_ASSIGN_OR_RETURN(u.grad_shard, HostBuffer::allocate(bytes));
    HSDP_ASSIGN_OR_RETURN(u.exp_avg, HostBuffer::allocate(bytes));
    HSDP_ASSIGN_OR_RETURN(u.exp_avg_sq, HostBuffer::allocate(bytes));
    max_shard = std::max(max_shard, u.layout.shardNumel());
    max_padded = std::max(max_padded, u.layout.paddedNumel());
  }
  if (m.shards > 1) {
    // Two blocks: in backward a unit's gathered parameters and its full gradient are alive
    // together; forward needs one.
    HSDP_RETURN_IF_ERROR(m.pool.init(max_padded * sizeof(float), 2));
    if (m.hierarchical) HSDP_RETURN_IF_ERROR(m.hier->reserve(max_shard, DType::kFloat32));
    else HSDP_RETURN_IF_ERROR(m.mesh->shardGroup().reserveScratch(max_shard * sizeof(float)));
  }
  m.finalized = true;
  HSDP_INFO(kShard, "finalized ", m.units.size(), " units, mode ", shardModeName(m.cfg.mode),
            ", shard group ", m.shards, ", largest unit ", max_padded, " elements (padded)");
  return okStatus();
}

int ShardedModel::numUnits() const { return static_cast<int>(impl_->units.size()); }
const std::string& ShardedModel::unitName(int u) const { return impl_->units.at(u).name; }
const FlatLayout& ShardedModel::layout(int u) const { return impl_->units.at(u).layout; }
int64_t ShardedModel::stepCount() const { return impl_->step; }
ShardMode ShardedModel::mode() const { return impl_->cfg.mode; }
int ShardedModel::shardCount() const { return impl_->shards; }

Status ShardedModel::setParameter(int unit, std::string_view name, const float* full,
                                  size_t numel) {
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "setParameter"));
  Unit& u = impl_->units[unit];
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  const ParamSpec& p = u.layout.params()[i];
  if (numel != p.numel())
    return invalidArgument("setParameter('", u.name, ".", name, "'): ", numel,
                           " values for a parameter of ", p.numel());
  const int k = impl_->shards == 1 ? 0 : impl_->mesh->coords().shard_rank;
  auto [sb, se] = u.layout.shardRange(k);
  const size_t pb = u.layout.offset(i), pe = pb + p.numel();
  const size_t b = std::max(sb, pb), e = std::min(se, pe);
  if (b < e) std::memcpy(u.param_shard.as<float>() + (b - sb), full + (b - pb), (e - b) * 4);
  return okStatus();
}

Status ShardedModel::unshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "unshard"));
  Unit& u = m.units[unit];
  if (u.unsharded) return failedPrecondition("unshard: unit '", u.name, "' is already unsharded");
  if (m.shards == 1) {
    u.gathered = u.param_shard.as<float>();
  } else {
    HSDP_ASSIGN_OR_RETURN(void* block, m.pool.acquire(/*zero=*/false));
    u.gathered = static_cast<float*>(block);
    HSDP_RETURN_IF_ERROR(
        m.gather(u.param_shard.as<float>(), u.gathered, u.layout.shardNumel())
            .withContext(strCat("all-gather of unit '", u.name, "'")));
  }
  u.unsharded = true;
  return okStatus();
}

Status ShardedModel::waitForUnshard(int unit) {
  // The skeleton's gathers complete inside unshard(); the nonblocking schedules make this wait.
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "waitForUnshard"));
  if (!impl_->units[unit].unsharded)
    return failedPrecondition("waitForUnshard: unit '", impl_->units[unit].name,
                              "' was not unsharded");
  return okStatus();
}

Status ShardedModel::reshard(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "reshard"));
  Unit& u = m.units[unit];
  if (!u.unsharded) return failedPrecondition("reshard: unit '", u.name, "' is not unsharded");
  if (m.shards > 1) HSDP_RETURN_IF_ERROR(m.pool.release(u.gathered));
  u.gathered = nullptr;
  u.unsharded = false;
  return okStatus();
}

StatusOr<ParamView> ShardedModel::param(int unit, std::string_view name) {
  HSDP_RETURN_IF_ERROR(impl_->checkUnit(unit, "param"));
  Unit& u = impl_->units[unit];
  if (!u.unsharded)
    return failedPrecondition("param('", u.name, ".", name, "'): unit is sharded; unshard first");
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  const ParamSpec& p = u.layout.params()[i];
  return ParamView{u.gathered + u.layout.offset(i), p.shape, p.numel()};
}

StatusOr<ParamView> ShardedModel::grad(int unit, std::string_view name) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "grad"));
  Unit& u = m.units[unit];
  HSDP_ASSIGN_OR_RETURN(size_t i, u.layout.indexOf(name));
  if (u.full_grad == nullptr) {
    if (m.shards == 1) {
      u.full_grad = u.grad_shard.as<float>();
      std::memset(u.full_grad, 0, u.grad_shard.size());
    } else {
      HSDP_ASSIGN_OR_RETURN(void* block, m.pool.acquire(/*zero=*/true));
      u.full_grad = static_cast<float*>(block);
    }
  }
  const ParamSpec& p = u.layout.params()[i];
  return ParamView{u.full_grad + u.layout.offset(i), p.shape, p.numel()};
}

Status ShardedModel::reduceGrad(int unit) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "reduceGrad"));
  Unit& u = m.units[unit];
  if (u.full_grad == nullptr)
    return failedPrecondition("reduceGrad: unit '", u.name, "' has no gradient; write grad() first");
  const size_t n = u.layout.shardNumel();
  if (m.shards > 1) {
    HSDP_RETURN_IF_ERROR(m.reduceScatter(u.full_grad, u.grad_shard.as<float>(), n)
                             .withContext(strCat("reduce-scatter of unit '", u.name, "'")));
    HSDP_RETURN_IF_ERROR(m.pool.release(u.full_grad));
  }
  // The shard is now the average over its shard group; average it over the data-parallel
  // replicas (the whole world in mode none).
  Comm& dp = m.dataParallel();
  if (dp.size() > 1)
    HSDP_RETURN_IF_ERROR(dp.allReduce(u.grad_shard.data(), n, DType::kFloat32, RedOp::kAvg)
                             .withContext(strCat("replica all-reduce of unit '", u.name, "'")));
  u.full_grad = nullptr;
  u.grad_reduced = true;
  return okStatus();
}

Status ShardedModel::step() {
  Impl& m = *impl_;
  if (!m.finalized) return failedPrecondition("step: call finalize() first");
  for (const Unit& u : m.units)
    if (!u.grad_reduced)
      return failedPrecondition("step: unit '", u.name, "' has no reduced gradient; call "
                                "reduceGrad for every unit before step");
  ++m.step;
  for (Unit& u : m.units) {
    adamStep(m.cfg.adam, m.step, u.param_shard.as<float>(), u.grad_shard.as<float>(),
             u.exp_avg.as<float>(), u.exp_avg_sq.as<float>(), u.layout.shardNumel());
    u.grad_reduced = false;
  }
  return okStatus();
}

Status ShardedModel::gatherFullParameters(int unit, std::vector<float>* out) {
  Impl& m = *impl_;
  HSDP_RETURN_IF_ERROR(m.checkUnit(unit, "gatherFullParameters"));
  Unit& u = m.units[unit];
  out->resize(u.layout.numel());
  if (m.shards == 1) {
    std::memcpy(out->data(), u.param_shard.data(), u.layout.numel() * sizeof(float));
    return okStatus();
  }
  HSDP_ASSIGN_OR_RETURN(void* block, m.pool.acquire(/*zero=*/false));
  Status s = m.gather(u.param_shard.as<float>(), static_cast<float*>(block), u.layout.shardNumel());
  if (s.ok()) std::memcpy(out->data(), block, u.layout.numel() * sizeof(float));
  HSDP_RETURN_IF_ERROR(m.pool.release(block));
  return s;
}

MemoryReport ShardedModel::memoryReport() const {
  const Impl& m = *impl_;
  MemoryReport r;
  for (const Unit& u : m.units) {
    r.param_bytes += u.param_shard.size();
    r.grad_bytes += u.grad_shard.size();
    r.optim_bytes += u.exp_avg.size() + u.exp_avg_sq.size();
  }
  r.gathered_peak_bytes = m.pool.peakBytes();
  r.gathered_capacity_bytes = m.pool.capacityBytes();
  const Mesh& mesh = *m.mesh;
  r.comm_bytes = m.hier->scratchBytes() + mesh.intraShard().scratchBytes() +
                 mesh.interShard().scratchBytes() + mesh.shardGroup().scratchBytes() +
                 mesh.replica().scratchBytes() + mesh.world().scratchBytes();
  return r;
}

}  // namespace hsdp
