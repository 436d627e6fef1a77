// train_mlp_gpu: train_mlp on CUDA devices. The same model, flags, output and --check against the
// single-process Eigen reference (examples/mlp/options.h), with the engine's model state in device
// memory (EngineConfig::device = kCuda), its collectives over NCCL, and forward/backward through
// cuBLAS and small kernels (examples/gpu/mlp_cuda.h) on one compute stream per rank.
//
//   mpirun -np 4 -x HSDP_RANKS_PER_NODE=2 build/examples/train_mlp_gpu --mode zero3 \
//       --intra-shard 2 --inter-shard 2 --steps 8 --check
//   several ranks on ONE GPU: run each rank through tests/common/per_rank_host.sh (NCCL_HOSTID per
//   rank, sockets on loopback), as ctest and scripts/device-check do.
//
// Per rank: MPI world (bootstrap, the report's host-side collectives) -> NCCL world over it ->
// mesh over the NCCL world (virtual nodes from the MPI world's host grouping) -> the engine. The
// step: the step's micro-batches are copied host-to-device once, into buffers allocated once;
// forward and backward enqueue on the compute stream, ordered against the engine's gathers and
// reductions by its events (waitForUnshard / reduceGrad / reshard / step); the host waits for
// the device once per step, to read the step's losses back. Exit 77 (every rank, before NCCL or
// the engine start) when no CUDA device is visible, so ctest reports the run as skipped.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/failure.h"
#include "common/session.h"
#include "gpu/cuda_owners.h"
#include "gpu/mlp_cuda.h"
#include "hsdp/config.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/nccl.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"
#include "mlp/mlp.h"
#include "mlp/options.h"

namespace {

constexpr const char* kProgram = "train_mlp_gpu";
constexpr int kExitNoDevice = 77;  // ctest's SKIP_RETURN_CODE for the gpu label

namespace gpu = mlp::cuda;  // the example's CUDA owners (gpu/cuda_owners.h)

// One rank's device buffers and host staging for the whole run, allocated once (no allocation in
// the step loop). Sizes are per rank: n = per-rank micro-batch, accum micro-steps per step.
struct Workspace {
  int n = 0, accum = 0, in = 0;
  // The step's input: accum micro-batches of x (dims[0] x n each, micro-step k at column k*n)
  // followed by their labels (n ints each), in one buffer so one copy moves the whole step.
  gpu::DeviceBuffer batch;
  gpu::PinnedBuffer batch_host;         // its staging twin: async H2D needs page-locked memory
  size_t x_floats = 0;                  // floats of x in `batch` (labels start right after)
  std::vector<gpu::DeviceBuffer> acts;  // acts[l], l = 1..L: dims[l] x n (acts[L]: the logits)
  gpu::DeviceBuffer dz, dx;       // gradients w.r.t. a layer's output and input: max dims x n each
  gpu::DeviceBuffer col_loss;     // n: crossEntropy's per-column scratch
  gpu::DeviceBuffer losses;       // accum floats: micro-step k's mean loss
  gpu::PinnedBuffer losses_host;  // their once-per-step readback
  // Why: batch_host is rewritten by the host for the next step only after the device has read
  // it; this event, recorded after the H2D copy, says when.
  gpu::Event h2d_done;
  // Why: the host reads the step's losses after the D2H copy lands; waiting on this event (not
  // the stream or the device) is the one host/device synchronisation per step.
  gpu::Event losses_ready;

  const float* x(int micro) const { return batch.as<float>() + size_t(micro) * in * n; }
  const int* labels(int micro) const {
    return reinterpret_cast<const int*>(batch.as<float>() + x_floats) + size_t(micro) * n;
  }

