// Progress for operations that are state machines (rings, pipelined schedules): every in-flight
// ProgressiveWork of the process is on one list, and test() or wait() on any of them advances all
// (as MPI progresses every request inside any MPI call). So waiting on one handle never starves
// another, and a schedule whose next step this rank must issue is never stuck behind a wait on a
// different handle. Only one thread drives progress (the one that runs the collectives).
#pragma once

#include "hsdp/transport.h"

namespace hsdp {

class ProgressiveWork : public Work {
 public:
  // Final classes must call waitForDestruction() in their own destructor: advance() is theirs,
  // and the caller's buffers may still be in use by the operation.
  ~ProgressiveWork() override;
  Status wait() final;
  StatusOr<bool> test() final;
  bool done() const { return done_; }

  // Advances every in-flight operation of the process once; true if any completed. A call made
  // from inside advance() (a schedule testing its sub-operations) does nothing: the outer loop
  // advances every work, sub-operations included.
  static bool progressAll();

  // Complete without test(): for schedules checking their sub-operations from inside advance().
  static StatusOr<bool> isComplete(Work& w);

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
};

}  // namespace hsdp
