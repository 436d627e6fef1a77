#include "common/flags.h"

#include <algorithm>

#include "hsdp/cli.h"

namespace examples {

void addStepFlags(CLI::App& app, Options& opt, const char* batch_help, const char* accum_help) {
  hsdp::cli::addInt(app, "--steps", opt.steps, "Training steps", 0);
  hsdp::cli::addInt(app, "--batch", opt.batch, batch_help, 1, kMaxBatch);
  hsdp::cli::addInt(app, "--accum", opt.accum, accum_help, 1, kMaxBatch);
  hsdp::cli::addReal(app, "--clip-norm", opt.clip_norm, "Clip the global gradient norm (0: off)",
                     hsdp::RealRange::atLeast(0));
  hsdp::cli::addInt(app, "--max-gathered", opt.max_gathered,
                    "Rate limiter: at most N units gathered at once, 0 = no limit (zero3)", 0);
  app.add_option("--trace", opt.trace,
                 "Write each rank's step timeline to DIR/trace.rank<N>.json (Chrome trace "
                 "events; hsdp-trace merge|svg DIR; default HSDP_TRACE)")
      ->type_name("DIR");
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

std::optional<int> parse(CLI::App& app, int argc, char** argv, const char* program, int rank,
                         Options& opt) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, program, rank, rank == 0);
  }
  applyBf16Tolerance(app, opt);
  return std::nullopt;
}

}  // namespace examples
