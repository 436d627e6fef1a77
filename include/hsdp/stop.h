// Stop requests: a signal (SIGTERM from scancel or a preemption, SIGUSR1 from
// `sbatch --signal=USR1@T` before the time limit) asks the training loop to stop after the
// current step, checkpoint and exit, instead of dying mid-step.
//
//   HSDP_RETURN_IF_ERROR(hsdp::installStopSignals({SIGTERM, SIGUSR1}));
//   for (step = ...) {
//     ... one step ...
//     HSDP_ASSIGN_OR_RETURN(int sig, hsdp::agreeStop(mesh.control()));  // collective
//     if (sig != 0) { save a checkpoint; exit with kStopExitCode; }
//   }
//
// The handler only stores the signal number in a lock-free atomic (async-signal-safe); the loop
// polls it. One rank may get the signal a step before another, so agreeStop() combines every
// rank's flag (an all-reduce): all ranks see the same answer after the same step.
#pragma once

#include <initializer_list>
#include <string>

#include "hsdp/status.h"

namespace hsdp {

class Comm;

// Installs the handler for each signal (sigaction, SA_RESTART). InvalidArgument naming the
// signal for one that cannot be caught (SIGKILL, SIGSTOP) or is out of range; then nothing is
// installed. Call it again to add signals; the handler of a signal is replaced.
[[nodiscard]] Status installStopSignals(std::initializer_list<int> signals);

// Whether a stop was requested in this process, and by which signal (the first one; 0: none).
bool stopRequested();
int stopSignal();
// Requests a stop as if `signal` had arrived (async-signal-safe); clearStopRequest() forgets it.
void requestStop(int signal);
void clearStopRequest();

// Collective over `comm` (every member calls it, once per step, in the same order as its other
// collectives): 0 when no member has a stop request, else the lowest signal number any member
// got. Use the host control communicator (Mesh::control(), Comm::hostComm()).
[[nodiscard]] StatusOr<int> agreeStop(Comm& comm);

// "SIGTERM", "SIGUSR1", ...; "signal N" for others.
std::string signalName(int signal);

}  // namespace hsdp
