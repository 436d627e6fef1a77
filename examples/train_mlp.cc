// train_mlp: hybrid-sharded data-parallel training of an MLP across MPI ranks, checked against a
// single-process Eigen reference. One readable training loop: forward over the units (each
// gathered just in time, the next one prefetched), backward in reverse (each unit's gradient
// reduced as soon as it is written), then the optimizer step on the shards. The
// flags, the printed report and --check live in mlp/options.h, shared with train_mlp_gpu.
//
//   mpirun -np 8 -x HSDP_RANKS_PER_NODE=4 build/examples/train_mlp --mode zero3 \
//       --intra-shard 4 --inter-shard 1 --steps 10 --check
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "common/accumulate.h"
#include "common/failure.h"
#include "common/session.h"
#include "hsdp/config.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"
#include "mlp/mlp.h"
#include "mlp/options.h"

namespace {

constexpr const char* kProgram = "train_mlp";

struct Run {
  hsdp::Comm& world;
  hsdp::ShardedModel& model;
  const mlp::Spec& spec;
  const mlp::Options& opt;
  std::vector<int> order;  // the units in forward order: fc0, fc1, ...
};

// One micro-step: forward and backward of this rank's slice of micro-batch `micro` of the
// group's slot (the whole batch unless elastic); the gradients add into the engine's buffers,
// and only the last micro-step reduces them.
hsdp::StatusOr<float> microStep(Run& run, const hsdp::StepStart& start, int micro, bool last) {
  hsdp::ShardedModel& model = run.model;
  const mlp::Spec& spec = run.spec;
  const int L = spec.layers();
  const int slot_batch = run.opt.common.batch / start.slots;
  const int micro_batch = slot_batch / run.opt.common.accum;
  const int per_rank = micro_batch / run.world.size();
  if (per_rank * run.world.size() * run.opt.common.accum * start.slots != run.opt.common.batch)
    return hsdp::invalidArgument("--batch ", run.opt.common.batch, " does not split into ",
                                 start.slots, " group slots x ", run.opt.common.accum,
                                 " micro-steps x ", run.world.size(), " ranks");
  mlp::Batch batch = mlp::makeBatch(
      spec, start.step, start.slot * slot_batch + micro * micro_batch + run.world.rank() * per_rank,
      per_rank);

  // Forward: unit l+1's all-gather is in flight while unit l computes (the schedule helper
  // prefetches one unit ahead).
  std::vector<mlp::Matrix> acts(L + 1);
  acts[0] = batch.x;
  HSDP_RETURN_IF_ERROR(hsdp::forwardUnits(model, run.order, [&](int l) -> hsdp::Status {
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView w, model.param(l, "weight"));
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView b, model.param(l, "bias"));
    mlp::Matrix z;
    mlp::linearForward(w.data, b.data, spec.dims[l + 1], spec.dims[l], acts[l], &z);
    acts[l + 1] = l + 1 < L ? mlp::Matrix(z.array().tanh()) : z;
    return hsdp::okStatus();
  }));
  mlp::Matrix dz;
  const float loss = mlp::crossEntropy(acts[L], batch.labels, &dz);
  dz /=
      static_cast<float>(run.opt.common.accum);  // the step's gradient is the mean over micro-steps
  // Backward: unit l-1's gather is prefetched; unit l's gradient reduction (last micro-step
  // only) runs in the background while earlier units compute, and step() waits for what is left.
  HSDP_RETURN_IF_ERROR(hsdp::backwardUnits(
      model, run.order,
      [&](int l) -> hsdp::Status {
        HSDP_ASSIGN_OR_RETURN(hsdp::ParamView w, model.param(l, "weight"));
        HSDP_ASSIGN_OR_RETURN(hsdp::ParamView dw, model.grad(l, "weight"));
        HSDP_ASSIGN_OR_RETURN(hsdp::ParamView db, model.grad(l, "bias"));
        mlp::Matrix dx;
        mlp::linearBackward(w.data, spec.dims[l + 1], spec.dims[l], acts[l], dz, dw.data, db.data,
                            l > 0 ? &dx : nullptr);
        if (l > 0) dz = (dx.array() * (1.0f - acts[l].array().square())).matrix();
        return hsdp::okStatus();
      },
      /*reduce_grads=*/last));
  return loss;
}

