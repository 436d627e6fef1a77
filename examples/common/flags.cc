#include "common/flags.h"

#include <algorithm>

#include "cli.h"

namespace examples {

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

void addCheckpointFlags(CLI::App& app, CheckpointFlags& flags) {
  app.add_option("--save-dir", flags.save_dir,
                 "Checkpoint root: <dir>/step-NNNNNNNN per save, <dir>/latest names the newest");
  hsdp::cli::addInt(app, "--save-every", flags.save_every,
                    "Save every K steps (and after the last); 0: after the last step only", 0);
  app.add_flag("--async-save", flags.async_save,
               "Snapshot into host memory and write in the background while training goes on");
  hsdp::cli::addInt(app, "--keep", flags.keep, "Keep only the newest K checkpoints (0: all)", 0);
  app.add_option("--resume", flags.resume,
                 "Load a checkpoint (directory, root with `latest`, or 'latest' of --save-dir) "
                 "and train on to --steps; any mesh and mode");
  app.add_option("--export", flags.export_path,
                 "After training, write the full parameters as safetensors");
  app.add_option("--init-from", flags.init_from,
                 "Initialise the parameters from a safetensors file or index");
  app.add_option("--optimizer-from", flags.optimizer_from,
                 "checkpoint | flags: with --resume, the optimizer settings (kind, lr, betas, eps, "
                 "weight decay) of the checkpoint or of the flags; a difference is printed")
      ->check(CLI::IsMember({"checkpoint", "flags"}));
}

}  // namespace examples