  static hsdp::StatusOr<Workspace> create(const mlp::Spec& spec, int n, int accum) {
    Workspace w;
    w.n = n;
    w.accum = accum;
    w.in = spec.dims[0];
    w.x_floats = size_t(w.in) * n * accum;
    const size_t batch_bytes = (w.x_floats + size_t(n) * accum) * 4;  // floats, then ints
    HSDP_ASSIGN_OR_RETURN(w.batch, gpu::DeviceBuffer::allocate(batch_bytes));
    HSDP_ASSIGN_OR_RETURN(w.batch_host, gpu::PinnedBuffer::allocate(batch_bytes));
    w.acts.resize(spec.layers() + 1);  // acts[0] unused: the input is x(micro)
    int widest = 0;
    for (int l = 0; l <= spec.layers(); ++l) {
      widest = std::max(widest, spec.dims[l]);
      if (l > 0) {  // (braces: the macro is several statements)
        HSDP_ASSIGN_OR_RETURN(
            w.acts[l], gpu::DeviceBuffer::allocate(size_t(spec.dims[l]) * n * sizeof(float)));
      }
    }
    HSDP_ASSIGN_OR_RETURN(w.dz, gpu::DeviceBuffer::allocate(size_t(widest) * n * sizeof(float)));
    HSDP_ASSIGN_OR_RETURN(w.dx, gpu::DeviceBuffer::allocate(size_t(widest) * n * sizeof(float)));
    HSDP_ASSIGN_OR_RETURN(w.col_loss, gpu::DeviceBuffer::allocate(size_t(n) * sizeof(float)));
    HSDP_ASSIGN_OR_RETURN(w.losses, gpu::DeviceBuffer::allocate(size_t(accum) * sizeof(float)));
    HSDP_ASSIGN_OR_RETURN(w.losses_host,
                          gpu::PinnedBuffer::allocate(size_t(accum) * sizeof(float)));
    HSDP_ASSIGN_OR_RETURN(w.h2d_done, gpu::createEvent());
    HSDP_ASSIGN_OR_RETURN(w.losses_ready, gpu::createEvent());
    return w;
  }
};

struct Run {
  hsdp::Comm& world;  // MPI: only for the rank and size here
  hsdp::ShardedModel& model;
  const mlp::Spec& spec;
  const mlp::Options& opt;
  const mlp::cuda::Cublas& blas;  // bound to the compute stream
  Workspace& ws;
  std::vector<int> order;  // the units in forward order: fc0, fc1, ...
  cudaStream_t stream() const { return blas.stream(); }
};

// The step's micro-batches (this rank's slice of each, exactly the samples train_mlp uses) into
// the pinned staging buffer, then one H2D copy on the compute stream.
hsdp::Status uploadBatch(Run& run, int64_t step) {
  Workspace& ws = run.ws;
  const int micro_batch = run.opt.common.batch / run.opt.common.accum;
  // The previous step's copy has long completed (the host waited for that step's losses); the
  // event makes the reuse of the staging buffer safe by construction, not by that argument.
  MLP_CUDA_CHECK(cudaEventSynchronize(ws.h2d_done.get()));
  float* x = ws.batch_host.as<float>();
  int* labels = reinterpret_cast<int*>(x + ws.x_floats);
  const int classes = run.spec.dims.back();
  for (int k = 0; k < ws.accum; ++k) {
    mlp::Batch b = mlp::makeBatch(run.spec, step, k * micro_batch + run.world.rank() * ws.n, ws.n);
    std::memcpy(x + size_t(k) * ws.in * ws.n, b.x.data(), size_t(ws.in) * ws.n * sizeof(float));
    for (int s = 0; s < ws.n; ++s) {
      if (b.labels[s] < 0 || b.labels[s] >= classes)
        return hsdp::internalError("makeBatch gave label ", b.labels[s], " outside [0, ", classes,
                                   ")");
      labels[size_t(k) * ws.n + s] = b.labels[s];
    }
  }
  MLP_CUDA_CHECK(cudaMemcpyAsync(ws.batch.data(), ws.batch_host.data(), ws.batch.size(),
                                 cudaMemcpyHostToDevice, run.stream()));
  MLP_CUDA_CHECK(cudaEventRecord(ws.h2d_done.get(), run.stream()));
  return hsdp::okStatus();
}

// One micro-step on the device: train_mlp's microStep with device pointers. The engine's calls
// order its collectives against the compute stream; nothing here waits for the device.
hsdp::Status microStep(Run& run, int micro, bool last) {
  hsdp::ShardedModel& model = run.model;
  const mlp::Spec& spec = run.spec;
  Workspace& ws = run.ws;
  const int L = spec.layers(), n = ws.n;
  auto input = [&](int l) { return l == 0 ? ws.x(micro) : ws.acts[l].as<float>(); };

  // Forward: unit l+1's all-gather is in flight while unit l computes (the schedule helper
  // prefetches one unit ahead; waitForUnshard makes the compute stream wait for the gather, and
  // reshard reuses the buffer only after the kernels enqueued here).
  HSDP_RETURN_IF_ERROR(hsdp::forwardUnits(model, run.order, [&](int l) -> hsdp::Status {
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView w, model.param(l, "weight"));
    HSDP_ASSIGN_OR_RETURN(hsdp::ParamView b, model.param(l, "bias"));
    const int in = spec.dims[l], out = spec.dims[l + 1];
    float* z = ws.acts[l + 1].as<float>();
    HSDP_RETURN_IF_ERROR(
        mlp::cuda::linearForward(run.blas, w.data, b.data, out, in, input(l), n, z));
    if (l + 1 < L)
      HSDP_RETURN_IF_ERROR(mlp::cuda::tanhForward(z, z, size_t(out) * n, run.stream()));
    return hsdp::okStatus();
  }));
  // dz = dL/dlogits / accum: the step's gradient is the mean over micro-steps.
  HSDP_RETURN_IF_ERROR(mlp::cuda::crossEntropy(
      ws.acts[L].as<float>(), ws.labels(micro), spec.dims[L], n, ws.dz.as<float>(),
      ws.col_loss.as<float>(), ws.losses.as<float>() + micro, run.stream(),
      static_cast<float>(run.opt.common.accum)));
  // Backward: unit l-1's gather is prefetched; unit l's reduction is ordered after the kernels
  // that wrote its gradient and runs while earlier units compute.
  return hsdp::backwardUnits(
      model, run.order,
      [&](int l) -> hsdp::Status {
        HSDP_ASSIGN_OR_RETURN(hsdp::ParamView w, model.param(l, "weight"));
        HSDP_ASSIGN_OR_RETURN(hsdp::ParamView dw, model.grad(l, "weight"));
        HSDP_ASSIGN_OR_RETURN(hsdp::ParamView db, model.grad(l, "bias"));
        const int in = spec.dims[l], out = spec.dims[l + 1];
        HSDP_RETURN_IF_ERROR(mlp::cuda::linearBackward(run.blas, w.data, out, in, input(l),
                                                       ws.dz.as<float>(), n, dw.data, db.data,
                                                       l > 0 ? ws.dx.as<float>() : nullptr));
        // Through the tanh of layer l's input: dz (for layer l-1's output) = dx * (1 - a^2).
        // Stream order puts this after linearBackward read the old dz.
        if (l > 0)
          HSDP_RETURN_IF_ERROR(mlp::cuda::tanhBackward(ws.dx.as<float>(), ws.acts[l].as<float>(),
                                                       ws.dz.as<float>(), size_t(in) * n,
                                                       run.stream()));
        return hsdp::okStatus();
      },
      /*reduce_grads=*/last);
}

