#include "gpt/gpt_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>

#include "common/flags.h"
#include "hsdp/cli.h"
#include "hsdp/flags.h"
#include "hsdp/parse.h"

namespace gpt {

std::optional<int> parseCommandLine(const char* program, int argc, char** argv, int rank,
                                    Options* opt_out) {
  Options& opt = *opt_out;
  examples::Options& c = opt.common;
  // GPT defaults for the flags train_mlp shares (nanoGPT-like: AdamW, beta2 0.95, wd 0.1, clip 1).
  c.steps = 20;
  c.batch = 16;
  c.lr = 1e-3f;
  c.weight_decay = 0.1f;
  c.clip_norm = 1.0f;
  c.tolerance = 2e-4;
  CLI::App app{
      "hsdp example: GPT-2 training on real text, hybrid-sharded, checked against a "
      "single-process reference",
      program};
  hsdp::cli::addMeshFlags(app, c);
  examples::addStepFlags(
      app, c,
      "Sequences per global batch (a multiple of accum x ranks; each rank reads its "
      "own slice)",
      "Micro-steps per optimizer step (gradient accumulation)");
  hsdp::cli::addFailureFlags(app, c);
  hsdp::cli::addReplicaFlags(app, c);
  hsdp::cli::addPrecisionFlags(app, c);
  hsdp::cli::addOffloadFlags(app, c);
  app.add_flag("--check", c.check, "Train the single-process reference and compare parameters");
  examples::addToleranceFlag(app, c);
  examples::addOptimizerFlags(app, c, "Peak learning rate (after warm-up)",
                              "AdamW weight decay (matrices only)");
  hsdp::cli::addReal(app, "--min-lr", opt.min_lr,
                     "Learning rate at the end of the cosine decay (default: lr / 10)",
                     hsdp::RealRange::above(0));
  hsdp::cli::addInt(app, "--warmup", opt.warmup, "Linear warm-up steps (default: steps / 10)", 0);
  hsdp::cli::addReal(app, "--beta2", opt.beta2, "Adam beta2", hsdp::RealRange::halfOpen(0, 1));
  app.add_option("--optimizer", c.optimizer, "adam | adamw")
      ->check(CLI::IsMember({"adam", "adamw"}));
  hsdp::cli::addInt(app, "--seed", c.seed, "Seed of the initialisation and the batches");
  app.add_option("--preset", opt.preset,
                 "tiny (4 layers, d 128, 4 heads, context 64) | small "
                 "(6 layers, d 384, 6 heads, context 128)");
  // Shapes: at most what a model on one node could hold (each sizes memory; their products are
  // checked in configure()).
  hsdp::cli::addInt(app, "--layers", opt.layers, "Transformer blocks (default: the preset's)", 1,
                    1024);
  hsdp::cli::addInt(app, "--d-model", opt.d_model, "Model width (default: the preset's)", 1,
                    1 << 16);
  hsdp::cli::addInt(app, "--heads", opt.heads, "Attention heads (default: the preset's)", 1, 1024);
  hsdp::cli::addInt(app, "--context", opt.context, "Sequence length (default: the preset's)", 1,
                    1 << 16);
  app.add_flag("--activation-checkpointing", opt.activation_checkpointing,
               "Keep only each block's input; recompute the block's forward in backward");
  app.add_option("--data", opt.data, "Corpus: a fortune file or a directory of them");
  hsdp::cli::addInt(app, "--eval-every", opt.eval_every,
                    "Validation loss every K steps (0: once, after the last step)", 0);
  hsdp::cli::addInt(app, "--eval-batches", opt.eval_batches,
                    "Micro-batches of validation sequences per evaluation (0: no evaluation)", 0,
                    examples::kMaxBatch);
  hsdp::cli::addInt(app, "--sample", opt.sample, "Tokens to generate from --prompt after training",
                    0, 1 << 20);
  hsdp::cli::addReal(app, "--temperature", opt.temperature, "Sampling temperature",
                     hsdp::RealRange::above(0));
  hsdp::cli::addInt(app, "--sample-seed", opt.sample_seed, "Seed of the sampler");
  app.add_option("--prompt", opt.prompt, "The text generation starts from");
  hsdp::cli::addCheckpointFlags(app, c.ckpt);
  hsdp::cli::addInt(app, "--prefetch", opt.prefetch,
                    "Units whose gathers are issued ahead of the one computing (0: no prefetch)", 0,
                    1024);
  return examples::parse(app, argc, argv, program, rank, c);
}

hsdp::Status configure(const Options& opt, int world_size, Setup* out) {
  HSDP_RETURN_IF_ERROR(examples::configure(opt.common, world_size, &out->engine, &out->mesh));
  out->engine.adam.beta2 = opt.beta2;
  HSDP_RETURN_IF_ERROR(hsdp::validate(out->engine.adam));
  HSDP_ASSIGN_OR_RETURN(out->model, preset(opt.preset));
  Config& m = out->model;
  auto over = [](int given, int* field) {
    if (given != 0) *field = given;
  };
  over(opt.layers, &m.layers);
  over(opt.d_model, &m.d_model);
  over(opt.heads, &m.heads);
  over(opt.context, &m.context);
  m.seed = opt.common.seed;
  HSDP_RETURN_IF_ERROR(validate(m));
  {
    // Below 2^16 for d and context and 2^10 layers, every product here fits 64 bits.
    const uint64_t d = uint64_t(m.d_model);
    const uint64_t largest =
        std::max({12 * d * d + 13 * d, uint64_t(m.vocab) * d, uint64_t(m.context) * d});
    // One micro-batch on this rank: every block's input (kept with or without activation
    // checkpointing) and the logits, 4 bytes each.
    const uint64_t seqs = uint64_t(opt.common.batch) / uint64_t(std::max(1, world_size)) /
                          uint64_t(std::max(1, opt.common.accum));
    const uint64_t tokens = seqs * uint64_t(m.context);
    const uint64_t act =
        hsdp::checkedMul(tokens, (uint64_t(m.layers) * d + m.vocab) * 4).value_or(UINT64_MAX);
    HSDP_RETURN_IF_ERROR(examples::checkModelFits(
        largest, m.paramCount(), act, opt.common.check,
        hsdp::strCat("--layers ", m.layers, " --d-model ", m.d_model, " --context ", m.context,
                     " --batch ", opt.common.batch, opt.common.check ? " with --check" : "")));
  }
  // The GPT reference trains the synchronous schedule only (train_mlp --check replays local_sgd
  // and diloco: mlp::trainReplicaReference).
  if (opt.common.check && out->engine.replica_sync.policy != hsdp::ReplicaPolicy::kSync)
    return hsdp::invalidArgument(
        "--check with --replica-policy ", hsdp::replicaPolicyName(out->engine.replica_sync.policy),
        ": train_gpt's reference trains the sync schedule only (train_mlp --check replays it)");
  if (opt.eval_every < 0)
    return hsdp::invalidArgument("--eval-every ", opt.eval_every, " must be >= 0");
  if (opt.eval_batches < 0)
    return hsdp::invalidArgument("--eval-batches ", opt.eval_batches, " must be >= 0");
  if (opt.sample < 0) return hsdp::invalidArgument("--sample ", opt.sample, " must be >= 0");
  if (!(opt.temperature > 0))
    return hsdp::invalidArgument("--temperature ", opt.temperature, " must be > 0");
  if (opt.prompt.empty()) return hsdp::invalidArgument("--prompt must not be empty");
  if (opt.prefetch < 0) return hsdp::invalidArgument("--prefetch ", opt.prefetch, " must be >= 0");
  TrainSettings& t = out->train;
  t.adam = out->engine.adam;
  t.steps = opt.common.steps;
  t.allow_nonfinite = opt.common.allow_nonfinite;
  t.batch = opt.common.batch;
  t.accum = opt.common.accum;
  t.clip_norm = opt.common.clip_norm;
  t.data_seed = opt.common.seed;
  t.checkpoint = opt.activation_checkpointing;
  t.schedule.lr = opt.common.lr;
  t.schedule.min_lr = opt.min_lr >= 0 ? opt.min_lr : opt.common.lr / 10;
  t.schedule.warmup = opt.warmup >= 0 ? opt.warmup : t.steps / 10;
  t.schedule.steps = t.steps;
  if (opt.warmup < -1) return hsdp::invalidArgument("--warmup ", opt.warmup, " must be >= 0");
  if (!(t.schedule.min_lr > 0) || t.schedule.min_lr > t.schedule.lr)
    return hsdp::invalidArgument("--min-lr ", t.schedule.min_lr, " must be in (0, --lr ",
                                 t.schedule.lr, "]");
  return hsdp::okStatus();
}

}  // namespace gpt
