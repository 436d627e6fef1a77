// Progress for operations that are state machines (rings, pipelined schedules): every in-flight
// ProgressiveWork of the process is on one list, and test() or wait() on any of them advances all
// (as MPI progresses every request inside any MPI call). So waiting on one handle never starves
// another, and a schedule whose next step this rank must issue is never stuck behind a wait on a
// different handle.
//
// Between hsdp calls nothing advances, unless the progress thread runs (HSDP_PROGRESS_THREAD=1,
// started by mpi::Session): it advances the list every HSDP_PROGRESS_INTERVAL_US while anything
// is in flight (backing off to HSDP_WAIT_SLEEP_MAX_US while nothing moves, core/idle_wait.h),
// so a gather prefetched before a layer's compute moves during that compute. Two threads then
// touch the communication state, so every entry point of a transport (MpiComm, UcxComm and their
// works) and of the hierarchical schedules holds progressLock(), and MPI runs at
// MPI_THREAD_MULTIPLE (the user's own MPI calls may overlap the thread's).
#pragma once

#include <mutex>

#include "hsdp/transport.h"

namespace hsdp {

// Serialises hsdp's communication state between the caller's threads and the progress thread.
// Recursive: entry points call each other (a schedule's advance() starts sub-collectives).
std::unique_lock<std::recursive_mutex> progressLock();

class ProgressiveWork : public Work {
 public:
  // Final classes must call waitForDestruction() in their own destructor: advance() is theirs,
  // and the caller's buffers may still be in use by the operation.
  ~ProgressiveWork() override;
  Status wait() final;
  StatusOr<bool> test() final;
  // Complete, without advancing anything (read it under progressLock() while the thread runs).
  bool done() const { return done_; }

  // Advances every in-flight operation of the process once; true if any completed. A call made
  // from inside advance() (a schedule testing its sub-operations) does nothing: the outer loop
  // advances every work, sub-operations included.
  static bool progressAll();

  // Complete without test(): for schedules checking their sub-operations from inside advance().
  static StatusOr<bool> isComplete(Work& w);

  // The collective this work is, for the watchdog's report of a wait on it (core/comm_observer.h).
  void watchAs(const CommTrace* t, uint64_t seq) {
    trace_ = t;
    trace_seq_ = seq;
  }

 protected:
  ProgressiveWork();
  // One non-blocking step of this operation; calls finish() when complete.
  virtual void advance() = 0;
  void finish(Status s);
  void waitForDestruction() {
    if (!done_) (void)wait();
  }

 private:
  Status status_;
  bool done_ = false;
  const CommTrace* trace_ = nullptr;
  uint64_t trace_seq_ = 0;
};

// The progress thread. start() is idempotent; stop() joins it (mpi::Session calls it before
// MPI_Finalize). interval_us: pause between passes while works are in flight.
namespace progress_thread {
void start(int interval_us);
void stop();
bool running();
}  // namespace progress_thread

}  // namespace hsdp
