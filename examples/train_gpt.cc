// train_gpt: a GPT-2 trained on real English text (Debian's fortunes, byte-level) with hybrid
// sharded data parallelism, checked against a single-process reference.
//
//   mpirun -np 8 -x HSDP_RANKS_PER_NODE=4 build/examples/train_gpt --preset small \
//       --mode zero3 --intra-shard 4 --inter-shard 1 --steps 40 --eval-every 10 --sample 200
//
// Read this file first: it is the program, top to bottom. Set-up (flags, corpus, mesh, engine,
// model, resume); the loop (schedule, step, report, maybe evaluate, maybe save); then what the
// trained model is for (memory table, sample, --check). The pieces it calls are small and each in
// one place: one training step on the engine (forward over the units with prefetch, backward with
// each unit's gradient reduced after its last use, the optimizer step) is gpt/trainer.h, the
// model's math gpt/model.h, the flags gpt/gpt_options.h, the printing gpt/report.h, and what
// every example shares (MPI start, checkpoints, the failure policy) common/.
#include <chrono>
#include <cstdio>
#include <vector>

#include "common/checkpointing.h"
#include "common/failure.h"
#include "common/reference.h"
#include "common/report.h"
#include "common/session.h"
#include "common/step_split.h"
#include "common/stopping.h"
#include "gpt/data.h"
#include "gpt/gpt_options.h"
#include "gpt/model.h"
#include "gpt/report.h"
#include "gpt/trainer.h"
#include "hsdp/mesh.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"

