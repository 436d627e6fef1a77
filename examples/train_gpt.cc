// train_gpt: a GPT-2 trained on real English text (Debian's fortunes, byte-level) with hybrid
// sharded data parallelism, checked against a single-process reference. One readable training
// loop: forward over the units (wte, wpe, h.0 ... h.{L-1}, ln_f, and wte again as the tied LM
// head), each gathered just in time while the next one's gather is in flight; backward in
// reverse, each unit's gradient reduced as soon as its last use is done (wte's after both of
// its uses); then the optimizer step on the shards. The model's math is gpt/model.h, the flags
// gpt/gpt_options.h, the printing gpt/report.h.
//
//   mpirun -np 8 -x HSDP_RANKS_PER_NODE=4 build/examples/train_gpt --preset small \
//       --mode zero3 --intra-shard 4 --inter-shard 1 --steps 40 --eval-every 10 --sample 200
#include <chrono>
#include <cstdio>
#include <memory>

#include "gpt/data.h"
#include "gpt/gpt_options.h"
#include "gpt/model.h"
#include "gpt/report.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"
#include "mlp/options.h"

namespace {

constexpr const char* kProgram = "train_gpt";

struct Run {
  hsdp::Comm& world;
  hsdp::ShardedModel& model;
  const gpt::Setup& setup;
  const gpt::Options& opt;
  const gpt::Corpus& corpus;
  std::vector<gpt::UnitInfo> units;  // what each engine unit holds (same index)
  std::vector<int> order;            // wte, wpe, h.0, ..., ln_f, wte
  gpt::Model net;                    // the math and this rank's activations
  hsdp::ScheduleOptions schedule;
  std::vector<int32_t> tokens, targets;  // this rank's slice of the micro-batch
  int perRank() const { return setup.train.batch / setup.train.accum / world.size(); }
};

// The unit's full parameters (after its gather) and gradient buffers, one pointer per
// parameter in registration order: what gpt::Model reads and writes.
hsdp::Status unitParams(Run& run, int u, std::vector<const float*>* p) {
  p->clear();
  for (const hsdp::ParamSpec& s : run.units[u].params) {
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView v, run.model.param(u, s.name));
    p->push_back(v.data);
  }
  return hsdp::okStatus();
}
hsdp::Status unitGrads(Run& run, int u, std::vector<float*>* g) {
  g->clear();
  for (const hsdp::ParamSpec& s : run.units[u].params) {
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView v, run.model.grad(u, s.name));
    g->push_back(v.data);
  }
  return hsdp::okStatus();
}

