// finalize(): every buffer the engine will use, allocated once (and pre-faulted by the memory
// space), and the memory report that counts exactly those buffers, side by side so that the two
// cannot drift apart.
#include <xxhash.h>

#include <algorithm>

#include "engine/sharded_model_impl.h"
#include "hsdp/log.h"

namespace hsdp {

using engine::DecaySpan;
using engine::Unit;

namespace {

// Every rank must hold the same units, or the collectives would pair different buffers and hang
// or corrupt: a signature of all names, shapes and per-unit settings, compared across the world.
uint64_t registrationSignature(const std::vector<Unit>& units) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  for (const Unit& u : units) {
    XXH64_update(st, u.name.data(), u.name.size() + 1);
    const char frozen = u.frozen ? 1 : 0;
    XXH64_update(st, &frozen, 1);
    for (const ParamSpec& p : u.layout.params()) {
      XXH64_update(st, p.name.data(), p.name.size() + 1);
      XXH64_update(st, p.shape.data(), p.shape.size() * sizeof(int64_t));
      const char decay = p.weight_decay ? 1 : 0;
      XXH64_update(st, &decay, 1);
      int64_t sep = -1;
      XXH64_update(st, &sep, sizeof(sep));
    }
  }
  const uint64_t sig = XXH64_digest(st);
  XXH64_freeState(st);
  return sig;
}

// The runs of shard `k` whose parameters share a weight-decay setting (padding joins the run
// before it), merged, in shard-relative offsets. One span when every parameter decays alike.
std::vector<DecaySpan> decaySpans(const FlatLayout& l, int k) {
  std::vector<DecaySpan> spans;
  const size_t sb = static_cast<size_t>(k) * l.shardNumel(), se = sb + l.shardNumel();
  for (size_t i = 0; i < l.params().size(); ++i) {
    const size_t pb = l.offset(i), pe = pb + l.params()[i].numel();
    const size_t b = std::max(sb, pb), e = std::min(se, pe);
    if (b >= e) continue;
    const bool decay = l.params()[i].weight_decay;
    if (!spans.empty() && spans.back().decay == decay &&
        spans.back().begin + spans.back().n == b - sb)
      spans.back().n += e - b;
    else
      spans.push_back({b - sb, e - b, decay});
  }
  // Padding (past the last parameter) steps with the last run; a shard of padding alone decays
  // (its values are zero and stay zero either way).
  const size_t covered = spans.empty() ? 0 : spans.back().begin + spans.back().n;
  if (spans.empty())
    spans.push_back({0, l.shardNumel(), true});
  else if (covered < l.shardNumel())
    spans.back().n += l.shardNumel() - covered;
  return spans;
}

}  // namespace

// Error feedback buffers of the unit's encoded gradient wires, zeroed once.
Status ShardedModel::Impl::allocateResiduals(Unit& u) {
  if (!*cfg.wires.grad_error_feedback || u.frozen) return okStatus();
  const size_t n = u.layout.shardNumel();
  const size_t inter = coll->gradResidualCount(n);
  const size_t replica = coll->replicaResidualCount(n);
  if (inter > 0) {
    HSDP_ASSIGN_OR_RETURN(u.grad_residual, space->allocate(inter * sizeof(float)));
    HSDP_RETURN_IF_ERROR(
        space->zero(u.grad_residual.data(), inter * sizeof(float), Lane::kCompute));
  }
  if (replica > 0) {
    HSDP_ASSIGN_OR_RETURN(u.replica_residual, space->allocate(replica * sizeof(float)));
    HSDP_RETURN_IF_ERROR(
        space->zero(u.replica_residual.data(), replica * sizeof(float), Lane::kCompute));
  }
  return okStatus();
}

