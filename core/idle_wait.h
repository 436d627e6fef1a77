// Waiting without spinning. A rank that waits for a collective first spins briefly (the answer
// of a small message is often microseconds away), then sleeps in the kernel with a growing
// timeout, so that ranks sharing cores with computing ranks (8 ranks on 2 cores in the emulated
// cluster) leave the cores to them. Every wait loop of the library takes one IdleBackoff: the
// progress loop's ProgressiveWork::wait and the progress thread (core/progress.cc), and the UCX
// engine, which sleeps on its worker's event descriptor instead of a plain timer.
//
//   HSDP_WAIT_SPIN_US       microseconds of spinning (sched_yield between rounds) after the last
//                           progress before the first sleep (default 1000: Open MPI's
//                           nonblocking collectives move between rounds only inside MPI calls,
//                           which hsdp cannot see as progress; docs/collectives.md)
//   HSDP_WAIT_SLEEP_MIN_US  the first sleep (default 20); each sleep without progress is 1.25x
//                           the last
//   HSDP_WAIT_SLEEP_MAX_US  the longest sleep (default 1000; 0: never sleep, the old
//                           spin-and-yield)
//
// "Progress" is anything a transport saw move (a request completed, a UCX worker event, a work
// finished), reported through noteProgress(): a ring whose steps keep landing keeps its waiter
// spinning, so that only a wait on a peer that is not there yet sleeps.
#pragma once

#include <chrono>
#include <cstdint>

#include "hsdp/status.h"

namespace hsdp {

struct IdleWaitSettings {
  int64_t spin_us = 1000;
  int64_t sleep_min_us = 20;
  int64_t sleep_max_us = 1000;
};

// The settings from the environment, read once; a malformed value is an error naming it
// (mpi::Session::init reports it; a wait meanwhile uses the defaults).
StatusOr<IdleWaitSettings> idleWaitSettings();

// Something moved in some transport of this process (thread-safe, a relaxed counter).
void noteProgress();
uint64_t progressEpoch();

class IdleBackoff {
 public:
  IdleBackoff();
  // Something moved: spin again before the next sleep.
  void progressed();
  // progressed() if progressEpoch() moved since the last look; returns whether it did.
  bool sawProgress();
  // Nothing moved this round: the pause before the next round, in microseconds (0: spin, i.e.
  // just sched_yield). Grows while nothing moves.
  int64_t nextPauseUs();
  // nextPauseUs(), taken: sched_yield() while spinning, else nanosleep.
  void pause();

 private:
  IdleWaitSettings s_;
  std::chrono::steady_clock::time_point last_progress_;
  int64_t sleep_us_ = 0;  // the last sleep (0: none since the last progress)
  uint64_t epoch_ = 0;    // progressEpoch() at the last look
};

}  // namespace hsdp
