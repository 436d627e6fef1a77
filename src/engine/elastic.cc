// Elastic mode's part of ShardedModel (docs/elastic.md): joining the job at finalize(), each
// step's beginStep() (quorum, replica ring, heal) and the commit inside step(). The protocol and
// the transport are engine/elastic_group.h's; this file says which of the model's buffers they
// move.
#include <cinttypes>
#include <cstdio>

#include "engine/sharded_model_impl.h"

namespace hsdp {

using engine::Unit;

Status ShardedModel::Impl::startElastic(uint64_t signature) {
  if (cfg.elastic.endpoint->empty()) return okStatus();
  // What must agree between replica groups: the model, the group's mesh and mode, precision and
  // optimizer (a group launched with another is refused by name).
  const MeshShape& s = mesh->shape();
  char units_hex[17];
  std::snprintf(units_hex, sizeof(units_hex), "%016" PRIx64, signature);
  const std::string fingerprint =
      strCat("units=", this->units.size(), ":", units_hex, ";mode=", shardModeName(cfg.mode),
             ";ranks=", s.world_size, ";mesh=", s.intra_shard, "x", s.inter_shard,
             ";param=", dtypeName(cfg.precision.param_dtype),
             ";reduce=", dtypeName(cfg.precision.reduce_dtype),
             ";optimizer=", optimizerName(cfg.adam.kind));
  HSDP_ASSIGN_OR_RETURN(elastic, engine::ElasticGroup::create(cfg.elastic, *coll, fingerprint));
  coll->attachGroups(elastic.get());
  return okStatus();
}

StatusOr<bool> ShardedModel::Impl::elasticCommit() {
  // Every unit's average was started as its reduce-scatter landed (reduce.cc).
  return elastic->commit();
}

bool ShardedModel::elastic() const { return impl_->elastic != nullptr; }

StatusOr<StepStart> ShardedModel::beginStep() {
  Impl& m = *impl_;
  if (!m.finalized) return failedPrecondition("beginStep: call finalize() first");
  if (!m.elastic) {
    StepStart out;
    out.step = m.step;
    out.present = {0};
    return out;
  }
  HSDP_RETURN_IF_ERROR(m.checkIdle("beginStep"));
  // A heal writes the training state: a save in flight must have copied it first.
  HSDP_RETURN_IF_ERROR(m.waitForSnapshot());
  // What a heal moves, rank to rank: every unit's fp32 master shard, and for units that train
  // both Adam moments; the step count follows. Then what derives from the master is refreshed.
  engine::HealState state;
  for (Unit& u : m.units) {
    const size_t bytes = u.layout.shardNumel() * sizeof(float);
    state.buffers.push_back({reinterpret_cast<char*>(m.master(u)), bytes});
    if (u.frozen) continue;
    state.buffers.push_back({reinterpret_cast<char*>(u.exp_avg.data()), bytes});
    state.buffers.push_back({reinterpret_cast<char*>(u.exp_avg_sq.data()), bytes});
  }
  state.step = &m.step;
  state.installed = [&m]() -> Status {
    for (Unit& u : m.units) {
      HSDP_RETURN_IF_ERROR(forgetNodeBlock(u.name, u.params, "heal"));
      HSDP_RETURN_IF_ERROR(m.refresh16(u));
      HSDP_RETURN_IF_ERROR(m.refreshEncoded(u));
    }
    if (m.replicatedParams()) HSDP_RETURN_IF_ERROR(m.gatherReplicated(/*frozen_too=*/true));
    return okStatus();
  };
  return m.elastic->begin(m.step, state);
}

StatusOr<std::vector<std::vector<int>>> ShardedModel::elasticMembership(int64_t steps) {
  if (!impl_->elastic) return failedPrecondition("elasticMembership: elastic mode is off");
  return impl_->elastic->membership(steps);
}

}  // namespace hsdp
