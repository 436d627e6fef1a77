#include "common/stopping.h"

#include <signal.h>

#include <cstdio>
#include <string>

#include "hsdp/stop.h"

namespace examples {

hsdp::Status installStopSignals() { return hsdp::installStopSignals({SIGTERM, SIGUSR1}); }

int stopExitCode(int signal) { return 128 + signal; }

hsdp::StatusOr<std::optional<int>> stopIfRequested(const char* program, hsdp::Comm& control,
                                                   const hsdp::Comm& world, Checkpoints& ckpt,
                                                   int steps_done) {
  HSDP_ASSIGN_OR_RETURN(int signal, hsdp::agreeStop(control));
  if (signal == 0) return std::optional<int>();
  HSDP_ASSIGN_OR_RETURN(std::string dir, ckpt.saveForStop(steps_done));
  if (world.rank() == 0) {
    const std::string name = hsdp::signalName(signal);
    if (dir.empty()) {
      std::printf("%s: stopped by %s after step %d; no checkpoint (no --save-dir)\n", program,
                  name.c_str(), steps_done);
    } else {
      const size_t slash = dir.find_last_of('/');
      std::printf("%s: stopped by %s after step %d; checkpoint %s in %s\n", program, name.c_str(),
                  steps_done, dir.substr(slash + 1).c_str(), dir.substr(0, slash).c_str());
    }
    std::fflush(stdout);
  }
  return std::optional<int>(stopExitCode(signal));
}

}  // namespace examples
