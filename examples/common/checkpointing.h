// The examples' checkpoint flags (--save-dir, --save-every, --async-save, --keep, --resume,
// --export, --init-from, --optimizer-from) on the library's calls (hsdp/checkpoint.h): restore
// before the first step, save after steps, wait and export at the end. Rank 0 prints one line per
// save:
//   checkpoint step-00000004: 1.53 MiB in 0.021 s (72.9 MiB/s) -> DIR/step-00000004
// and, with --async-save, the snapshot time when the save starts.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/membership.h"
#include "hsdp/flags.h"
#include "hsdp/sharded_model.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace examples {

// The flags (hsdp/flags.h declares them, once, for every program).
using CheckpointFlags = hsdp::cli::CheckpointFlags;

// What restore() needs to know of a program's optimizer flags to compare them with a checkpoint.
struct RestoreHints {
  // The rate the run gives step s when a schedule sets it every step (train_gpt); empty: the
  // rate is --lr (the checkpoint's, if --optimizer-from checkpoint, from the resumed step on).
  std::function<float(int64_t step)> lr_at;
  bool beta2_flag = false;  // the program has --beta2
  // How --init-from's safetensors name the parameters (train_gpt: HF's GPT-2 names too).
  hsdp::LoadWeightsOptions weights;
};

// One run's checkpoints: the flags, and the step of the run's last save into --save-dir (a
// resumed run does not save the step it resumed at again).
class Checkpoints {
 public:
  // `seed` is recorded in every save beside the data position (the batches are functions of
  // seed and step).
  Checkpoints(hsdp::Comm& world, hsdp::ShardedModel& model, const CheckpointFlags& flags,
              uint64_t seed)
      : world_(world), model_(model), flags_(flags), seed_(seed) {}

  // --init-from (loadWeights) then --resume (load); returns the first step to train: the
  // checkpoint's step (0 without --resume). Errors (a missing or corrupt checkpoint, another
  // model, invalid optimizer settings in it, a checkpoint past `steps`) are the same on every
  // rank. --optimizer-from says whose optimizer settings the run goes on with; rank 0 prints one
  // line per setting where the checkpoint's differs from the flags', e.g.
  //   resume: checkpoint lr 0.001 differs from --lr 0.0003; using the checkpoint's
  //   (--optimizer-from checkpoint)
  [[nodiscard]] hsdp::StatusOr<int> restore(int steps, const RestoreHints& hints = {});

  // After the optimizer step that made `steps_done` steps: saves every --save-every steps, and
  // after the last one.
  [[nodiscard]] hsdp::Status afterStep(int steps_done, bool last);

  // Waits for a save in flight, then --export.
  [[nodiscard]] hsdp::Status finish();

  // A stop request (hsdp/stop.h) agreed after `steps_done` steps: waits for a save in flight,
  // then saves step `steps_done` into --save-dir (synchronously; not again if it was just saved)
  // and returns the committed directory; "" without --save-dir (nothing is saved).
  [[nodiscard]] hsdp::StatusOr<std::string> saveForStop(int steps_done);

  // Elastic mode (collective over the group): the groups of the quorum that committed each of
  // steps [0, steps) and the group count of the job that ran it, what --check replays. The steps
  // before the resumed checkpoint come from its "elastic.membership" entry (the saving job's
  // record, which may have had another number of groups), the others from this job's etcd.
  [[nodiscard]] hsdp::StatusOr<Membership> membership(int steps);

 private:
  hsdp::Comm& world_;
  hsdp::ShardedModel& model_;
  const CheckpointFlags& flags_;
  uint64_t seed_;
  int last_saved_ = -1;
  std::string last_dir_;  // the directory of the last committed save
  // Elastic: the membership of steps [0, history_.present.size()), as saves record it; false when
  // the resumed checkpoint holds no record (its steps cannot be replayed).
  Membership history_;
  bool history_known_ = true;
  int64_t resumed_ = 0;
  // The user entries of a save of step `steps_done` (its data position; elastic: the membership).
  [[nodiscard]] hsdp::StatusOr<hsdp::SaveOptions> saveOptions(int steps_done);
};

}  // namespace examples