// The loss of the trained model on `samples` held-out samples (data of a step no training step
// draws), forward only, each rank its slice; the mean over every rank.
hsdp::StatusOr<float> validationLoss(Run& run, int samples) {
  constexpr int64_t kHeldOutStep = int64_t{1} << 40;
  const mlp::Spec& spec = run.spec;
  const int L = spec.layers(), per_rank = samples / run.world.size();
  mlp::Batch batch = mlp::makeBatch(spec, kHeldOutStep, run.world.rank() * per_rank, per_rank);
  mlp::Matrix a = batch.x;
  HSDP_RETURN_IF_ERROR(hsdp::forwardUnits(run.model, run.order, [&](int l) -> hsdp::Status {
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView w, run.model.param(l, "weight"));
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView b, run.model.param(l, "bias"));
    mlp::Matrix z;
    mlp::linearForward(w.data, b.data, spec.dims[l + 1], spec.dims[l], a, &z);
    a = l + 1 < L ? mlp::Matrix(z.array().tanh()) : z;
    return hsdp::okStatus();
  }));
  mlp::Matrix unused;
  float loss = mlp::crossEntropy(a, batch.labels, &unused) / run.world.size();
  HSDP_RETURN_IF_ERROR(run.world.allReduce(&loss, 1, hsdp::DType::kFloat32, hsdp::RedOp::kSum));
  return loss;
}

// One optimizer step: `accum` micro-steps, then the step on the shards; returns the mean loss.
hsdp::StatusOr<float> trainStep(Run& run, const hsdp::StepStart& start) {
  return examples::accumulateStep(run.model, run.opt.common.accum,
                                  [&](int k, bool last) { return microStep(run, start, k, last); });
}

// The body of the program; a non-OK Status before the first step is bad input every rank sees
// alike.
int runMain(const mlp::Options& opt, hsdp::Comm& world) {
  const int rank = world.rank();
  mlp::Spec spec;
  hsdp::EngineConfig cfg;
  hsdp::MeshSpec mesh_spec;
  const examples::Failure failure(kProgram, world, world);
  auto fail = [&](const hsdp::Status& s) { return failure.agreed(s, examples::kExitUsage); };
  if (hsdp::Status s = mlp::configure(opt, world.size(), &spec, &cfg, &mesh_spec); !s.ok())
    return fail(s);
  auto layout = hsdp::groupRanksIntoNodes(world);
  if (!layout.ok()) return fail(layout.status());
  auto mesh = hsdp::Mesh::create(world, *layout, mesh_spec);
  if (!mesh.ok()) return fail(mesh.status());
  auto model_or = hsdp::ShardedModel::create(**mesh, cfg);
  if (!model_or.ok()) return fail(model_or.status());
  hsdp::ShardedModel& model = **model_or;

  if (hsdp::Status s = mlp::buildModel(model, spec); !s.ok()) return fail(s);

  mlp::printHeader(kProgram, world, **mesh, cfg, spec, opt);

  Run run{world, model, spec, opt, {}};
  for (int l = 0; l < spec.layers(); ++l) run.order.push_back(l);
  int rc = mlp::trainAndReport(kProgram, world, world, **mesh, model, spec, cfg, opt,
                               [&](const hsdp::StepStart& start) { return trainStep(run, start); });
  if (opt.val_samples > 0) {
    auto val = validationLoss(run, opt.val_samples);
    if (!val.ok()) failure.alone(val.status());
    if (rank == 0) std::printf("validation loss: %.6f (%d samples)\n", *val, opt.val_samples);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  examples::Started mpi;
  if (auto rc = examples::startMpi(kProgram, &argc, &argv, &mpi)) return *rc;
  mlp::Options opt;
  if (auto rc = mlp::parseCommandLine(
          kProgram, "hsdp example: hybrid-sharded MLP training checked against an Eigen reference",
          argc, argv, mpi.world->rank(), &opt))
    return *rc;
  return runMain(opt, *mpi.world);
}