// One optimizer step: the batch up, `accum` micro-steps, the step on the shards, then the one
// host wait of the step: the losses back (after the update, so the step's time is its whole
// device time). Returns the mean loss, summed as train_mlp sums it.
hsdp::StatusOr<float> trainStep(Run& run, int64_t step) {
  Workspace& ws = run.ws;
  HSDP_RETURN_IF_ERROR(uploadBatch(run, step));
  for (int k = 0; k < run.opt.common.accum; ++k)
    HSDP_RETURN_IF_ERROR(microStep(run, k, k + 1 == run.opt.common.accum));
  HSDP_RETURN_IF_ERROR(run.model.step());
  MLP_CUDA_CHECK(cudaMemcpyAsync(ws.losses_host.data(), ws.losses.data(), ws.losses.size(),
                                 cudaMemcpyDeviceToHost, run.stream()));
  MLP_CUDA_CHECK(cudaEventRecord(ws.losses_ready.get(), run.stream()));
  MLP_CUDA_CHECK(cudaEventSynchronize(ws.losses_ready.get()));
  float loss = 0;
  for (int k = 0; k < run.opt.common.accum; ++k)
    loss += ws.losses_host.as<float>()[k] / run.opt.common.accum;
  return loss;
}

hsdp::StatusOr<std::string> describeDevice(int device) {
  cudaDeviceProp prop{};
  MLP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return hsdp::strCat("device: cuda:", device, " (", prop.name, ", sm_", prop.major, prop.minor,
                      "); engine state in device memory, NCCL mesh, cuBLAS fp32 (pedantic)");
}

