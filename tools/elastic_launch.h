// hsdp-elastic's process side: start the replica groups of one elastic job, each its own MPI job
// (one mpirun or srun per group), watch them, restart a failed one, and stop them all (docs/
// elastic_launcher.md). The command line and the local etcd are hsdp_elastic.cc's; the
// environment contract with the engine is engine/elastic_env.h's.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace hsdp::elastic_launch {

enum class LauncherKind { kMpirun, kSrun };

struct Plan {
  int groups = 0;  // N
  int np = 0;      // ranks per group (K)
  std::string endpoint;
  std::string job;
  int max_restarts = 3;  // per group
  LauncherKind kind = LauncherKind::kMpirun;
  std::string launcher_path;  // absolute, found in PATH
  std::vector<std::string> launcher_args;
  std::vector<std::vector<std::string>> group_hosts;  // empty, or one host set per group
  std::vector<std::vector<std::string>> spare_hosts;  // taken in order by restarts
  double grace_s = 10;                                // SIGTERM, then SIGKILL after this
  std::vector<std::string> program;                   // program and its arguments
};

// The launcher's command line for a group on `hosts` (empty: the launcher's default). mpirun
// gets "-x NAME" for the contract's variables and every HSDP_* variable of this environment.
std::vector<std::string> groupCommand(const Plan& plan, const std::vector<std::string>& hosts);

// Catches SIGINT, SIGTERM and SIGHUP (and SIGCHLD, to wake the watcher) into a self-pipe, and
// makes this process the subreaper of its descendants, so that ranks orphaned by a launcher that
// died are still found and reaped. Call once, before anything is started.
bool installSignalHandlers();
// The first of SIGINT/SIGTERM/SIGHUP received so far, or 0.
int pendingSignal();

// Runs the groups until they end. `coordinator` is the local etcd's pid (-1: an etcd that is
// not ours): its exit ends the job. Returns the launcher's exit code: 0 when every group ended
// with 0; the code of the first group that gave up; 128+signal when stopped by a signal; 3 when
// a group could not be started or the local etcd exited. Every group started is gone on return.
int superviseGroups(const Plan& plan, pid_t coordinator);

}  // namespace hsdp::elastic_launch
