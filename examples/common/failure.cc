#include "common/failure.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "hsdp/files.h"

namespace examples {

void printError(const char* program, int rank, const std::string& what) {
  // Escaped: a message that echoes a file never carries a control byte to the terminal.
  std::fprintf(stderr, "%s [rank %d]: error: %s\n", program, rank,
               hsdp::files::printable(what).c_str());
  std::fflush(stderr);
}

int exitCodeOf(const hsdp::Status& s) {
  const hsdp::StatusCode c = s.code();
  return c == hsdp::StatusCode::kInvalidArgument || c == hsdp::StatusCode::kNotFound ||
                 c == hsdp::StatusCode::kFailedPrecondition
             ? kExitUsage
             : kExitRuntime;
}

hsdp::Status checkFinite(bool allow_nonfinite, int step, double mean_loss, double grad_norm) {
  if (allow_nonfinite || (std::isfinite(mean_loss) && std::isfinite(grad_norm)))
    return hsdp::okStatus();
  return hsdp::outOfRange("step ", step + 1, ": the loss is ", mean_loss, " and the gradient norm ",
                          grad_norm,
                          " (not finite: a learning rate too large, or bad data); "
                          "stopping (--allow-nonfinite trains on)");
}

int Failure::agreed(const hsdp::Status& s, int code) const {
  printError(program_, rank_, s.toString());
  return code;
}

void Failure::alone(const hsdp::Status& s) const {
  printError(program_, rank_, s.toString());
  abort_.abortJob(kExitRuntime);
  std::abort();  // not reached: abortJob ends the process (the compiler cannot see through it)
}

}  // namespace examples
