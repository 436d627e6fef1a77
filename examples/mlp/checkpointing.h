// The examples' checkpoint flags (--save-dir, --save-every, --async-save, --keep, --resume,
// --export, --init-from) on the library's calls (hsdp/checkpoint.h): restore before the first
// step, save after steps, wait and export at the end. Rank 0 prints one line per save:
//   checkpoint step-00000004: 1.53 MiB in 0.021 s (72.9 MiB/s) -> DIR/step-00000004
// and, with --async-save, the snapshot time when the save starts.
#pragma once

#include "hsdp/sharded_model.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"
#include "mlp/options.h"

namespace mlp {

// --init-from (loadWeights) then --resume (load); returns the first step to train: the
// checkpoint's step (0 without --resume). Errors (a missing or corrupt checkpoint, another
// model, a checkpoint past --steps) are the same on every rank.
hsdp::StatusOr<int> restore(const char* program, hsdp::Comm& world, hsdp::ShardedModel& model,
                            const Options& opt);

// After the optimizer step that made `steps_done` steps: saves every --save-every steps, and after
// the last one.
[[nodiscard]] hsdp::Status afterStep(hsdp::Comm& world, hsdp::ShardedModel& model,
                                     const Options& opt, int steps_done, bool last);

// Waits for a save in flight, then --export.
[[nodiscard]] hsdp::Status finishCheckpoints(hsdp::Comm& world, hsdp::ShardedModel& model,
                                             const Options& opt);

}  // namespace mlp