Status ShardedModel::finalize() {
  Impl& m = *impl_;
  if (m.finalized) return failedPrecondition("finalize() called twice");
  int64_t mine[2] = {static_cast<int64_t>(m.units.size()),
                     static_cast<int64_t>(registrationSignature(m.units))};
  std::vector<int64_t> all(2 * m.coll->controlSize());
  HSDP_RETURN_IF_ERROR(m.coll->controlAllGather(mine, all.data(), 2, DType::kInt64));
  for (int r = 1; r < m.coll->controlSize(); ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      return invalidArgument("unit registrations differ across ranks: rank 0 registered ", all[0],
                             " units (signature ", std::hex, static_cast<uint64_t>(all[1]),
                             std::dec, "), rank ", r, " registered ", all[2 * r],
                             " units (signature ", std::hex, static_cast<uint64_t>(all[2 * r + 1]),
                             std::dec, "); every rank must add the same units and parameters");
  }
  if (m.units.empty()) return failedPrecondition("finalize(): no units registered");
  HSDP_RETURN_IF_ERROR(m.coll->connectReplicas());

  size_t max_shard = 0, max_padded = 0;
  MemorySpace& sp = *m.space;
  // What the CPU Adam steps in place (offload on host memory: the master and the gradient
  // shard) is NUMA-placed host memory, as the moments; everything else comes from the space.
  auto allocateStepped = [&](bool stepped, size_t bytes) -> StatusOr<SpaceBuffer> {
    if (!stepped || !m.opt->offloaded() || m.onDevice()) return sp.allocate(bytes);
    HSDP_ASSIGN_OR_RETURN(HostBuffer b, HostBuffer::allocateNuma(bytes, m.opt->numa()));
    return SpaceBuffer::wrap(std::move(b));
  };
  for (Unit& u : m.units) {
    const size_t n = u.layout.shardNumel();
    const size_t bytes = n * sizeof(float);
    const size_t full_bytes = u.layout.paddedNumel() * sizeof(float);
    u.decay_spans = decaySpans(u.layout, m.shardIndex());
    const bool bf16_whole = m.cfg.precision.param_dtype == DType::kBFloat16;
    if (m.replicatedParams()) {  // the master is a slice of the whole, or apart with bf16
      HSDP_ASSIGN_OR_RETURN(u.full_params, allocateStepped(!u.frozen && !bf16_whole, full_bytes));
      if (bf16_whole) {
        HSDP_ASSIGN_OR_RETURN(u.param_shard, allocateStepped(!u.frozen, bytes));
      }
      if (m.cfg.mode == ShardMode::kZero1 && !u.frozen) {
        HSDP_ASSIGN_OR_RETURN(u.full_grad_buf, sp.allocate(full_bytes));
      }
    } else {
      HSDP_ASSIGN_OR_RETURN(u.param_shard, allocateStepped(!u.frozen, bytes));
    }
    if (m.bf16Params()) {
      HSDP_ASSIGN_OR_RETURN(u.shard16, sp.allocate(n * sizeof(bf16)));
    }
    if (m.cfg.hpz) {
      HSDP_ASSIGN_OR_RETURN(u.hpz_block, sp.allocate(m.mesh->shape().inter_shard * bytes));
    }
    if (m.encodedParams()) {
      HSDP_ASSIGN_OR_RETURN(u.encoded_shard, sp.allocate(encodedBytes(m.paramWire(), n)));
    }
    max_shard = std::max(max_shard, n);
    max_padded = std::max(max_padded, u.layout.paddedNumel());
    if (u.frozen) continue;  // no gradient, no optimizer state
    HSDP_ASSIGN_OR_RETURN(u.grad_shard, allocateStepped(true, bytes));
    if (m.opt->offloaded()) {  // offload: optimizer state in NUMA-local host memory
      HSDP_ASSIGN_OR_RETURN(HostBuffer ea, HostBuffer::allocateNuma(bytes, m.opt->numa()));
      HSDP_ASSIGN_OR_RETURN(HostBuffer eas, HostBuffer::allocateNuma(bytes, m.opt->numa()));
      u.exp_avg = SpaceBuffer::wrap(std::move(ea));
      u.exp_avg_sq = SpaceBuffer::wrap(std::move(eas));
      if (m.stagedOffload()) {  // on a device: the host copies the CPU Adam steps
        HSDP_ASSIGN_OR_RETURN(u.host_master, HostBuffer::allocateNuma(bytes, m.opt->numa()));
        HSDP_ASSIGN_OR_RETURN(u.host_grad, HostBuffer::allocateNuma(bytes, m.opt->numa()));
      }
      if (m.bf16Params() && m.stagedOffload()) {
        HSDP_ASSIGN_OR_RETURN(u.host16, HostBuffer::allocateNuma(n * sizeof(bf16), m.opt->numa()));
      }
      HSDP_ASSIGN_OR_RETURN(
          u.offload, m.opt->hostCopies().offloadSlot({{u.host_grad.data(), u.host_grad.size()},
                                                      {u.host_master.data(), u.host_master.size()},
                                                      {u.host16.data(), u.host16.size()}}));
    } else {
      HSDP_ASSIGN_OR_RETURN(u.exp_avg, sp.allocate(bytes));
      HSDP_ASSIGN_OR_RETURN(u.exp_avg_sq, sp.allocate(bytes));
    }
    if (m.bf16Reduce()) {
      HSDP_ASSIGN_OR_RETURN(u.grad16, sp.allocate(n * sizeof(bf16)));
    }
    HSDP_RETURN_IF_ERROR(m.allocateResiduals(u));
  }
  // The encoded master starts current (zeros, or what setParameter/load write next).
  for (Unit& u : m.units) HSDP_RETURN_IF_ERROR(m.refreshEncoded(u));
  if (m.bf16Params() || m.bf16Reduce()) {
    HSDP_RETURN_IF_ERROR(m.blocks.pool16.init(m.space.get(), max_padded * sizeof(bf16), 4));
  }
  if (m.shards > 1) {
    // zero3: four blocks: in backward the current unit's parameters, the prefetched next unit's,
    // the gradient being written and one still being reduce-scattered. zero2: the last two.
    // zero1 holds whole gradients and needs none.
    const int blocks = m.cfg.mode == ShardMode::kZero3   ? 4
                       : m.cfg.mode == ShardMode::kZero2 ? 2
                                                         : 0;
    HSDP_RETURN_IF_ERROR(m.blocks.pool.init(m.space.get(), max_padded * sizeof(float), blocks));
  }
  HSDP_RETURN_IF_ERROR(m.coll->reserve(max_shard, m.bf16Params() || m.bf16Reduce()));
  m.coll->group().reserve(m.units.size());
  HSDP_RETURN_IF_ERROR(m.startElastic(registrationSignature(m.units)));
  m.finalized = true;
  HSDP_INFO(kShard, "finalized ", m.units.size(), " units, mode ", shardModeName(m.cfg.mode),
            ", device ", deviceName(m.cfg.device), ", shard group ", m.shards, ", largest unit ",
            max_padded, " elements (padded)");
  return okStatus();
}

