// The examples' checkpoint flags (--save-dir, --save-every, --async-save, --keep, --resume,
// --export, --init-from, --optimizer-from) on the library's calls (hsdp/checkpoint.h): restore
// before the first step, save after steps, wait and export at the end. Rank 0 prints one line per
// save:
//   checkpoint step-00000004: 1.53 MiB in 0.021 s (72.9 MiB/s) -> DIR/step-00000004
// and, with --async-save, the snapshot time when the save starts.
#pragma once

#include <cstdint>
#include <functional>

#include "hsdp/sharded_model.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"
#include "mlp/options.h"

namespace mlp {

// What restore() needs to know of a program's optimizer flags to compare them with a checkpoint.
struct RestoreHints {
  // The rate the run gives step s when a schedule sets it every step (train_gpt); empty: the
  // rate is --lr (the checkpoint's, if --optimizer-from checkpoint, from the resumed step on).
  std::function<float(int64_t step)> lr_at;
  bool beta2_flag = false;  // the program has --beta2
};

// --init-from (loadWeights) then --resume (load); returns the first step to train: the
// checkpoint's step (0 without --resume). Errors (a missing or corrupt checkpoint, another
// model, invalid optimizer settings in it, a checkpoint past --steps) are the same on every
// rank. --optimizer-from says whose optimizer settings the run goes on with; rank 0 prints one
// line per setting where the checkpoint's differs from the flags', e.g.
//   resume: checkpoint lr 0.001 differs from --lr 0.0003; using the checkpoint's (--optimizer-from
//   checkpoint)
hsdp::StatusOr<int> restore(const char* program, hsdp::Comm& world, hsdp::ShardedModel& model,
                            const Options& opt, const RestoreHints& hints = {});

// After the optimizer step that made `steps_done` steps: saves every --save-every steps, and after
// the last one.
[[nodiscard]] hsdp::Status afterStep(hsdp::Comm& world, hsdp::ShardedModel& model,
                                     const Options& opt, int steps_done, bool last);

// Waits for a save in flight, then --export.
[[nodiscard]] hsdp::Status finishCheckpoints(hsdp::Comm& world, hsdp::ShardedModel& model,
                                             const Options& opt);

}  // namespace mlp
