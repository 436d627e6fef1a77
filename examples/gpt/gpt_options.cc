#include "gpt/gpt_options.h"

#include <CLI/CLI.hpp>

#include "mlp/flags.h"

namespace gpt {

std::optional<int> parseCommandLine(const char* program, int argc, char** argv, int rank,
                                    Options* opt_out) {
  Options& opt = *opt_out;
  mlp::Options& c = opt.common;
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
  app.add_option("--mode", c.mode, "Sharding mode: none | zero1 | zero2 | zero3")
      ->check(CLI::IsMember({"none", "zero1", "zero2", "zero3"}));
  app.add_option("--intra-shard", c.intra_shard,
                 "Ranks per node that shard each unit (divides ranks per node; default: all, or 1 "
                 "in mode none)");
  app.add_option("--inter-shard", c.inter_shard, "Nodes that shard each unit (default 1)");
  app.add_option("--steps", c.steps, "Training steps");
  app.add_option("--batch", c.batch,
                 "Sequences per global batch (a multiple of accum x ranks; each rank reads its "
                 "own slice)");
  app.add_option("--accum", c.accum, "Micro-steps per optimizer step (gradient accumulation)");
  app.add_option("--clip-norm", c.clip_norm, "Clip the global gradient norm (0: off)");
  app.add_option("--max-gathered", c.max_gathered,
                 "Rate limiter: at most N units gathered at once, 0 = no limit (zero3)");
  app.add_flag("--hpz", c.hpz, "hpZ: backward re-gathers inside the node (zero3, I > 1, J > 1)");
  app.add_option("--param-dtype", c.param_dtype, "fp32 | bf16: parameters gathered as bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--reduce-dtype", c.reduce_dtype, "fp32 | bf16: gradient reduce-scatter dtype")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--offload", c.offload, "none | cpu: optimizer state on the CPU Adam")
      ->check(CLI::IsMember({"none", "cpu"}));
  app.add_flag("--check", c.check, "Train the single-process reference and compare parameters");
  app.add_option("--tolerance", c.tolerance, "Largest max_rel_err that passes --check");
  app.add_option("--lr", c.lr, "Peak learning rate (after warm-up)");
  app.add_option("--min-lr", opt.min_lr,
                 "Learning rate at the end of the cosine decay "
                 "(default: lr / 10)");
  app.add_option("--warmup", opt.warmup, "Linear warm-up steps (default: steps / 10)");
  app.add_option("--weight-decay", c.weight_decay, "AdamW weight decay (matrices only)");
  app.add_option("--eps", c.eps, "Adam epsilon");
  app.add_option("--beta2", opt.beta2, "Adam beta2");
  app.add_option("--optimizer", c.optimizer, "adam | adamw")
      ->check(CLI::IsMember({"adam", "adamw"}));
  app.add_option("--seed", c.seed, "Seed of the initialisation and the batches");
  app.add_option("--preset", opt.preset,
                 "tiny (4 layers, d 128, 4 heads, context 64) | small "
                 "(6 layers, d 384, 6 heads, context 128)");
  app.add_option("--layers", opt.layers, "Transformer blocks (default: the preset's)");
  app.add_option("--d-model", opt.d_model, "Model width (default: the preset's)");
  app.add_option("--heads", opt.heads, "Attention heads (default: the preset's)");
  app.add_option("--context", opt.context, "Sequence length (default: the preset's)");
  app.add_flag("--activation-checkpointing", opt.activation_checkpointing,
               "Keep only each block's input; recompute the block's forward in backward");
  app.add_option("--data", opt.data, "Corpus: a fortune file or a directory of them");
  app.add_option("--eval-every", opt.eval_every,
                 "Validation loss every K steps (0: once, after the last step)");
  app.add_option("--eval-batches", opt.eval_batches,
                 "Micro-batches of validation sequences per evaluation (0: no evaluation)");
  app.add_option("--sample", opt.sample, "Tokens to generate from --prompt after training");
  app.add_option("--temperature", opt.temperature, "Sampling temperature");
  app.add_option("--sample-seed", opt.sample_seed, "Seed of the sampler");
  app.add_option("--prompt", opt.prompt, "The text generation starts from");
  mlp::addCheckpointFlags(app, c);
  app.add_option("--prefetch", opt.prefetch,
                 "Units whose gathers are issued ahead of the one computing (0: no prefetch)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    if (rank == 0) app.exit(e);
    return 0;
  } catch (const CLI::ParseError& e) {
    mlp::printError(program, rank, e.what());
    return mlp::kExitUsage;
  }
  c.intra_shard_given = app.count("--intra-shard") > 0;
  c.inter_shard_given = app.count("--inter-shard") > 0;
  return std::nullopt;
}

hsdp::Status configure(const Options& opt, int world_size, Setup* out) {
  mlp::Spec unused;  // train_mlp's --dims stays at its default; only the engine part is used
  HSDP_RETURN_IF_ERROR(mlp::configure(opt.common, world_size, &unused, &out->engine, &out->mesh));
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
