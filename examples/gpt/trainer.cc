#include "gpt/trainer.h"

#include "common/accumulate.h"

namespace gpt {
namespace {

// The unit's full parameters (after its gather) and gradient buffers, one pointer per
// parameter in registration order: what Model reads and writes.
hsdp::Status unitParams(Trainer& run, int u, std::vector<const float*>* p) {
  p->clear();
  for (const hsdp::ParamSpec& s : run.units[u].params) {
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView v, run.model.param(u, s.name));
    p->push_back(v.data);
  }
  return hsdp::okStatus();
}
hsdp::Status unitGrads(Trainer& run, int u, std::vector<float*>* g) {
  g->clear();
  for (const hsdp::ParamSpec& s : run.units[u].params) {
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView v, run.model.grad(u, s.name));
    g->push_back(v.data);
  }
  return hsdp::okStatus();
}

// Forward over the unit order; Model keeps what backward needs. Position pos of the
// order tells the model which use of a unit this is (wte: the embedding first, the head last).
hsdp::Status forward(Trainer& run) {
  int pos = 0;
  std::vector<const float*> p;
  return hsdp::forwardUnits(
      run.model, run.order,
      [&](int u) -> hsdp::Status {
        HSDP_RETURN_IF_ERROR(unitParams(run, u, &p));
        run.net.forward(pos++, p);
        return hsdp::okStatus();
      },
      run.schedule);
}

// One micro-step: forward and backward of this rank's slice of micro-batch `micro` of the
// group's slot (the whole batch unless elastic); gradients add into the engine's buffers, and
// only the last micro-step reduces them.
hsdp::StatusOr<float> microStep(Trainer& run, const hsdp::StepStart& start, int micro, bool last) {
  const TrainSettings& t = run.setup.train;
  const int slot_batch = t.batch / start.slots;
  const int micro_batch = slot_batch / t.accum;
  const int per_rank = micro_batch / run.world.size();
  const int64_t first = int64_t(start.slot) * slot_batch + int64_t(micro) * micro_batch +
                        int64_t(run.world.rank()) * per_rank;
  fillBatch(run.corpus, run.setup.model, t.data_seed, start.step, first, per_rank, &run.tokens,
            &run.targets);
  // The step's gradient is the mean over micro-steps: each adds 1/accum of its own.
  run.net.setBatch(per_rank, run.setup.model.context, run.tokens.data(), run.targets.data(),
                   1.0f / t.accum);
  HSDP_RETURN_IF_ERROR(forward(run));
  // Backward in reverse order: the head first (it starts wte's gradient), the embedding last
  // (it finishes it; the schedule reduces wte there). Unit u-1's gather is prefetched while u
  // computes, and each reduction runs in the background while earlier units compute.
  int pos = static_cast<int>(run.order.size());
  std::vector<const float*> p;
  std::vector<float*> g;
  HSDP_RETURN_IF_ERROR(hsdp::backwardUnits(
      run.model, run.order,
      [&](int u) -> hsdp::Status {
        HSDP_RETURN_IF_ERROR(unitParams(run, u, &p));
        HSDP_RETURN_IF_ERROR(unitGrads(run, u, &g));
        run.net.backward(--pos, p, g);
        return hsdp::okStatus();
      },
      /*reduce_grads=*/last, run.schedule));
  return run.net.loss();
}

}  // namespace

hsdp::Status checkSlots(const TrainSettings& t, int ranks, int slots) {
  if (slots < 1 || t.batch % slots != 0 || (t.batch / slots) % t.accum != 0 ||
      (t.batch / slots / t.accum) % ranks != 0)
    return hsdp::invalidArgument("--batch ", t.batch, " does not split into ", slots,
                                 " elastic group slots x ", t.accum, " micro-steps (--accum) x ",
                                 ranks, " ranks per group: make it a multiple of ",
                                 int64_t(slots) * t.accum * ranks);
  return hsdp::okStatus();
}

// One optimizer step at the schedule's rate: `accum` micro-steps, then the step on the shards.
hsdp::StatusOr<float> trainStep(Trainer& run, const hsdp::StepStart& start) {
  HSDP_RETURN_IF_ERROR(checkSlots(run.setup.train, run.world.size(), start.slots));
  // Set before backward: with CPU offload a unit's step starts as soon as it is reduced. The
  // rate is the committed step's (elastic: also right after a heal moved the step forward).
  HSDP_RETURN_IF_ERROR(
      run.model.setLearningRate(run.setup.train.schedule.at(static_cast<int>(start.step))));
  return examples::accumulateStep(run.model, run.setup.train.accum,
                                  [&](int k, bool last) { return microStep(run, start, k, last); });
}

hsdp::StatusOr<float> trainStep(Trainer& run, int step) {
  hsdp::StepStart start;
  start.step = step;
  return trainStep(run, start);
}

// Validation loss: forward only over `batches` micro-batches of evenly spaced validation
// sequences (this rank's slice of each), averaged over every rank.
hsdp::StatusOr<float> evaluate(Trainer& run, int batches) {
  const int per_rank = run.perRank(), T = run.setup.model.context;
  const int64_t micro = int64_t(per_rank) * run.world.size();
  const int64_t count = micro * batches;
  run.tokens.resize(static_cast<size_t>(per_rank) * T);
  run.targets.resize(run.tokens.size());
  double sum = 0;
  for (int k = 0; k < batches; ++k) {
    for (int s = 0; s < per_rank; ++s)
      valSequence(run.corpus, k * micro + run.world.rank() * per_rank + s, count, T,
                  run.tokens.data() + s * T, run.targets.data() + s * T);
    run.net.setBatch(per_rank, T, run.tokens.data(), run.targets.data());
    HSDP_RETURN_IF_ERROR(forward(run));
    sum += run.net.loss();
  }
  std::vector<float> all(run.world.size());
  const float mine = static_cast<float>(sum / batches);
  HSDP_RETURN_IF_ERROR(run.world.allGather(&mine, all.data(), 1, hsdp::DType::kFloat32));
  double mean = 0;
  for (float v : all) mean += v / all.size();
  return static_cast<float>(mean);
}

hsdp::Status buildModel(Trainer& run) {
  hsdp::ShardedModel& model = run.model;
  for (const UnitInfo& u : run.units)
    HSDP_RETURN_IF_ERROR(model.addUnit(u.name, u.params).status());
  HSDP_RETURN_IF_ERROR(model.finalize());
  for (size_t u = 0; u < run.units.size(); ++u) {
    const std::vector<float> init = initUnit(run.setup.model, static_cast<int>(u));
    size_t off = 0;
    for (const hsdp::ParamSpec& p : run.units[u].params) {
      HSDP_RETURN_IF_ERROR(
          model.setParameter(static_cast<int>(u), p.name, init.data() + off, p.numel()));
      off += p.numel();
    }
  }
  return hsdp::okStatus();
}

}  // namespace gpt