// Forward over the unit order; gpt::Model keeps what backward needs. Position pos of the
// order tells the model which use of a unit this is (wte: the embedding first, the head last).
hsdp::Status forward(Run& run) {
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

// One micro-step: forward and backward of this rank's slice of micro-batch `micro`; gradients
// add into the engine's buffers, and only the last micro-step reduces them.
hsdp::StatusOr<float> microStep(Run& run, int step, int micro, bool last) {
  const gpt::TrainSettings& t = run.setup.train;
  const int per_rank = run.perRank();
  const int64_t first = int64_t(micro) * (t.batch / t.accum) + run.world.rank() * per_rank;
  gpt::fillBatch(run.corpus, run.setup.model, t.data_seed, step, first, per_rank, &run.tokens,
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

// One optimizer step at the schedule's rate: `accum` micro-steps, then the step on the shards.
hsdp::StatusOr<float> trainStep(Run& run, int step) {
  // Set before backward: with CPU offload a unit's step starts as soon as it is reduced.
  HSDP_RETURN_IF_ERROR(run.model.setLearningRate(run.setup.train.schedule.at(step)));
  float loss = 0;
  for (int k = 0; k < run.setup.train.accum; ++k) {
    HSDP_ASSIGN_OR_RETURN(float l, microStep(run, step, k, k + 1 == run.setup.train.accum));
    loss += l / run.setup.train.accum;
  }
  HSDP_RETURN_IF_ERROR(run.model.step());
  return loss;
}

// Validation loss: forward only over eval_batches micro-batches of evenly spaced validation
// sequences (this rank's slice of each), averaged over every rank.
hsdp::StatusOr<float> evaluate(Run& run) {
  const int per_rank = run.perRank(), T = run.setup.model.context;
  const int64_t micro = int64_t(per_rank) * run.world.size();
  const int64_t count = micro * run.opt.eval_batches;
  run.tokens.resize(static_cast<size_t>(per_rank) * T);
  run.targets.resize(run.tokens.size());
  double sum = 0;
  for (int k = 0; k < run.opt.eval_batches; ++k) {
    for (int s = 0; s < per_rank; ++s)
      gpt::valSequence(run.corpus, k * micro + run.world.rank() * per_rank + s, count, T,
                       run.tokens.data() + s * T, run.targets.data() + s * T);
    run.net.setBatch(per_rank, T, run.tokens.data(), run.targets.data());
    HSDP_RETURN_IF_ERROR(forward(run));
    sum += run.net.loss();
  }
  std::vector<float> all(run.world.size());
  const float mine = static_cast<float>(sum / run.opt.eval_batches);
  HSDP_RETURN_IF_ERROR(run.world.allGather(&mine, all.data(), 1, hsdp::DType::kFloat32));
  double mean = 0;
  for (float v : all) mean += v / all.size();
  return static_cast<float>(mean);
}

// The body of the program; a non-OK Status before the first step is bad input every rank sees
// alike (exit 2); a failure after it ends the job (exit 3), so no rank waits on a collective
// another rank will never issue.
int runMain(const gpt::Options& opt, hsdp::Comm& world) {
  const int rank = world.rank();
  auto fail = [&](const hsdp::Status& s) {
    mlp::printError(kProgram, rank, s.toString());
    return mlp::kExitUsage;
  };
  auto abort = [&](const hsdp::Status& s) {
    mlp::printError(kProgram, rank, s.toString());
    world.abortJob(mlp::kExitRuntime);
  };
  gpt::Setup setup;
  if (hsdp::Status s = gpt::configure(opt, world.size(), &setup); !s.ok()) return fail(s);
  auto corpus = gpt::loadCorpus(opt.data, setup.model.context);
  if (!corpus.ok()) return fail(corpus.status());
  auto layout = hsdp::groupRanksIntoNodes(world);
  if (!layout.ok()) return fail(layout.status());
  auto mesh = hsdp::Mesh::create(world, *layout, setup.mesh);
  if (!mesh.ok()) return fail(mesh.status());
  auto model_or = hsdp::ShardedModel::create(**mesh, setup.engine);
  if (!model_or.ok()) return fail(model_or.status());
  hsdp::ShardedModel& model = **model_or;

  // One engine unit per gpt unit, under GPT-2's names; the same initial values on every rank.
  Run run{world,
          model,
          setup,
          opt,
          *corpus,
          gpt::units(setup.model),
          gpt::unitOrder(setup.model),
          gpt::Model(setup.model, opt.activation_checkpointing),
          {opt.prefetch},
          {},
          {}};
  for (const gpt::UnitInfo& u : run.units)
    if (auto s = model.addUnit(u.name, u.params); !s.ok()) return fail(s.status());
  if (hsdp::Status s = model.finalize(); !s.ok()) return fail(s);
  for (size_t u = 0; u < run.units.size(); ++u) {
    const std::vector<float> init = gpt::initUnit(setup.model, static_cast<int>(u));
    size_t off = 0;
    for (const hsdp::ParamSpec& p : run.units[u].params) {
      if (hsdp::Status s = model.setParameter(u, p.name, init.data() + off, p.numel()); !s.ok())
        return fail(s);
      off += p.numel();
    }
  }
  gpt::printHeader(kProgram, world, **mesh, setup, opt, *corpus);

  auto evalAndPrint = [&](int step) {
    if (opt.eval_batches == 0) return;
    auto t0 = std::chrono::steady_clock::now();
    auto val = evaluate(run);
    if (!val.ok()) abort(val.status());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 0)
      std::printf("  val loss %.4f after step %d (%lld sequences, %.1f s)\n", *val, step,
                  static_cast<long long>(run.perRank()) * world.size() * opt.eval_batches, s);
    std::fflush(stdout);
  };

  double optim_total = 0, optim_exposed = 0;  // offload: worker time, and what step() waited
  const int steps = setup.train.steps;
  if (opt.eval_every > 0 && steps > 0) evalAndPrint(0);
  for (int step = 0; step < steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    auto loss = trainStep(run, step);
    auto t1 = std::chrono::steady_clock::now();
    if (!loss.ok()) abort(loss.status());
    gpt::StepStats st;
    st.loss = *loss;
    st.lr = setup.train.schedule.at(step);
    st.time_ms = std::chrono::duration<float, std::milli>(t1 - t0).count();
    st.exposed_comm_ms = static_cast<float>(model.takeExposedCommSeconds() * 1e3);
    double ot = 0, oe = 0;
    model.takeOptimizerSeconds(&ot, &oe);
    optim_total += ot, optim_exposed += oe;
    st.optim_ms = static_cast<float>(ot * 1e3), st.optim_exposed_ms = static_cast<float>(oe * 1e3);
    if (hsdp::Status s = gpt::printStepRow(world, model, setup, step, st); !s.ok()) abort(s);
    if (opt.eval_every > 0 && (step + 1) % opt.eval_every == 0 && step + 1 < steps)
      evalAndPrint(step + 1);
  }
  evalAndPrint(steps);
  mlp::printOffloadSummary(world, setup.engine, opt.common, optim_total, optim_exposed);

  // The trained parameters in full (collective), for the sample and the parity check.
  std::vector<std::vector<float>> full(run.units.size());
  if (opt.sample > 0 || opt.common.check)
    for (size_t u = 0; u < run.units.size(); ++u)
      if (hsdp::Status s = model.gatherFullParameters(u, &full[u]); !s.ok()) abort(s);
  if (opt.sample > 0 && rank == 0) {
    const std::string text =
        gpt::generate(setup.model, full, opt.prompt, opt.sample, opt.temperature, opt.sample_seed);
    std::printf("\nsample (%d tokens, temperature %g, seed %llu):\n%s%s\n", opt.sample,
                opt.temperature, static_cast<unsigned long long>(opt.sample_seed),
                gpt::printable(opt.prompt).c_str(), gpt::printable(text).c_str());
  }
  std::vector<uint64_t> numels;
  for (const gpt::UnitInfo& u : run.units) {
    numels.push_back(0);
    for (const hsdp::ParamSpec& p : u.params) numels.back() += p.numel();
  }
  if (!mlp::printMemory(world, **mesh, model, numels, setup.engine).ok())
    world.abortJob(mlp::kExitRuntime);
  if (rank == 0)
    std::printf("activations (rank 0): %.2f MiB (activation checkpointing %s)\n",
                run.net.activationBytes() / 1048576.0, opt.activation_checkpointing ? "on" : "off");
  if (!opt.common.check) return 0;

  // --check: rank 0 trains the single-process reference; every rank learns the verdict.
  float verdict[2] = {0, 0};  // {max_rel_err, pass}
  if (rank == 0) {
    std::fflush(stdout);
    const double err = gpt::referenceError(**mesh, model, setup, *corpus, full);
    verdict[0] = static_cast<float>(err);
    verdict[1] = err <= opt.common.tolerance ? 1.0f : 0.0f;
  }
  if (!world.broadcast(verdict, 2, hsdp::DType::kFloat32, 0).ok())
    world.abortJob(mlp::kExitRuntime);
  if (rank == 0)
    std::printf("\nparity vs reference: max_rel_err=%.3g %s\n", verdict[0],
                verdict[1] == 1.0f ? "PASS" : "FAIL");
  std::fflush(stdout);
  return verdict[1] == 1.0f ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  mlp::Started started;
  if (auto rc = mlp::startMpi(kProgram, &argc, &argv, &started)) return *rc;
  gpt::Options opt;
  if (auto rc = gpt::parseCommandLine(kProgram, argc, argv, started.world->rank(), &opt))
    return *rc;
  return runMain(opt, *started.world);
}
