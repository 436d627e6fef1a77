// Preemption in the examples (hsdp/stop.h): SIGTERM (scancel, preemption) and SIGUSR1
// (sbatch --signal=USR1@T before the time limit) ask the run to stop. After each step every rank
// agrees whether any rank was asked (one all-reduce on the control communicator); then all of
// them finish that step, wait for an async save in flight, save the step (--save-dir) and exit
// with 128 + the signal (143 for SIGTERM, 138 for SIGUSR1), rank 0 printing one line:
//   train_gpt: stopped by SIGTERM after step 37; checkpoint step-00000037 in /path/ckpt
//   train_gpt: stopped by SIGTERM after step 37; no checkpoint (no --save-dir)
// `--resume latest` (with the same --save-dir) then continues from that step exactly.
#pragma once

#include <optional>

#include "common/checkpointing.h"
#include "common/failure.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace examples {

// SIGTERM and SIGUSR1 become stop requests.
[[nodiscard]] hsdp::Status installStopSignals();

// The exit code of a run stopped by `signal`: 128 + signal, as a shell reports a process the
// signal ended, so a requeue script treats a checkpointed stop like the kill it replaces.
int stopExitCode(int signal);

// After a step that made `steps_done` steps: collective over `control`. nullopt to go on; else
// the run has saved (or has no --save-dir) and printed its line, and the caller returns this
// exit code on every rank.
[[nodiscard]] hsdp::StatusOr<std::optional<int>> stopIfRequested(const char* program,
                                                                 hsdp::Comm& control,
                                                                 const hsdp::Comm& world,
                                                                 Checkpoints& ckpt, int steps_done);

}  // namespace examples