MemoryReport ShardedModel::memoryReport() const {
  const Impl& m = *impl_;
  MemoryReport r;
  for (const Unit& u : m.units) {
    r.param_bytes += u.param_shard.size() + u.full_params.size();
    r.grad_bytes += u.grad_shard.size() + u.full_grad_buf.size();
    r.optim_bytes += u.exp_avg.size() + u.exp_avg_sq.size();
    // With offload, the host memory the CPU Adam steps: the moments, and the master and the
    // gradient shard: on a device their host copies; on host memory the shards themselves,
    // stepped in place (one buffer each, in param_bytes/grad_bytes too; total() counts it once).
    if (m.cfg.offload.cpu && !u.frozen) {
      const size_t stepped = m.stagedOffload()
                                 ? u.host_master.size() + u.host_grad.size() + u.host16.size()
                                 : u.layout.shardNumel() * sizeof(float) + u.grad_shard.size();
      r.offload_host_bytes += u.exp_avg.size() + u.exp_avg_sq.size() + stepped;
    }
    r.hpz_bytes += u.hpz_block.size();
    // The encoded wires' per-unit state counts as communication memory.
    r.comm_bytes += u.encoded_shard.size() + u.grad_residual.size() + u.replica_residual.size();
  }
  r.gathered_peak_bytes = m.blocks.pool.peakBytes();
  r.gathered_capacity_bytes = m.blocks.pool.capacityBytes();
  r.comm_bytes += m.coll->scratchBytes();
  return r;
}

}  // namespace hsdp
