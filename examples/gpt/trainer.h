// The training loop of train_gpt on the engine, one readable piece: forward over the unit order
// (wte, wpe, h.0 ... h.{L-1}, ln_f, and wte again as the tied LM head), each unit gathered just
// in time while the next one's gather is in flight (hsdp::forwardUnits); backward in reverse,
// each unit's gradient reduced as soon as its last use is done, wte's after both of its uses
// (hsdp::backwardUnits); then the optimizer step on the shards at the schedule's rate.
// train_gpt and gpt_bench run it.
#pragma once

#include <vector>

#include "gpt/data.h"
#include "gpt/gpt_options.h"
#include "gpt/model.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "hsdp/transport.h"

namespace gpt {

struct Trainer {
  Trainer(hsdp::Comm& w, hsdp::ShardedModel& m, const Setup& s, const Corpus& c, bool checkpoint,
          int prefetch)
      : world(w),
        model(m),
        setup(s),
        corpus(c),
        units(gpt::units(s.model)),
        order(unitOrder(s.model)),
        net(s.model, checkpoint),
        schedule{prefetch} {}
  hsdp::Comm& world;
  hsdp::ShardedModel& model;
  const Setup& setup;
  const Corpus& corpus;
  std::vector<UnitInfo> units;  // what each engine unit holds (same index)
  std::vector<int> order;       // wte, wpe, h.0, ..., ln_f, wte
  Model net;                    // the math and this rank's activations
  hsdp::ScheduleOptions schedule;
  std::vector<int32_t> tokens, targets;  // this rank's slice of the micro-batch
  int perRank() const { return setup.train.batch / setup.train.accum / world.size(); }
};

// One engine unit per gpt unit under GPT-2's names, finalized (collective), the same initial
// values on every rank.
[[nodiscard]] hsdp::Status buildModel(Trainer& run);
// The check behind a data slot: the global batch splits into `slots` group slots x `accum`
// micro-steps x the group's ranks (InvalidArgument naming the numbers otherwise).
[[nodiscard]] hsdp::Status checkSlots(const TrainSettings& t, int ranks, int slots);
// One optimizer step (`start.step`, 0-based, at the schedule's rate of that step) on slice
// `start.slot` of `start.slots` equal parts of the step's global batch (the whole batch unless
// elastic, ShardedModel::beginStep): `accum` micro-steps, then the step on the shards; returns
// this rank's mean loss. Elastic: kAborted when the quorum did not commit (nothing applied).
[[nodiscard]] hsdp::StatusOr<float> trainStep(Trainer& run, const hsdp::StepStart& start);
// The same on the whole batch of 0-based `step` (slot 0 of 1).
[[nodiscard]] hsdp::StatusOr<float> trainStep(Trainer& run, int step);
// Validation loss over `batches` micro-batches of evenly spaced validation sequences (this
// rank's slice of each), averaged over every rank (collective).
[[nodiscard]] hsdp::StatusOr<float> evaluate(Trainer& run, int batches);

}  // namespace gpt
