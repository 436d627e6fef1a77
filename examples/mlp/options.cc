#include "mlp/options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>

#include "common/flags.h"
#include "hsdp/cli.h"
#include "hsdp/flags.h"
#include "hsdp/parse.h"

namespace mlp {
namespace {

constexpr int kMaxDim = 1 << 20;

hsdp::StatusOr<std::vector<int>> parseDims(const std::string& text) {
  HSDP_ASSIGN_OR_RETURN(std::vector<int> dims,
                        hsdp::parseIntegerList<int>(text, "--dims", 1, kMaxDim));
  if (dims.size() < 2) return hsdp::invalidArgument("--dims '", text, "' needs >= 2 sizes");
  return dims;
}

}  // namespace

std::optional<int> parseCommandLine(const char* program, const char* description, int argc,
                                    char** argv, int rank, Options* opt_out) {
  Options& opt = *opt_out;
  examples::Options& c = opt.common;
  CLI::App app{description, program};
  hsdp::cli::addMeshFlags(app, c);
  examples::addStepFlags(
      app, c, "Global batch size (a multiple of the world size)",
      "Micro-steps per optimizer step (gradient accumulation; batch / accum per step)");
  hsdp::cli::addFailureFlags(app, c);
  hsdp::cli::addReplicaFlags(app, c);
  hsdp::cli::addPrecisionFlags(app, c);
  hsdp::cli::addOffloadFlags(app, c);
  app.add_flag("--check", c.check, "Train the Eigen reference and compare parameters");
  examples::addOptimizerFlags(app, c, "Learning rate", "Weight decay");
  app.add_option("--optimizer", c.optimizer, "adam | adamw")
      ->check(CLI::IsMember({"adam", "adamw"}));
  hsdp::cli::addList(app, "--dims", opt.dims, "Layer sizes, input to classes, comma separated");
  hsdp::cli::addInt(app, "--seed", c.seed, "Seed of data and initialisation");
  examples::addToleranceFlag(app, c);
  hsdp::cli::addCheckpointFlags(app, c.ckpt);
  hsdp::cli::addInt(app, "--val-samples", opt.val_samples,
                    "After training, print the mean loss over this many held-out samples "
                    "(a multiple of the ranks; 0: none)",
                    0, examples::kMaxBatch);
  return examples::parse(app, argc, argv, program, rank, c);
}

hsdp::Status configure(const Options& opt, int world_size, Spec* spec, hsdp::EngineConfig* cfg,
                       hsdp::MeshSpec* mesh_spec) {
  const examples::Options& c = opt.common;
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
    const uint64_t rows = world_size > 0 && c.batch > 0 && c.accum > 0
                              ? uint64_t(c.batch) / uint64_t(world_size) / uint64_t(c.accum)
                              : 0;
    HSDP_RETURN_IF_ERROR(examples::checkModelFits(
        largest, total, hsdp::checkedMul(rows, width * 8).value_or(UINT64_MAX), c.check,
        hsdp::strCat("--dims ", opt.dims, c.check ? " with --check" : "")));
  }
  spec->seed = c.seed;
  HSDP_RETURN_IF_ERROR(examples::configure(c, world_size, cfg, mesh_spec));
  if (opt.val_samples < 0 || opt.val_samples % world_size != 0)
    return hsdp::invalidArgument("--val-samples ", opt.val_samples, " must be a multiple of the ",
                                 world_size, " ranks (each rank evaluates an equal slice)");
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

}  // namespace mlp