namespace {

constexpr const char* kProgram = "train_gpt";
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The validation loss (collective), printed by rank 0:
//   val loss 4.2311 after step 10 (64 sequences, 0.3 s)
hsdp::Status evaluate(gpt::Trainer& run, int batches, int step) {
  const auto t0 = Clock::now();
  HSDP_ASSIGN_OR_RETURN(float val, gpt::evaluate(run, batches));
  if (run.world.rank() == 0)
    std::printf("  val loss %.4f after step %d (%lld sequences, %.1f s)\n", val, step,
                static_cast<long long>(run.perRank()) * run.world.size() * batches,
                secondsSince(t0));
  std::fflush(stdout);
  return hsdp::okStatus();
}

// This rank's numbers of the step just taken; the engine's timers are read (and reset) here, the
// optimizer's also added to the run's totals.
gpt::StepStats measure(hsdp::ShardedModel& model, float loss, float lr, double seconds,
                       double* optim_total, double* optim_exposed) {
  gpt::StepStats st;
  st.loss = loss;
  st.lr = lr;
  st.time_ms = static_cast<float>(seconds * 1e3);
  st.exposed_comm_ms = static_cast<float>(model.takeExposedCommSeconds() * 1e3);
  double ot = 0, oe = 0;
  model.takeOptimizerSeconds(&ot, &oe);
  *optim_total += ot, *optim_exposed += oe;
  st.optim_ms = static_cast<float>(ot * 1e3), st.optim_exposed_ms = static_cast<float>(oe * 1e3);
  return st;
}

// After training, on rank 0: the sample, and with --check the reference trained in one process
// and compared; the other ranks wait for the verdict asleep (the cores are rank 0's meanwhile).
// Returns the exit code: 0, or 1 when --check fails.
int sampleAndCheck(const examples::Failure& fail, const gpt::Options& opt, gpt::Trainer& run,
                   const hsdp::Mesh& mesh, examples::Checkpoints& ckpt,
                   const std::vector<std::vector<float>>& full) {
  // Elastic with each group keeping its slice: the reference replays which groups each step
  // averaged, read from etcd (collective over the group) and, for the steps before a resumed
  // checkpoint, from its record; redistribute trains on the whole batch every step: the plain
  // reference.
  gpt::Membership membership;
  const hsdp::ElasticPolicy& elastic = run.model.config().elastic;
  if (opt.common.check && run.model.elastic() && *elastic.data == hsdp::ElasticData::kKeepSlice) {
    auto m = ckpt.membership(run.setup.train.steps);
    if (!m.ok()) fail.alone(m.status());
    membership = std::move(*m);
  }
  float verdict[2] = {0, 0};  // {max_rel_err, pass}: rank 0's, zeros elsewhere, summed
  if (run.world.rank() == 0) {
    if (opt.sample > 0) {
      const std::string text = gpt::generate(run.setup.model, full, opt.prompt, opt.sample,
                                             opt.temperature, opt.sample_seed);
      std::printf("\nsample (%d tokens, temperature %g, seed %llu):\n%s%s\n", opt.sample,
                  opt.temperature, static_cast<unsigned long long>(opt.sample_seed),
                  gpt::printable(opt.prompt).c_str(), gpt::printable(text).c_str());
      std::fflush(stdout);
    }
    if (opt.common.check) {
      const double err = gpt::referenceError(mesh, run.model, run.setup, run.corpus, full,
                                             membership.empty() ? nullptr : &membership);
      verdict[0] = static_cast<float>(err);
      verdict[1] = err <= opt.common.tolerance ? 1.0f : 0.0f;
    }
  }
  if (hsdp::Status s = examples::shareVerdict(run.world, verdict); !s.ok()) fail.alone(s);
  if (!opt.common.check) return 0;
  if (run.world.rank() == 0)
    std::printf("\nparity vs reference: max_rel_err=%.3g %s\n", verdict[0],
                verdict[1] == 1.0f ? "PASS" : "FAIL");
  std::fflush(stdout);
  return verdict[1] == 1.0f ? 0 : 1;
}

int train(const gpt::Options& opt, hsdp::Comm& world) {
  // The one failure policy (common/failure.h): what every rank meets alike is printed by every
  // rank and returned; what a rank may meet alone ends the job (fail.alone), so no rank waits in
  // a collective another rank will never issue.
  const examples::Failure fail(kProgram, world, world);

  // ---- Set-up. Every failure here is bad input every rank sees alike: exit 2. ----
  gpt::Setup setup;
  if (hsdp::Status s = gpt::configure(opt, world.size(), &setup); !s.ok())
    return fail.agreed(s, examples::kExitUsage);
  auto corpus = gpt::loadCorpus(opt.data, setup.model.context);
  if (!corpus.ok()) return fail.agreed(corpus.status(), examples::kExitUsage);
  auto layout = hsdp::groupRanksIntoNodes(world);
  if (!layout.ok()) return fail.agreed(layout.status(), examples::kExitUsage);
  auto mesh = hsdp::Mesh::create(world, *layout, setup.mesh);
  if (!mesh.ok()) return fail.agreed(mesh.status(), examples::kExitUsage);
  auto model_or = hsdp::ShardedModel::create(**mesh, setup.engine);
  if (!model_or.ok()) return fail.agreed(model_or.status(), examples::kExitUsage);
  hsdp::ShardedModel& model = **model_or;
  gpt::Trainer run(world, model, setup, *corpus, opt.activation_checkpointing, opt.prefetch);
  if (hsdp::Status s = gpt::buildModel(run); !s.ok()) return fail.agreed(s, examples::kExitUsage);
  gpt::printHeader(kProgram, world, **mesh, setup, opt, *corpus);

  // --init-from, then --resume: the first step to train (batches and the learning rate are
  // functions of the step, so a resumed run continues exactly where the saved one stood).
  // The schedule sets every step's rate; the other optimizer settings follow --optimizer-from.
  const int steps = setup.train.steps;
  examples::Checkpoints ckpt(world, model, opt.common.ckpt, opt.common.seed);
  examples::RestoreHints hints;
  hints.lr_at = [&](int64_t step) { return setup.train.schedule.at(static_cast<int>(step)); };
  hints.beta2_flag = true;
  // --init-from also reads what HF's save_pretrained writes for GPT-2: the same parameter names
  // under "transformer.", the LM head tied (absent, or "lm_head.weight": skipped), and in older
  // files each layer's attention-mask buffers (not parameters: skipped).
  hints.weights.prefixes = {"", "transformer."};
  hints.weights.ignore = {"lm_head.weight"};
  for (int l = 0; l < setup.model.layers; ++l)
    for (const char* buffer : {"attn.bias", "attn.masked_bias"})
      hints.weights.ignore.insert("transformer.h." + std::to_string(l) + "." + buffer);
  auto first = ckpt.restore(steps, hints);
  if (!first.ok()) return fail.agreed(first.status(), examples::kExitUsage);

  // Elastic mode with each group keeping its slice: the batch must split into the job's groups
  // (with redistribute the count of groups present is checked at each step).
  if (model.elastic() && *model.config().elastic.data == hsdp::ElasticData::kKeepSlice)
    if (hsdp::Status s = gpt::checkSlots(setup.train, world.size(), *model.config().elastic.groups);
        !s.ok())
      return fail.agreed(s, examples::kExitUsage);

  // ---- The loop: one pass per step, and one more at the end (`last`) to evaluate. ----
  // SIGTERM / SIGUSR1 from here on stop the run after an agreed step, with a checkpoint
  // (common/stopping.h).
  if (hsdp::Status s = examples::installStopSignals(); !s.ok())
    return fail.agreed(s, examples::kExitRuntime);
  double optim_total = 0, optim_exposed = 0;  // offload: worker time, and what step() waited
  int step = *first;
  bool first_pass = true;  // the first step this run trains (after a heal: the step healed to)
  int evaluated = -1;      // the step last evaluated (a step run again is not evaluated again)
  for (;;) {
    // The step to run: model.beginStep() (elastic mode: the step's quorum, and a heal when this
    // group (re)joined or missed steps, which moves the step forward; docs/elastic.md). Without
    // elastic mode it returns the model's step count, slot 0 of 1, at no cost.
    hsdp::StepStart start;
    if (step < steps) {
      hsdp::StatusOr<hsdp::StepStart> begin = model.beginStep();
      if (!begin.ok()) fail.alone(begin.status());
      examples::printStepStart(world, *begin);
      start = *begin;
      step = static_cast<int>(start.step);
    }
    const bool last = step >= steps;
    if (last) step = steps;

    // Maybe evaluate: every --eval-every steps (from the first step this run trains), and once
    // after the last step whenever --eval-batches > 0.
    const bool eval_due = opt.eval_every > 0 && (first_pass || step % opt.eval_every == 0);
    first_pass = false;
    if (opt.eval_batches > 0 && (eval_due || last) && step != evaluated) {
      if (hsdp::Status s = evaluate(run, opt.eval_batches, step); !s.ok()) fail.alone(s);
      evaluated = step;
    }
    if (last) break;

    // The step at the schedule's rate: `accum` micro-steps of forward and backward over the
    // units on this group's slot of the batch, then the optimizer on the shards (gpt/trainer.h).
    const float lr = setup.train.schedule.at(step);
    const auto t0 = Clock::now();
    hsdp::StatusOr<float> loss = gpt::trainStep(run, start);
    const double seconds = secondsSince(t0);
    if (!loss.ok() && loss.status().code() == hsdp::StatusCode::kAborted) {
      // Elastic: the quorum did not commit the step, nothing was applied: run it again, from
      // beginStep() (the same data and rate: both follow the committed step).
      examples::printAbortedStep(world, start, loss.status());
      model.takeExposedCommSeconds();  // this attempt's timers are not the next one's
      (void)model.takeStepAccounting();
      double ot = 0, oe = 0;
      model.takeOptimizerSeconds(&ot, &oe);
      continue;
    }
    if (!loss.ok()) fail.alone(loss.status());

    // Report: every rank's numbers into one row (collective), printed by rank 0.
    const gpt::StepStats stats = measure(model, *loss, lr, seconds, &optim_total, &optim_exposed);
    hsdp::StatusOr<gpt::StepRow> row = gpt::gatherStepRow(world, model, stats);
    if (!row.ok()) fail.alone(row.status());
    // exposed_ms and comm%: the split's exposed communication (docs/trace.md, "Accounting").
    auto split = examples::gatherStepSplit(world, seconds * 1e3, model.takeStepAccounting());
    if (!split.ok()) fail.alone(split.status());
    row->exposed_ms = split->exposed_ms();
    gpt::printStepRow(world, setup, step, *row);
    examples::printStepSplit(world, *split);

    // A loss or gradient norm that is not finite ends training here, unless --allow-nonfinite.
    // Both are global (the mean over the ranks, the global norm), so every rank stops alike.
    if (hsdp::Status s =
            examples::checkFinite(setup.train.allow_nonfinite, step, row->loss, row->grad_norm);
        !s.ok())
      return fail.agreed(s, examples::kExitRuntime);

    // Maybe save: every --save-every steps and after the last one (--save-dir).
    if (hsdp::Status s = ckpt.afterStep(step + 1, step + 1 == steps); !s.ok()) fail.alone(s);

    // A stop request on any rank (preemption, the time limit's signal): all stop after this step.
    if (step + 1 < steps) {
      auto stop = examples::stopIfRequested(kProgram, (*mesh)->control(), world, ckpt, step + 1);
      if (!stop.ok()) fail.alone(stop.status());
      if (stop->has_value()) return **stop;
    }
    step = static_cast<int>(model.stepCount());  // the steps committed: step + 1
  }

  // ---- After training. ----
  // A save in flight is waited for; --export writes GPT-2-named tensors (wte.weight,
  // h.0.attn.c_attn.weight, ...: "<unit>.<param>").
  if (hsdp::Status s = ckpt.finish(); !s.ok()) fail.alone(s);
  examples::printOffloadSummary(world, setup.engine, steps, optim_total, optim_exposed);
  if (hsdp::Status s = model.writeTrace(); !s.ok()) fail.alone(s);  // --trace, HSDP_TRACE

  // The trained parameters in full (collective), for the sample and the parity check.
  std::vector<std::vector<float>> full(run.units.size());
  const bool rank0_work = opt.sample > 0 || opt.common.check;
  if (rank0_work)
    for (size_t u = 0; u < run.units.size(); ++u)
      if (hsdp::Status s = model.gatherFullParameters(u, &full[u]); !s.ok()) fail.alone(s);
  std::vector<uint64_t> numels;
  for (const gpt::UnitInfo& u : run.units) {
    numels.push_back(0);
    for (const hsdp::ParamSpec& p : u.params) numels.back() += p.numel();
  }
  std::vector<uint32_t> uses(run.units.size(), 0);  // the forward order names wte twice
  for (int u : run.order) ++uses[u];
  if (hsdp::Status s = examples::printMemory(world, **mesh, model, numels, setup.engine, uses);
      !s.ok())
    fail.alone(s);
  if (world.rank() == 0)
    std::printf("activations (rank 0): %.2f MiB (activation checkpointing %s)\n",
                run.net.activationBytes() / 1048576.0, opt.activation_checkpointing ? "on" : "off");
  if (!rank0_work) return 0;
  return sampleAndCheck(fail, opt, run, **mesh, ckpt, full);
}

}  // namespace

int main(int argc, char** argv) {
  examples::Started mpi;
  if (auto rc = examples::startMpi(kProgram, &argc, &argv, &mpi)) return *rc;
  gpt::Options opt;
  if (auto rc = gpt::parseCommandLine(kProgram, argc, argv, mpi.world->rank(), &opt)) return *rc;
  return train(opt, *mpi.world);
}
