#include "mlp/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "cli.h"
#include "hsdp/parse.h"
#include "hsdp/plan.h"
#include "mlp/checkpointing.h"
#include "mlp/flags.h"
#include "mlp/reference.h"

namespace mlp {
namespace {

constexpr int kMaxDim = 1 << 20;

hsdp::StatusOr<std::vector<int>> parseDims(const std::string& text) {
  HSDP_ASSIGN_OR_RETURN(std::vector<int> dims,
                        hsdp::parseIntegerList<int>(text, "--dims", 1, kMaxDim));
  if (dims.size() < 2) return hsdp::invalidArgument("--dims '", text, "' needs >= 2 sizes");
  return dims;
}

std::string bytesStr(size_t b) {
  char buf[32];
  if (b >= (1u << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

}  // namespace

int exitCodeOf(const hsdp::Status& s) {
  const hsdp::StatusCode c = s.code();
  return c == hsdp::StatusCode::kInvalidArgument || c == hsdp::StatusCode::kNotFound ||
                 c == hsdp::StatusCode::kFailedPrecondition
             ? kExitUsage
             : kExitRuntime;
}

void printError(const char* program, int rank, const std::string& what) {
  std::fprintf(stderr, "%s [rank %d]: error: %s\n", program, rank, what.c_str());
  std::fflush(stderr);
}

std::optional<int> start(const char* program, const char* description, int* argc, char*** argv,
                         Started* out) {
  if (auto rc = startMpi(program, argc, argv, out)) return rc;
  return parseCommandLine(program, description, *argc, *argv, out->world->rank(), &out->opt);
}

std::optional<int> startMpi(const char* program, int* argc, char*** argv, Started* out) {
  auto session = hsdp::mpi::Session::init(argc, argv);
  if (!session.ok()) {
    printError(program, hsdp::mpi::Session::worldRank(), session.status().toString());
    return session.status().code() == hsdp::StatusCode::kInvalidArgument ? kExitUsage
                                                                           : kExitRuntime;
  }
  out->session = std::move(*session);
  auto world = out->session->world();
  if (!world.ok()) {
    printError(program, hsdp::mpi::Session::worldRank(), world.status().toString());
    return kExitRuntime;
  }
  out->world = std::move(*world);
  return std::nullopt;
}

void addShardFlags(CLI::App& app, Options& opt, const char* intra_help, const char* inter_help) {
  hsdp::cli::addInt(app, "--intra-shard", opt.intra_shard, intra_help, 1, kMaxRanks);
  hsdp::cli::addInt(app, "--inter-shard", opt.inter_shard, inter_help, 1, kMaxRanks);
}

void addStepFlags(CLI::App& app, Options& opt, const char* batch_help, const char* accum_help) {
  hsdp::cli::addInt(app, "--steps", opt.steps, "Training steps", 0);
  hsdp::cli::addInt(app, "--batch", opt.batch, batch_help, 1, kMaxBatch);
  hsdp::cli::addInt(app, "--accum", opt.accum, accum_help, 1, kMaxBatch);
  hsdp::cli::addReal(app, "--clip-norm", opt.clip_norm, "Clip the global gradient norm (0: off)",
                     hsdp::RealRange::atLeast(0));
  hsdp::cli::addInt(app, "--max-gathered", opt.max_gathered,
                    "Rate limiter: at most N units gathered at once, 0 = no limit (zero3)", 0);
  app.add_flag("--allow-nonfinite", opt.allow_nonfinite,
               "Train on when the loss or the gradient norm is not finite (default: stop with an "
               "error naming the step)");
}

hsdp::Status checkFinite(bool allow_nonfinite, int step, double mean_loss, double grad_norm) {
  if (allow_nonfinite || (std::isfinite(mean_loss) && std::isfinite(grad_norm)))
    return hsdp::okStatus();
  return hsdp::outOfRange("step ", step + 1, ": the loss is ", mean_loss, " and the gradient norm ",
                          grad_norm,
                          " (not finite: a learning rate too large, or bad data); "
                          "stopping (--allow-nonfinite trains on)");
}

void addOptimizerFlags(CLI::App& app, Options& opt, const char* lr_help, const char* wd_help) {
  hsdp::cli::addReal(app, "--lr", opt.lr, lr_help, hsdp::RealRange::atLeast(0));
  hsdp::cli::addReal(app, "--weight-decay", opt.weight_decay, wd_help, hsdp::RealRange::atLeast(0));
  hsdp::cli::addReal(app, "--eps", opt.eps, "Adam epsilon", hsdp::RealRange::above(0));
}

void addToleranceFlag(CLI::App& app, Options& opt) {
  hsdp::cli::addReal(app, "--tolerance", opt.tolerance, "Largest max_rel_err that passes --check",
                     hsdp::RealRange::atLeast(0));
}

void applyBf16Tolerance(const CLI::App& app, Options& opt) {
  // bf16 parameters or reductions round every gathered value or partial sum to 8 bits of
  // mantissa, so the fp32 default cannot pass; the measured errors are ~1e-4 (docs/gpu.md).
  if (app.count("--tolerance") == 0 && (opt.param_dtype == "bf16" || opt.reduce_dtype == "bf16"))
    opt.tolerance = std::max(opt.tolerance, kBf16Tolerance);
}

void addCheckpointFlags(CLI::App& app, Options& opt) {
  app.add_option("--save-dir", opt.save_dir,
                 "Checkpoint root: <dir>/step-NNNNNNNN per save, <dir>/latest names the newest");
  hsdp::cli::addInt(app, "--save-every", opt.save_every,
                    "Save every K steps (and after the last); 0: after the last step only", 0);
  app.add_flag("--async-save", opt.async_save,
               "Snapshot into host memory and write in the background while training goes on");
  hsdp::cli::addInt(app, "--keep", opt.keep, "Keep only the newest K checkpoints (0: all)", 0);
  app.add_option("--resume", opt.resume,
                 "Load a checkpoint (directory, root with `latest`, or 'latest' of --save-dir) "
                 "and train on to --steps; any mesh and mode");
  app.add_option("--export", opt.export_path,
                 "After training, write the full parameters as safetensors");
  app.add_option("--init-from", opt.init_from,
                 "Initialise the parameters from a safetensors file or index");
  app.add_option("--optimizer-from", opt.optimizer_from,
                 "checkpoint | flags: with --resume, the optimizer settings (kind, lr, betas, eps, "
                 "weight decay) of the checkpoint or of the flags; a difference is printed")
      ->check(CLI::IsMember({"checkpoint", "flags"}));
}

std::optional<int> parseCommandLine(const char* program, const char* description, int argc,
                                    char** argv, int rank, Options* opt_out) {
  Options& opt = *opt_out;
  CLI::App app{description, program};
  app.add_option("--mode", opt.mode, "Sharding mode: none | zero1 | zero2 | zero3")
      ->check(CLI::IsMember({"none", "zero1", "zero2", "zero3"}));
  addShardFlags(app, opt,
                "Ranks per node that shard each unit (divides ranks per node; default: all, "
                "or 1 in mode none)",
                "Nodes that shard each unit (divides the node count; default 1)");
  addStepFlags(app, opt, "Global batch size (a multiple of the world size)",
               "Micro-steps per optimizer step (gradient accumulation; batch / accum per step)");
  app.add_flag("--hpz", opt.hpz,
               "hpZ: keep each unit's intra-node partition after forward so backward re-gathers "
               "stay inside the node (zero3, intra_shard > 1, inter_shard > 1)");
  app.add_option("--param-dtype", opt.param_dtype,
                 "fp32 | bf16: parameters all-gathered (and computed on) as bf16 roundings")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--reduce-dtype", opt.reduce_dtype, "fp32 | bf16: gradient reduce-scatter dtype")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--offload", opt.offload,
                 "none | cpu: optimizer state in host memory, stepped by the CPU Adam while "
                 "backward runs (zero1/zero2/zero3)")
      ->check(CLI::IsMember({"none", "cpu"}));
  app.add_flag("--check", opt.check, "Train the Eigen reference and compare parameters");
  addOptimizerFlags(app, opt, "Learning rate", "Weight decay");
  app.add_option("--optimizer", opt.optimizer, "adam | adamw")
      ->check(CLI::IsMember({"adam", "adamw"}));
  hsdp::cli::addList(app, "--dims", opt.dims, "Layer sizes, input to classes, comma separated");
  hsdp::cli::addInt(app, "--seed", opt.seed, "Seed of data and initialisation");
  addToleranceFlag(app, opt);
  addCheckpointFlags(app, opt);
  hsdp::cli::addInt(app, "--val-samples", opt.val_samples,
                    "After training, print the mean loss over this many held-out samples "
                    "(a multiple of the ranks; 0: none)",
                    0, kMaxBatch);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, program, rank, rank == 0);
  }
  opt.intra_shard_given = app.count("--intra-shard") > 0;
  opt.inter_shard_given = app.count("--inter-shard") > 0;
  applyBf16Tolerance(app, opt);
  return std::nullopt;
}

hsdp::Status checkModelFits(uint64_t largest_unit, uint64_t total_params, uint64_t activation_bytes,
                            bool check, const std::string& what) {
  // Saturating: a sum past 2^64 is as unallocatable as the largest count checkedAllocation names.
  auto mul = [](uint64_t a, uint64_t b) {
    return hsdp::checkedMul(a, b).value_or(std::numeric_limits<uint64_t>::max());
  };
  auto add = [](uint64_t a, uint64_t b) {
    return hsdp::checkedAdd(a, b).value_or(std::numeric_limits<uint64_t>::max());
  };
  uint64_t bytes = add(mul(largest_unit, 8), activation_bytes);
  if (check) bytes = add(bytes, mul(total_params, 16));
  return hsdp::checkedAllocation(bytes, 1, what).status();
}

hsdp::Status configure(const Options& opt, int world_size, Spec* spec, hsdp::EngineConfig* cfg,
                       hsdp::MeshSpec* mesh_spec) {
  HSDP_ASSIGN_OR_RETURN(spec->dims, parseDims(opt.dims));
  {
    uint64_t largest = 0, total = 0, width = 0;
    for (size_t l = 0; l + 1 < spec->dims.size(); ++l) {
      const uint64_t n = uint64_t(spec->dims[l + 1]) * (uint64_t(spec->dims[l]) + 1);
      largest = std::max(largest, n);
      total = hsdp::checkedAdd(total, n).value_or(UINT64_MAX);
    }
    for (int d : spec->dims) width += uint64_t(d);
    // One micro-batch's activations and their gradients, 4 bytes each, on this rank's rows.
    const uint64_t rows = world_size > 0 && opt.batch > 0 && opt.accum > 0
                              ? uint64_t(opt.batch) / uint64_t(world_size) / uint64_t(opt.accum)
                              : 0;
    HSDP_RETURN_IF_ERROR(checkModelFits(
        largest, total, hsdp::checkedMul(rows, width * 8).value_or(UINT64_MAX), opt.check,
        hsdp::strCat("--dims ", opt.dims, opt.check ? " with --check" : "")));
  }
  spec->seed = opt.seed;
  HSDP_ASSIGN_OR_RETURN(cfg->mode, hsdp::parseShardMode(opt.mode));
  HSDP_ASSIGN_OR_RETURN(cfg->adam.kind, hsdp::parseOptimizerKind(opt.optimizer));
  cfg->adam.lr = opt.lr;
  cfg->adam.weight_decay = opt.weight_decay;
  cfg->adam.eps = opt.eps;
  if (opt.steps < 0) return hsdp::invalidArgument("--steps ", opt.steps, " must be >= 0");
  if (opt.batch <= 0 || opt.batch % world_size != 0)
    return hsdp::invalidArgument("--batch ", opt.batch, " must be a positive multiple of the ",
                                 world_size, " ranks (each rank trains on an equal slice)");
  // In 64 bits: accum x ranks of two ints cannot overflow (in int, 2^30 x 4 wrapped to 0).
  const int64_t micro_ranks = int64_t{opt.accum} * world_size;
  if (opt.accum <= 0 || opt.batch % micro_ranks != 0)
    return hsdp::invalidArgument("--accum ", opt.accum, " must be positive and --batch ", opt.batch,
                                 " a multiple of accum x ranks = ", micro_ranks);
  if (opt.val_samples < 0 || opt.val_samples % world_size != 0)
    return hsdp::invalidArgument("--val-samples ", opt.val_samples, " must be a multiple of the ",
                                 world_size, " ranks (each rank evaluates an equal slice)");
  if (!(opt.clip_norm >= 0))
    return hsdp::invalidArgument("--clip-norm ", opt.clip_norm, " must be >= 0");
  cfg->clip_norm = opt.clip_norm;
  cfg->offload_cpu = opt.offload == "cpu";
  cfg->hpz = opt.hpz;
  if (opt.max_gathered < 0)
    return hsdp::invalidArgument("--max-gathered ", opt.max_gathered, " must be >= 0");
  cfg->max_gathered_units = opt.max_gathered;
  HSDP_ASSIGN_OR_RETURN(cfg->param_dtype, hsdp::parseDType(opt.param_dtype));
  HSDP_ASSIGN_OR_RETURN(cfg->reduce_dtype, hsdp::parseDType(opt.reduce_dtype));
  if (opt.intra_shard_given && opt.intra_shard <= 0)
    return hsdp::invalidArgument("--intra-shard ", opt.intra_shard, " must be positive");
  if (opt.inter_shard_given && opt.inter_shard <= 0)
    return hsdp::invalidArgument("--inter-shard ", opt.inter_shard, " must be positive");
  if (opt.save_every < 0)
    return hsdp::invalidArgument("--save-every ", opt.save_every, " must be >= 0");
  if (opt.keep < 0) return hsdp::invalidArgument("--keep ", opt.keep, " must be >= 0");
  if (opt.save_dir.empty() && (opt.save_every > 0 || opt.async_save || opt.keep > 0))
    return hsdp::invalidArgument("--save-every, --async-save and --keep need --save-dir");
  if (opt.resume == "latest" && opt.save_dir.empty())
    return hsdp::invalidArgument("--resume latest needs --save-dir (the root it names)");
  if (opt.check && !opt.init_from.empty())
    return hsdp::invalidArgument(
        "--check trains the reference from the built-in "
        "initialisation; it cannot follow --init-from");
  mesh_spec->intra_shard = opt.intra_shard;
  mesh_spec->inter_shard = opt.inter_shard;
  if (cfg->mode == hsdp::ShardMode::kNone) {  // plain data parallel: nothing is sharded
    if (mesh_spec->intra_shard == 0) mesh_spec->intra_shard = 1;
    if (mesh_spec->inter_shard == 0) mesh_spec->inter_shard = 1;
  }
  return hsdp::okStatus();
}

hsdp::Status buildModel(hsdp::ShardedModel& model, const Spec& spec) {
  for (int l = 0; l < spec.layers(); ++l) {
    const int64_t in = spec.dims[l], out = spec.dims[l + 1];
    HSDP_RETURN_IF_ERROR(
        model.addUnit("fc" + std::to_string(l), {{"weight", {out, in}}, {"bias", {out}}}).status());
  }
  HSDP_RETURN_IF_ERROR(model.finalize());
  for (int l = 0; l < spec.layers(); ++l) {
    std::vector<float> w, b;
    initLayer(spec, l, &w, &b);
    HSDP_RETURN_IF_ERROR(model.setParameter(l, "weight", w.data(), w.size()));
    HSDP_RETURN_IF_ERROR(model.setParameter(l, "bias", b.data(), b.size()));
  }
  return hsdp::okStatus();
}

void printNodeMap(const char* program, const hsdp::Comm& world, const hsdp::Mesh& mesh) {
  const hsdp::NodeLayout& nl = mesh.layout();
  std::printf("hsdp %s: %d ranks on %d %snodes (", program, world.size(), nl.num_nodes,
              nl.virtual_nodes ? "virtual " : "");
  for (int n = 0; n < nl.num_nodes; ++n)
    std::printf("%s%s", n ? ", " : "", nl.node_names[n].c_str());
  std::printf(")\nmesh: %s\n", mesh.describe().c_str());
}

void printHeader(const char* program, const hsdp::Comm& world, const hsdp::Mesh& mesh,
                 const hsdp::EngineConfig& cfg, const Spec& spec, const Options& opt,
                 const std::string& extra_line) {
  if (world.rank() != 0) return;
  printNodeMap(program, world, mesh);
  std::printf(
      "mode %s, %s lr %g wd %g; model %zu params in %d units (dims %s); global batch "
      "%d (%d per rank)\n",
      hsdp::shardModeName(cfg.mode), hsdp::optimizerName(cfg.adam.kind), cfg.adam.lr,
      cfg.adam.weight_decay, spec.paramCount(), spec.layers(), opt.dims.c_str(), opt.batch,
      opt.batch / world.size());
  if (!extra_line.empty()) std::printf("%s\n", extra_line.c_str());
  std::printf("\n%6s %10s %10s %10s %12s %14s\n", "step", "loss", "grad_norm", "time_ms",
              "samples/s", "exposed_comm_ms");
  std::fflush(stdout);
}

hsdp::Status printStepRow(hsdp::Comm& world, const hsdp::ShardedModel& model, const Options& opt,
                          int step, float loss, float time_ms, float exposed_comm_ms) {
  float stats[3] = {loss, time_ms, exposed_comm_ms};
  std::vector<float> all(3 * world.size());
  HSDP_RETURN_IF_ERROR(world.allGather(stats, all.data(), 3, hsdp::DType::kFloat32));
  double mean_loss = 0, max_ms = 0, max_exposed = 0;
  for (int q = 0; q < world.size(); ++q) {
    mean_loss += all[3 * q] / world.size();
    max_ms = std::max<double>(max_ms, all[3 * q + 1]);
    max_exposed = std::max<double>(max_exposed, all[3 * q + 2]);
  }
  const double norm = model.lastGradNorm();
  if (world.rank() == 0) {
    std::printf("%6d %10.5f %10.4f %10.2f %12.0f %14.2f\n", step + 1, mean_loss, norm, max_ms,
                opt.batch / (max_ms / 1e3), max_exposed);
    std::fflush(stdout);
  }
  return checkFinite(opt.allow_nonfinite, step, mean_loss, norm);
}

void printOffloadSummary(const hsdp::Comm& world, const hsdp::EngineConfig& cfg, const Options& opt,
                         double optim_total, double optim_exposed) {
  if (!cfg.offload_cpu || world.rank() != 0) return;
  std::printf(
      "\noffloaded optimizer (rank 0): %.2f ms of CPU Adam per step, %.2f ms of it "
      "waited for in step() -> %.0f%% hidden behind backward\n",
      opt.steps ? optim_total * 1e3 / opt.steps : 0.0,
      opt.steps ? optim_exposed * 1e3 / opt.steps : 0.0,
      optim_total > 0 ? 100.0 * (1.0 - std::min(1.0, optim_exposed / optim_total)) : 0.0);
}

hsdp::Status printMemory(hsdp::Comm& world, const hsdp::Mesh& mesh, const hsdp::ShardedModel& model,
                         const Spec& spec, const hsdp::EngineConfig& cfg) {
  std::vector<uint64_t> numels;
  for (int l = 0; l < spec.layers(); ++l)
    numels.push_back(uint64_t(spec.dims[l + 1]) * (spec.dims[l] + 1));
  return printMemory(world, mesh, model, numels, cfg);
}

hsdp::Status printMemory(hsdp::Comm& world, const hsdp::Mesh& mesh, const hsdp::ShardedModel& model,
                         const std::vector<uint64_t>& unit_numels, const hsdp::EngineConfig& cfg) {
  const hsdp::MemoryReport r = model.memoryReport();
  // `gathered` is what the engine allocated for gathered units and full gradients (the blocks of
  // its pool: the same on every rank of a role, and what `total` counts); how many of them were
  // in use at once depends on timing (how far prefetches ran ahead), so it is reported apart.
  constexpr int kFields = 8;
  int64_t mine[kFields] = {int64_t(r.param_bytes + r.hpz_bytes),
                           int64_t(r.grad_bytes),
                           int64_t(r.optim_bytes),
                           int64_t(r.gathered_capacity_bytes),
                           int64_t(r.comm_bytes),
                           int64_t(r.total()),
                           mesh.coords().node,
                           int64_t(r.gathered_peak_bytes)};
  std::vector<int64_t> all(kFields * world.size());
  HSDP_RETURN_IF_ERROR(world.allGather(mine, all.data(), kFields, hsdp::DType::kInt64));
  if (world.rank() != 0) return hsdp::okStatus();
  std::printf("\nper-rank memory held by model state (engine allocations):\n");
  std::printf("%5s %5s %12s %12s %12s %12s %12s %12s\n", "rank", "node", "params", "grads", "optim",
              "gathered", "comm", "total");
  int64_t peak_lo = INT64_MAX, peak_hi = 0;
  for (int q = 0; q < world.size(); ++q) {
    const int64_t* v = &all[kFields * q];
    std::printf("%5d %5lld %12s %12s %12s %12s %12s %12s\n", q, (long long)v[6],
                bytesStr(v[0]).c_str(), bytesStr(v[1]).c_str(), bytesStr(v[2]).c_str(),
                bytesStr(v[3]).c_str(), bytesStr(v[4]).c_str(), bytesStr(v[5]).c_str());
    peak_lo = std::min(peak_lo, v[7]);
    peak_hi = std::max(peak_hi, v[7]);
  }
  std::printf(
      "gathered in use at the peak: %s to %s over the ranks (of the allocated `gathered`; "
      "depends on how far prefetches ran ahead)\n",
      bytesStr(peak_lo).c_str(), bytesStr(peak_hi).c_str());
  // hsdp-plan's prediction for this very configuration (fp32 policy; the plan models what
  // the engine allocates), beside what rank 0 measured.
  hsdp::PlanInput in;
  in.units = unit_numels;
  in.nodes = mesh.shape().num_nodes;
  in.gpus_per_node = mesh.shape().ranks_per_node;
  in.intra_shard = mesh.shape().intra_shard;
  in.inter_shard = mesh.shape().inter_shard;
  in.mode = static_cast<hsdp::ShardMode>(static_cast<int>(cfg.mode));
  in.param_dtype = hsdp::DType::kFloat32;
  in.offload_cpu = cfg.offload_cpu;
  in.hpz = cfg.hpz;
  if (auto plan = hsdp::makePlan(in); plan.ok() && cfg.param_dtype == hsdp::DType::kFloat32) {
    const hsdp::PlanMemory& g = plan->gpu;
    const int64_t* v = &all[0];
    std::printf(
        "hsdp-plan prediction (rank 0): params%s %s (measured %s), grads %s (%s), optim "
        "%s (%s), gathered %s (%s), comm %s estimate (%s)\n",
        cfg.hpz ? "+hpz" : "", bytesStr(g.params + g.hpz_secondary).c_str(), bytesStr(v[0]).c_str(),
        bytesStr(g.grads).c_str(), bytesStr(v[1]).c_str(), bytesStr(g.optimizer).c_str(),
        bytesStr(v[2]).c_str(), bytesStr(g.gathered_peak).c_str(), bytesStr(v[3]).c_str(),
        bytesStr(g.comm_estimate).c_str(), bytesStr(v[4]).c_str());
  }
  // Unsharded data parallel holds fp32 params + grads + two Adam moments on every rank.
  uint64_t param_count = 0;
  for (uint64_t n : unit_numels) param_count += n;
  const size_t replicated = param_count * 4 * sizeof(float);
  std::printf(
      "model state per rank: %s sharded vs %s replicated (params+grads+optim: %.2fx less)\n",
      bytesStr(r.param_bytes + r.grad_bytes + r.optim_bytes).c_str(), bytesStr(replicated).c_str(),
      double(replicated) / double(r.param_bytes + r.grad_bytes + r.optim_bytes));
  return hsdp::okStatus();
}

int checkParity(const char* program, hsdp::Comm& world, const hsdp::Mesh& mesh,
                hsdp::ShardedModel& model, const Spec& spec, const hsdp::EngineConfig& cfg,
                const Options& opt) {
  const int rank = world.rank();
  std::vector<std::vector<float>> mine(spec.layers());
  for (int l = 0; l < spec.layers(); ++l)
    if (hsdp::Status s = model.gatherFullParameters(l, &mine[l]); !s.ok()) {
      printError(program, rank, s.toString());
      world.abortJob(kExitRuntime);
    }
  float verdict[2] = {0, 0};  // {max_rel_err, pass}
  if (rank == 0) {
    // The engine rounds to bf16 only over a shard group larger than one (mode none reduces in
    // float); a bf16 reduction is modelled on the mesh's own tree.
    const bool sharded = model.shardCount() > 1;
    GradReduction tree;
    if (sharded && cfg.reduce_dtype == hsdp::DType::kBFloat16)
      tree = meshGradReduction(mesh.layout(), mesh.shape(), model.hierarchical());
    ReferenceResult ref = trainReference(spec, cfg.adam, opt.steps, opt.batch, opt.clip_norm,
                                         sharded && cfg.param_dtype == hsdp::DType::kBFloat16,
                                         tree.levels.empty() ? nullptr : &tree, opt.accum);
    const double err = maxRelativeError(mine, ref.params);
    verdict[0] = static_cast<float>(err);
    verdict[1] = err <= opt.tolerance ? 1.0f : 0.0f;  // false for NaN too
    std::vector<std::string> names;
    for (int l = 0; l < spec.layers(); ++l) names.push_back("fc" + std::to_string(l) + " params");
    if (const std::string bad = firstNonFinite(mine, ref.params, names); !bad.empty()) {
      verdict[1] = 0.0f;
      std::printf("\nparity: %s\n", bad.c_str());
    }
  }
  if (!shareVerdict(world, verdict).ok()) world.abortJob(kExitRuntime);
  if (rank == 0) {
    std::printf("\nparity vs eigen reference: max_rel_err=%.3g %s\n", verdict[0],
                verdict[1] == 1.0f ? "PASS" : "FAIL");
    std::fflush(stdout);
  }
  return verdict[1] == 1.0f ? 0 : 1;
}

int trainAndReport(const char* program, hsdp::Comm& world, hsdp::Comm& abort_comm,
                   const hsdp::Mesh& mesh, hsdp::ShardedModel& model, const Spec& spec,
                   const hsdp::EngineConfig& cfg, const Options& opt,
                   const std::function<hsdp::StatusOr<float>(int step)>& train_step) {
  double optim_total = 0, optim_exposed = 0;  // offload: worker time, and what step() waited
  auto start = restore(program, world, model, opt);
  if (!start.ok()) {
    printError(program, world.rank(), start.status().toString());
    return exitCodeOf(start.status());
  }
  for (int step = *start; step < opt.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    auto loss = train_step(step);
    auto t1 = std::chrono::steady_clock::now();
    if (!loss.ok()) {
      printError(program, world.rank(), loss.status().toString());
      abort_comm.abortJob(kExitRuntime);
    }
    const float ms = std::chrono::duration<float, std::milli>(t1 - t0).count();
    const float exposed_ms = static_cast<float>(model.takeExposedCommSeconds() * 1e3);
    double ot = 0, oe = 0;
    model.takeOptimizerSeconds(&ot, &oe);
    optim_total += ot;
    optim_exposed += oe;
    if (hsdp::Status row = printStepRow(world, model, opt, step, *loss, ms, exposed_ms);
        !row.ok()) {
      printError(program, world.rank(), row.toString());
      if (row.code() != hsdp::StatusCode::kOutOfRange) abort_comm.abortJob(kExitRuntime);
      return kExitRuntime;  // checkFinite: the same verdict on every rank
    }
    if (hsdp::Status s = afterStep(world, model, opt, step + 1, step + 1 == opt.steps); !s.ok()) {
      printError(program, world.rank(), s.toString());  // the same on every rank
      return exitCodeOf(s);
    }
  }
  if (*start == opt.steps) {  // nothing to train: a save-dir still gets this step's checkpoint
    if (hsdp::Status s = afterStep(world, model, opt, opt.steps, true); !s.ok()) {
      printError(program, world.rank(), s.toString());
      return exitCodeOf(s);
    }
  }
  if (hsdp::Status s = finishCheckpoints(world, model, opt); !s.ok()) {
    printError(program, world.rank(), s.toString());
    return exitCodeOf(s);
  }
  printOffloadSummary(world, cfg, opt, optim_total, optim_exposed);
  if (!printMemory(world, mesh, model, spec, cfg).ok()) abort_comm.abortJob(kExitRuntime);
  if (!opt.check) return 0;
  return checkParity(program, world, mesh, model, spec, cfg, opt);
}

}  // namespace mlp
