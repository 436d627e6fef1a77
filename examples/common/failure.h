// The examples' one failure policy. What decides how a program ends is what the ranks know when
// a Status fails:
//   agreed  every rank met the same failure at the same point, from the same inputs (a bad flag
//           or corpus, a mesh or model the engine refuses, a checkpoint that does not fit, a loss
//           that is not finite: the mean over every rank). Every rank prints it and returns the
//           exit code; nobody is left waiting in a collective.
//   alone   this rank may have met it alone (a collective or a save failed here): the ranks may
//           now disagree about the next collective, so the whole job ends (exit kExitRuntime)
//           instead of risking a hang.
// Every error is one line on stderr: "<program> [rank r]: error: <what>".
#pragma once

#include <string>

#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace examples {

// Exit codes of the examples: bad input (every rank sees it alike), a failure while training.
constexpr int kExitUsage = 2;
constexpr int kExitRuntime = 3;

// "<program> [rank r]: error: <what>" on stderr.
void printError(const char* program, int rank, const std::string& what);

// kExitUsage for what the user can fix (InvalidArgument, NotFound, FailedPrecondition: a bad
// path, a corrupt or mismatching checkpoint), else kExitRuntime (a full disk, an I/O error).
int exitCodeOf(const hsdp::Status& s);

// A loss (the mean over the ranks) or global gradient norm that is not finite stops the run at
// that step (kOutOfRange naming the step and both values), unless --allow-nonfinite. Both values
// are global, so every rank reaches the same verdict: the loop ends it as an agreed failure.
[[nodiscard]] hsdp::Status checkFinite(bool allow_nonfinite, int step, double mean_loss,
                                       double grad_norm);

class Failure {
 public:
  // `world` gives the rank printed; `abort_through` ends the job (default: world; on a device the
  // NCCL world, whose abort stops in-flight kernels first).
  Failure(const char* program, const hsdp::Comm& world, hsdp::Comm& abort_through)
      : program_(program), rank_(world.rank()), abort_(abort_through) {}

  // Prints `s` and returns `code`: the caller returns it from main on every rank.
  int agreed(const hsdp::Status& s, int code) const;
  // Prints `s` and ends the whole job with kExitRuntime.
  [[noreturn]] void alone(const hsdp::Status& s) const;

 private:
  const char* program_;
  int rank_;
  hsdp::Comm& abort_;
};

}  // namespace examples
