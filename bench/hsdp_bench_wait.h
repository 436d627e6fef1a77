// hsdp-bench --wait-cpu: the CPU a rank uses while it waits for a collective that a late peer
// joins. Rank 0 computes (a busy loop) for --wait-ms, then joins an all-reduce of -b bytes; the
// other ranks, started together with it after a barrier, read their process's CPU time
// (getrusage: every thread, the progress thread's and the transports' included) around the
// wait. One row per transport (--wait-transports mpi,ucx) and call (the nonblocking
// iallReduce + wait, the blocking allReduce); the medians over -n rounds of the waiters' mean
// and worst CPU share of the wait's wall time. --wait-max-cpu P: exit 1 when a round's worst
// waiter used more than P% of a core, --wait-min-sleeps S when one went to sleep (voluntary
// context switches, every thread) fewer than S times a second of its wait: a spinning wait,
// which a machine loaded by others can hide from the CPU bound (the ctests wait_cpu.*).
#pragma once

#include <string>

#include "hsdp/transport.h"

namespace hsdp_bench {

struct WaitCpuOptions {
  std::string transports = "mpi,ucx";
  int wait_ms = 2000;
  size_t bytes = 1 << 20;
  int rounds = 3;
  double max_cpu_percent = 0;   // 0: no bound
  double min_sleeps_per_s = 0;  // 0: no bound
};

// Collective over `world`; 0 when every bound held, 1 when one was exceeded, 2 on errors.
int waitCpuMain(const WaitCpuOptions& o, hsdp::Comm& world);

}  // namespace hsdp_bench
