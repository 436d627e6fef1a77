// Flag groups the examples' command lines share (CLI11). train_mlp's and train_gpt's parsers add
// them, so a flag has one spelling, one help text and one check in every program.
#pragma once

#include <CLI/CLI.hpp>

#include "mlp/options.h"

namespace mlp {

// --save-dir, --save-every, --async-save, --keep, --resume, --export, --init-from
// (mlp/checkpointing.h carries them out; configure() checks how they combine).
void addCheckpointFlags(CLI::App& app, Options& opt);

}  // namespace mlp