int runMain(const mlp::Options& opt, hsdp::Comm& world) {
  mlp::Spec spec;
  hsdp::EngineConfig cfg;
  hsdp::MeshSpec mesh_spec;
  // Before the first step every rank meets the same failures (bad input, an engine that refuses
  // the configuration, NCCL creation failing everywhere): print, exit, no hang.
  const examples::Failure failure(kProgram, world, world);
  auto fail = [&](const hsdp::Status& s) {
    return failure.agreed(s, s.code() == hsdp::StatusCode::kInvalidArgument
                                 ? examples::kExitUsage
                                 : examples::kExitRuntime);
  };
  if (hsdp::Status s = mlp::configure(opt, world.size(), &spec, &cfg, &mesh_spec); !s.ok())
    return fail(s);
  if (opt.val_samples > 0)
    return fail(hsdp::invalidArgument("--val-samples: validation is train_mlp's (host) only"));
  cfg.device = hsdp::Device::kCuda;

  // Declaration order is destruction order reversed: the workspace, cuBLAS handle and model go
  // before the mesh, the compute stream, the device guard and the NCCL world they use.
  auto nccl_world = hsdp::nccl::createNcclComm(world);
  if (!nccl_world.ok()) return fail(nccl_world.status());
  const int device = dynamic_cast<hsdp::nccl::NcclComm&>(**nccl_world).device();
  // The engine allocates on the device current at create(); make it the NCCL world's device.
  auto guard = gpu::DeviceGuard::set(device);
  if (!guard.ok()) return fail(guard.status());
  // Why a stream of our own: the forward/backward kernels and cuBLAS run on it, and the engine
  // orders its gathers, reductions and optimizer step against it with events
  // (setComputeStream); a non-blocking stream keeps the legacy default stream out of the picture.
  auto stream = gpu::createStream();
  if (!stream.ok()) return fail(stream.status());
  auto layout = hsdp::groupRanksIntoNodes(world);
  if (!layout.ok()) return fail(layout.status());
  auto mesh = hsdp::Mesh::create(**nccl_world, *layout, mesh_spec);
  if (!mesh.ok()) return fail(mesh.status());
  auto model_or = hsdp::ShardedModel::create(**mesh, cfg);
  if (!model_or.ok()) return fail(model_or.status());
  hsdp::ShardedModel& model = **model_or;
  model.setComputeStream(stream->get());
  auto blas = mlp::cuda::Cublas::create(stream->get());
  if (!blas.ok()) return fail(blas.status());

  if (hsdp::Status s = mlp::buildModel(model, spec); !s.ok()) return fail(s);
  const int per_rank = opt.common.batch / opt.common.accum / world.size();
  auto ws = Workspace::create(spec, per_rank, opt.common.accum);
  if (!ws.ok()) return fail(ws.status());
  auto device_line = describeDevice(device);
  if (!device_line.ok()) return fail(device_line.status());

  mlp::printHeader(kProgram, world, **mesh, cfg, spec, opt, *device_line);

  Run run{world, model, spec, opt, *blas, *ws, {}};
  for (int l = 0; l < spec.layers(); ++l) run.order.push_back(l);
  // A failing step aborts through the NCCL world: its abort stops in-flight collectives first.
  return mlp::trainAndReport(
      kProgram, world, **nccl_world, **mesh, model, spec, cfg, opt,
      [&](const hsdp::StepStart& start) { return trainStep(run, start.step); });
}

}  // namespace

int main(int argc, char** argv) {
  examples::Started mpi;
  if (auto rc = examples::startMpi(kProgram, &argc, &argv, &mpi)) return *rc;
  hsdp::Comm& world = *mpi.world;
  mlp::Options opt;
  if (auto rc = mlp::parseCommandLine(kProgram,
                                      "hsdp example on CUDA: hybrid-sharded MLP training (device "
                                      "memory, NCCL, cuBLAS) checked against an Eigen reference",
                                      argc, argv, world.rank(), &opt))
    return *rc;
  // No device: skip. The ranks agree first (one host-side MPI all-reduce of "I have none"), so
  // either every rank skips or none does; nothing of NCCL or the engine has started yet.
  std::string why;
  int32_t missing = gpu::deviceCount(&why) == 0 ? 1 : 0;
  if (hsdp::Status s = world.allReduce(&missing, 1, hsdp::DType::kInt32, hsdp::RedOp::kSum);
      !s.ok()) {
    examples::printError(kProgram, world.rank(), s.toString());
    return examples::kExitRuntime;
  }
  if (missing > 0) {
    if (world.rank() == 0)
      std::printf(
          "%s: no CUDA device visible on %d of %d ranks (rank 0: %s): skipping, exit "
          "code %d\n",
          kProgram, missing, world.size(), why.empty() ? "has one" : why.c_str(), kExitNoDevice);
    return kExitNoDevice;
  }
  return runMain(opt, world);
}
