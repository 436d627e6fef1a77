// The MLP examples' report and training loop (mlp/options.h): header, one row per step, the
// parity check, and trainAndReport, which train_mlp and train_mlp_gpu both run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/checkpointing.h"
#include "common/failure.h"
#include "common/reference.h"
#include "common/report.h"
#include "common/step_split.h"
#include "common/stopping.h"
#include "hsdp/dtype.h"
#include "mlp/options.h"
#include "mlp/reference.h"

namespace mlp {
namespace {

// One step's numbers over every rank: the mean loss, the model's global gradient norm, the
// slowest rank's time and the most exposed communication.
struct StepRow {
  double loss = 0, grad_norm = 0, max_ms = 0, max_exposed_ms = 0;
};

// Collective over `world`: every rank's loss, step time and exposed communication.
hsdp::StatusOr<StepRow> gatherStepRow(hsdp::Comm& world, const hsdp::ShardedModel& model,
                                      float loss, float time_ms, float exposed_comm_ms) {
  float stats[3] = {loss, time_ms, exposed_comm_ms};
  std::vector<float> all(3 * world.size());
  HSDP_RETURN_IF_ERROR(world.allGather(stats, all.data(), 3, hsdp::DType::kFloat32));
  StepRow row;
  for (int q = 0; q < world.size(); ++q) {
    row.loss += all[3 * q] / world.size();
    row.max_ms = std::max<double>(row.max_ms, all[3 * q + 1]);
    row.max_exposed_ms = std::max<double>(row.max_exposed_ms, all[3 * q + 2]);
  }
  row.grad_norm = model.lastGradNorm();
  return row;
}

// Rank 0 prints the row of 0-based `step`.
void printStepRow(const hsdp::Comm& world, const StepRow& row, int step, int batch) {
  if (world.rank() != 0) return;
  std::printf("%6d %10.5f %10.4f %10.2f %12.0f %14.2f\n", step + 1, row.loss, row.grad_norm,
              row.max_ms, batch / (row.max_ms / 1e3), row.max_exposed_ms);
  std::fflush(stdout);
}

// --check with semi-synchronous replicas (local_sgd, diloco): every rank replays every replica's
// schedule (mlp::trainReplicaReference; the model is small enough) and compares its own replica's
// parameters; the worst error over every rank decides. Returns 0 on PASS, 1 on FAIL.
int checkReplicaParity(const examples::Failure& fail, hsdp::Comm& world, const hsdp::Mesh& mesh,
                       const hsdp::ShardedModel& model, const std::vector<std::vector<float>>& mine,
                       const Spec& spec, const hsdp::EngineConfig& cfg, const Options& opt) {
  const examples::Options& c = opt.common;
  const int me = mesh.coords().replica_rank;
  std::vector<int32_t> replica_of(world.size());
  if (hsdp::Status s = world.allGather(&me, replica_of.data(), 1, hsdp::DType::kInt32); !s.ok())
    fail.alone(s);
  std::vector<std::vector<int>> replica_ranks(mesh.shape().replicas());
  for (int q = 0; q < world.size(); ++q) replica_ranks.at(replica_of[q]).push_back(q);
  const ReplicaReferenceResult ref = trainReplicaReference(
      spec, cfg.adam, c.steps, c.batch, c.clip_norm, c.accum, world.size(), replica_ranks,
      cfg.replica_sync,
      model.shardCount() > 1 && cfg.precision.param_dtype == hsdp::DType::kBFloat16);
  float err = static_cast<float>(examples::maxRelativeError(mine, ref.params[me]));
  if (!std::isfinite(err)) err = INFINITY;
  std::vector<float> all(world.size());
  if (hsdp::Status s = world.allGather(&err, all.data(), 1, hsdp::DType::kFloat32); !s.ok())
    fail.alone(s);
  float worst = 0;
  for (float e : all) worst = std::max(worst, e);  // non-finite errors were sent as inf
  const bool pass = worst <= c.tolerance;
  if (world.rank() == 0) {
    std::printf(
        "\nreplica policy %s, H %d, %zu replicas: every rank against its replica's "
        "reference\nparity vs eigen reference: max_rel_err=%.3g %s\n",
        hsdp::replicaPolicyName(cfg.replica_sync.policy), cfg.replica_sync.sync_every,
        replica_ranks.size(), worst, pass ? "PASS" : "FAIL");
    std::fflush(stdout);
  }
  return pass ? 0 : 1;
}

// --check: gathers every unit's parameters (collective over the mesh), trains the Eigen reference
// on rank 0 with the roundings this configuration applies (mlp::trainReference, the bf16 tree of
// the mesh), shares the verdict over `world`, and rank 0 prints it. Returns 0 on PASS, 1 on FAIL.
int checkParity(const examples::Failure& fail, hsdp::Comm& world, const hsdp::Mesh& mesh,
                hsdp::ShardedModel& model, examples::Checkpoints& ckpt, const Spec& spec,
                const hsdp::EngineConfig& cfg, const Options& opt) {
  const examples::Options& c = opt.common;
  const int rank = world.rank();
  std::vector<std::vector<float>> mine(spec.layers());
  for (int l = 0; l < spec.layers(); ++l)
    if (hsdp::Status s = model.gatherFullParameters(l, &mine[l]); !s.ok()) fail.alone(s);
  if (cfg.replica_sync.policy != hsdp::ReplicaPolicy::kSync)
    return checkReplicaParity(fail, world, mesh, model, mine, spec, cfg, opt);
  // Elastic with each group keeping its slice: the reference replays which groups each step
  // averaged, those of a resumed checkpoint's steps included (redistribute trains on the whole
  // batch every step: the plain reference).
  Membership membership;
  const hsdp::ElasticPolicy& elastic = model.config().elastic;
  if (model.elastic() && *elastic.data == hsdp::ElasticData::kKeepSlice) {
    auto m = ckpt.membership(c.steps);
    if (!m.ok()) fail.alone(m.status());
    membership = std::move(*m);
  }
  float verdict[2] = {0, 0};  // {max_rel_err, pass}
  if (rank == 0) {
    // The engine rounds to bf16 only over a shard group larger than one (mode none reduces in
    // float); a bf16 reduction is modelled on the mesh's own tree.
    const bool sharded = model.shardCount() > 1;
    examples::GradReduction tree;
    if (sharded && cfg.precision.reduce_dtype == hsdp::DType::kBFloat16)
      tree = examples::meshGradReduction(mesh.layout(), mesh.shape(), model.hierarchical());
    ReferenceResult ref = trainReference(
        spec, cfg.adam, c.steps, c.batch, c.clip_norm,
        sharded && cfg.precision.param_dtype == hsdp::DType::kBFloat16,
        tree.levels.empty() ? nullptr : &tree, c.accum, membership.empty() ? nullptr : &membership);
    const double err = examples::maxRelativeError(mine, ref.params);
    verdict[0] = static_cast<float>(err);
    verdict[1] = err <= c.tolerance ? 1.0f : 0.0f;  // false for NaN too
    std::vector<std::string> names;
    for (int l = 0; l < spec.layers(); ++l) names.push_back("fc" + std::to_string(l) + " params");
    if (const std::string bad = examples::firstNonFinite(mine, ref.params, names); !bad.empty()) {
      verdict[1] = 0.0f;
      std::printf("\nparity: %s\n", bad.c_str());
    }
  }
  if (hsdp::Status s = examples::shareVerdict(world, verdict); !s.ok()) fail.alone(s);
  if (rank == 0) {
    std::printf("\nparity vs eigen reference: max_rel_err=%.3g %s\n", verdict[0],
                verdict[1] == 1.0f ? "PASS" : "FAIL");
    std::fflush(stdout);
  }
  return verdict[1] == 1.0f ? 0 : 1;
}

}  // namespace

void printHeader(const char* program, const hsdp::Comm& world, const hsdp::Mesh& mesh,
                 const hsdp::EngineConfig& cfg, const Spec& spec, const Options& opt,
                 const std::string& extra_line) {
  if (world.rank() != 0) return;
  examples::printNodeMap(program, world, mesh);
  std::printf(
      "mode %s, %s lr %g wd %g; model %zu params in %d units (dims %s); global batch "
      "%d (%d per rank)\n",
      hsdp::shardModeName(cfg.mode), hsdp::optimizerName(cfg.adam.kind), cfg.adam.lr,
      cfg.adam.weight_decay, spec.paramCount(), spec.layers(), opt.dims.c_str(), opt.common.batch,
      opt.common.batch / world.size());
  examples::printReplicaPolicy(cfg);
  if (!extra_line.empty()) std::printf("%s\n", extra_line.c_str());
  std::printf("\n%6s %10s %10s %10s %12s %14s\n", "step", "loss", "grad_norm", "time_ms",
              "samples/s", "exposed_comm_ms");
  std::fflush(stdout);
}

int trainAndReport(const char* program, hsdp::Comm& world, hsdp::Comm& abort_comm,
                   const hsdp::Mesh& mesh, hsdp::ShardedModel& model, const Spec& spec,
                   const hsdp::EngineConfig& cfg, const Options& opt,
                   const std::function<hsdp::StatusOr<float>(const hsdp::StepStart&)>& train_step) {
  const examples::Options& c = opt.common;
  const examples::Failure fail(program, world, abort_comm);
  examples::Checkpoints ckpt(world, model, c.ckpt, c.seed);
  auto start = ckpt.restore(c.steps);
  if (!start.ok()) return fail.agreed(start.status(), examples::exitCodeOf(start.status()));
  // SIGTERM / SIGUSR1 from here on stop the run after an agreed step, with a checkpoint
  // (common/stopping.h).
  if (hsdp::Status s = examples::installStopSignals(); !s.ok())
    return fail.agreed(s, examples::kExitRuntime);
  double optim_total = 0, optim_exposed = 0;  // offload: worker time, and what step() waited
  int step = *start;
  while (step < c.steps) {
    // Elastic mode: the step's quorum, and a heal when this group (re)joined (docs/elastic.md).
    auto begin = model.beginStep();
    if (!begin.ok()) fail.alone(begin.status());
    examples::printStepStart(world, *begin);
    step = static_cast<int>(begin->step);
    if (step >= c.steps) break;
    auto t0 = std::chrono::steady_clock::now();
    auto loss = train_step(*begin);
    auto t1 = std::chrono::steady_clock::now();
    if (!loss.ok() && loss.status().code() == hsdp::StatusCode::kAborted) {
      examples::printAbortedStep(world, *begin, loss.status());
      (void)model.takeStepAccounting();  // this attempt's waits are not the next one's
      continue;  // the quorum did not commit: the same step again, from beginStep()
    }
    if (!loss.ok()) fail.alone(loss.status());
    const float ms = std::chrono::duration<float, std::milli>(t1 - t0).count();
    const float exposed_ms = static_cast<float>(model.takeExposedCommSeconds() * 1e3);
    double ot = 0, oe = 0;
    model.takeOptimizerSeconds(&ot, &oe);
    optim_total += ot;
    optim_exposed += oe;
    auto row = gatherStepRow(world, model, *loss, ms, exposed_ms);
    if (!row.ok()) fail.alone(row.status());
    // exposed_comm_ms: the split's exposed communication (docs/trace.md, "Accounting").
    auto split = examples::gatherStepSplit(world, ms, model.takeStepAccounting());
    if (!split.ok()) fail.alone(split.status());
    row->max_exposed_ms = split->exposed_ms();
    printStepRow(world, *row, step, c.batch);
    examples::printStepSplit(world, *split);
    // The loss and the norm are global: every rank stops here alike.
    if (hsdp::Status s = examples::checkFinite(c.allow_nonfinite, step, row->loss, row->grad_norm);
        !s.ok())
      return fail.agreed(s, examples::kExitRuntime);
    // A save fails alike on every rank (the engine agrees on its verdict).
    if (hsdp::Status s = ckpt.afterStep(step + 1, step + 1 == c.steps); !s.ok())
      return fail.agreed(s, examples::exitCodeOf(s));
    // A stop request on any rank (preemption, the time limit's signal): all stop after this step.
    if (step + 1 < c.steps) {
      auto stop = examples::stopIfRequested(program, mesh.control(), world, ckpt, step + 1);
      if (!stop.ok()) fail.alone(stop.status());
      if (stop->has_value()) return **stop;
    }
    step = static_cast<int>(model.stepCount());
  }
  if (*start == c.steps) {  // nothing to train: a save-dir still gets this step's checkpoint
    if (hsdp::Status s = ckpt.afterStep(c.steps, true); !s.ok())
      return fail.agreed(s, examples::exitCodeOf(s));
  }
  if (hsdp::Status s = ckpt.finish(); !s.ok()) return fail.agreed(s, examples::exitCodeOf(s));
  examples::printOffloadSummary(world, cfg, c.steps, optim_total, optim_exposed);
  if (hsdp::Status s = model.writeTrace(); !s.ok()) fail.alone(s);  // --trace, HSDP_TRACE
  std::vector<uint64_t> numels;
  for (int l = 0; l < spec.layers(); ++l)
    numels.push_back(uint64_t(spec.dims[l + 1]) * (spec.dims[l] + 1));
  if (hsdp::Status s = examples::printMemory(world, mesh, model, numels, cfg); !s.ok())
    fail.alone(s);
  if (!c.check) return 0;
  return checkParity(fail, world, mesh, model, ckpt, spec, cfg, opt);
}

}  // namespace mlp
