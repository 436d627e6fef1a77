// Flag groups the examples' command lines share (CLI11). train_mlp's and train_gpt's parsers add
// them, so a flag has one spelling, one help text and one check in every program. The mesh,
// precision, offload, checkpoint and failure flags are hsdp's (hsdp/flags.h: every program's);
// these are the training loop's.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>

#include "common/options.h"

namespace examples {

// Largest --batch and --accum (a batch sizes every rank's activations; accum x ranks divides it):
// documented maxima, so no value can size memory or a loop unbounded.
constexpr int kMaxBatch = 1 << 20;

// Numeric flags both examples share, parsed by hsdp/cli.h (range-checked, named as written):
// --steps (>= 0), --batch --accum (1..kMaxBatch), --clip-norm (>= 0), --max-gathered (>= 0);
// --lr --weight-decay (>= 0, finite), --eps (> 0); --tolerance (>= 0, finite).
void addStepFlags(CLI::App& app, Options& opt, const char* batch_help, const char* accum_help);
void addOptimizerFlags(CLI::App& app, Options& opt, const char* lr_help, const char* wd_help);
void addToleranceFlag(CLI::App& app, Options& opt);
// After parsing: without --tolerance, a run with bf16 parameters or reductions checks against
// kBf16Tolerance (bf16 rounds to 8 bits of mantissa; the fp32 default cannot pass).
constexpr double kBf16Tolerance = 1e-2;
void applyBf16Tolerance(const CLI::App& app, Options& opt);

// Parses argv into `app`'s flags, then applyBf16Tolerance. Returns an exit code when the program
// should end now: 0 after --help (printed by rank 0), kExitUsage after a parse error (printed by
// every rank); nullopt to go on.
std::optional<int> parse(CLI::App& app, int argc, char** argv, const char* program, int rank,
                         Options& opt);

}  // namespace examples
