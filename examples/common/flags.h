// Flag groups the examples' command lines share (CLI11). train_mlp's and train_gpt's parsers add
// them, so a flag has one spelling, one help text and one check in every program.
#pragma once

#include <CLI/CLI.hpp>

#include "common/options.h"

namespace examples {

// Largest --batch and --accum (a batch sizes every rank's activations; accum x ranks divides it),
// and largest shard factor: documented maxima, so no value can size memory or a loop unbounded.
constexpr int kMaxBatch = 1 << 20;
constexpr int kMaxRanks = 1 << 20;

// Numeric flags both examples share, parsed by tools/cli.h (range-checked, named as written):
// --intra-shard --inter-shard (>= 1 when given), --steps (>= 0), --batch --accum (1..kMaxBatch),
// --clip-norm (>= 0), --max-gathered (>= 0), --allow-nonfinite; --lr --weight-decay (>= 0,
// finite), --eps (> 0); --tolerance (>= 0, finite).
void addShardFlags(CLI::App& app, Options& opt, const char* intra_help, const char* inter_help);
void addStepFlags(CLI::App& app, Options& opt, const char* batch_help, const char* accum_help);
void addOptimizerFlags(CLI::App& app, Options& opt, const char* lr_help, const char* wd_help);
void addToleranceFlag(CLI::App& app, Options& opt);
// After parsing: without --tolerance, a run with bf16 parameters or reductions checks against
// kBf16Tolerance (bf16 rounds to 8 bits of mantissa; the fp32 default cannot pass).
constexpr double kBf16Tolerance = 1e-2;
void applyBf16Tolerance(const CLI::App& app, Options& opt);

// --save-dir, --save-every, --async-save, --keep, --resume, --export, --init-from,
// --optimizer-from (common/checkpointing.h carries them out; configure() checks how they
// combine).
void addCheckpointFlags(CLI::App& app, CheckpointFlags& flags);

}  // namespace examples
