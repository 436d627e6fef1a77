// train_gpt: a GPT-2 trained on real English text (Debian's fortunes, byte-level) with hybrid
// sharded data parallelism, checked against a single-process reference. The program: set-up,
// the step loop with its report, evaluation, the sample and --check. The training step itself
// (forward over the units with prefetch, backward with each unit's gradient reduced after its
// last use, the optimizer step) is gpt/trainer.cc; the model's math gpt/model.h; the flags
// gpt/gpt_options.h; the printing gpt/report.h.
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
#include "gpt/trainer.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"
#include "mlp/checkpointing.h"
#include "mlp/options.h"
#include "mlp/reference.h"

namespace {

constexpr const char* kProgram = "train_gpt";

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

  gpt::Trainer run(world, model, setup, *corpus, opt.activation_checkpointing, opt.prefetch);
  if (hsdp::Status s = gpt::buildModel(run); !s.ok()) return fail(s);
  gpt::printHeader(kProgram, world, **mesh, setup, opt, *corpus);

  auto evalAndPrint = [&](int step) {
    if (opt.eval_batches == 0) return;
    auto t0 = std::chrono::steady_clock::now();
    auto val = gpt::evaluate(run, opt.eval_batches);
    if (!val.ok()) abort(val.status());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rank == 0)
      std::printf("  val loss %.4f after step %d (%lld sequences, %.1f s)\n", *val, step,
                  static_cast<long long>(run.perRank()) * world.size() * opt.eval_batches, s);
    std::fflush(stdout);
  };

  // --init-from, then --resume: the first step to train (batches and the learning rate are
  // functions of the step, so a resumed run continues exactly where the saved one stood).
  // The schedule sets every step's rate; the other optimizer settings follow --optimizer-from.
  mlp::RestoreHints hints;
  hints.lr_at = [&](int64_t step) { return setup.train.schedule.at(static_cast<int>(step)); };
  hints.beta2_flag = true;
  auto first = mlp::restore(kProgram, world, model, opt.common, hints);
  if (!first.ok()) return fail(first.status());

  double optim_total = 0, optim_exposed = 0;  // offload: worker time, and what step() waited
  const int steps = setup.train.steps;
  if (opt.eval_every > 0 && steps > *first) evalAndPrint(*first);
  for (int step = *first; step < steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    auto loss = gpt::trainStep(run, step);
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
    if (hsdp::Status s = gpt::printStepRow(world, model, setup, step, st); !s.ok()) {
      if (s.code() == hsdp::StatusCode::kOutOfRange) {  // checkFinite: every rank returns
        mlp::printError(kProgram, rank, s.toString());
        return mlp::kExitRuntime;
      }
      abort(s);
    }
    if (hsdp::Status s = mlp::afterStep(world, model, opt.common, step + 1, step + 1 == steps);
        !s.ok())
      abort(s);
    if (opt.eval_every > 0 && (step + 1) % opt.eval_every == 0 && step + 1 < steps)
      evalAndPrint(step + 1);
  }
  evalAndPrint(steps);
  // A save in flight is waited for; --export writes GPT-2-named tensors (wte.weight,
  // h.0.attn.c_attn.weight, ...: "<unit>.<param>").
  if (hsdp::Status s = mlp::finishCheckpoints(world, model, opt.common); !s.ok()) abort(s);
  mlp::printOffloadSummary(world, setup.engine, opt.common, optim_total, optim_exposed);

  // The trained parameters in full (collective), for the sample and the parity check.
  std::vector<std::vector<float>> full(run.units.size());
  const bool rank0_work = opt.sample > 0 || opt.common.check;
  if (rank0_work)
    for (size_t u = 0; u < run.units.size(); ++u)
      if (hsdp::Status s = model.gatherFullParameters(u, &full[u]); !s.ok()) abort(s);
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
  if (!rank0_work) return 0;

  // Rank 0 samples and, with --check, trains the single-process reference; the other ranks wait
  // for its verdict asleep (the cores are rank 0's meanwhile).
  float verdict[2] = {0, 0};  // {max_rel_err, pass}: rank 0's, zeros elsewhere, summed
  if (rank == 0) {
    if (opt.sample > 0) {
      const std::string text = gpt::generate(setup.model, full, opt.prompt, opt.sample,
                                             opt.temperature, opt.sample_seed);
      std::printf("\nsample (%d tokens, temperature %g, seed %llu):\n%s%s\n", opt.sample,
                  opt.temperature, static_cast<unsigned long long>(opt.sample_seed),
                  gpt::printable(opt.prompt).c_str(), gpt::printable(text).c_str());
      std::fflush(stdout);
    }
    if (opt.common.check) {
      const double err = gpt::referenceError(**mesh, model, setup, *corpus, full);
      verdict[0] = static_cast<float>(err);
      verdict[1] = err <= opt.common.tolerance ? 1.0f : 0.0f;
    }
  }
  if (hsdp::Status s = mlp::shareVerdict(world, verdict); !s.ok()) abort(s);
  if (!opt.common.check) return 0;
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
