// train_gpt's command line: every example's flags (the same names, checks, errors and exit codes
// as train_mlp's: they land in an examples::Options and go through examples::configure), plus the
// model
// (--preset, --layers, --d-model, --heads, --context, --activation-checkpointing), the data
// (--data), the schedule (--warmup, --min-lr), evaluation (--eval-every, --eval-batches),
// sampling (--sample, --temperature, --sample-seed, --prompt) and --prefetch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/options.h"
#include "gpt/data.h"
#include "gpt/model.h"
#include "gpt/reference.h"
#include "hsdp/config.h"
#include "hsdp/mesh.h"

namespace gpt {

struct Options {
  examples::Options common;  // the flags every example has; gpt defaults set by parseCommandLine
  std::string preset = "tiny";
  int layers = 0, d_model = 0, heads = 0, context = 0;  // 0: the preset's
  bool activation_checkpointing = false;
  std::string data = kDefaultCorpus;
  int warmup = -1;       // -1: a tenth of the steps
  float min_lr = -1.0f;  // -1: a tenth of --lr
  float beta2 = 0.95f;
  int eval_every = 0;    // 0: at the end only when --eval-batches > 0 and steps > 0
  int eval_batches = 2;  // micro-batches of validation sequences per evaluation
  int sample = 0;        // tokens generated after training
  float temperature = 0.8f;
  uint64_t sample_seed = 1;
  std::string prompt = "The meaning of life is ";
  int prefetch = 1;  // units gathered ahead (hsdp::ScheduleOptions::prefetch); 0: off
};

// Parses argv into *opt on every rank. Returns an exit code when the program should end now: 0
// after --help (printed by rank 0), examples::kExitUsage after a parse error (printed by every
// rank).
std::optional<int> parseCommandLine(const char* program, int argc, char** argv, int rank,
                                    Options* opt);

// Everything a run needs, checked. A non-OK Status is bad input every rank sees alike.
struct Setup {
  Config model;
  hsdp::EngineConfig engine;
  hsdp::MeshSpec mesh;
  TrainSettings train;
};
[[nodiscard]] hsdp::Status configure(const Options& opt, int world_size, Setup* out);

}  // namespace gpt
