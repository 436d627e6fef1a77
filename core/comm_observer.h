// The hook between core and the watchdog: core's waits on a collective (ProgressiveWork::wait)
// and a traced communicator's renaming (Comm::setName) are reported to the observer that the
// watchdog (watchdog/, layer 1.5) installs when it starts.
//
// Why a hook and not an include: core is the ground every module stands on and includes nothing
// above it (scripts/check-layers); the watchdog stands on core (the progress loop, Comm) and so
// cannot be below it. The observer is registered at run time instead, like the transports.
// Cost: with no watchdog started the observer is null, and a wait costs one load and one branch.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "hsdp/transport.h"

namespace hsdp {

// What a collective is, in the watchdog's fingerprints (watchdog/watchdog.h: opKindName).
enum class OpKind : uint8_t {
  kAllGather = 1,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier,
  kGroup,
  kAllToAll
};

// One call of a traced communicator, as Comm's public calls (core/work.cc) report it.
struct TracedCall {
  OpKind kind;
  size_t count;
  DType dtype;
  RedOp op = RedOp::kSum;
  int root = -1;
  int ops = 1;                 // operations of a fused group
  bool compare_first = false;  // checks compare before the start (the transport's choice)
};

class CommObserver {
 public:
  // What the observer keeps for one wait, from waitBegin to waitEnd, on the waiting thread's
  // stack (the watchdog places its CommWait here: no allocation on the hot path).
  struct alignas(8) WaitState {
    unsigned char bytes[32];
  };
  // This thread starts waiting for collective `seq` of the communicator traced by `t` (null:
  // untraced); `what` names the wait and outlives it.
  virtual void waitBegin(const CommTrace* t, uint64_t seq, const char* what, WaitState& s) = 0;
  // The wait that filled `s` ended (same thread, in reverse order of the begins).
  virtual void waitEnd(WaitState& s) = 0;
  // Comm::setName of a traced communicator: the name its reports use.
  virtual void renamed(CommTrace& t, const std::string& name) = 0;
  // A nonblocking call of the communicator traced by `t`: its fingerprint is published and
  // `start` runs at once, or, with collective checks on, once every member's fingerprint matched
  // (blocking first with `compare_first`, else from the progress loop in call order: `start`
  // captures its arguments by value).
  virtual StatusOr<WorkHandle> startTraced(CommTrace& t, const TracedCall& call,
                                           std::function<StatusOr<WorkHandle>()> start) = 0;
  // A blocking call: published, checked, then `run` inside a wait named `what`.
  virtual Status runTraced(CommTrace& t, const TracedCall& call, const char* what,
                           const std::function<Status()>& run) = 0;

 protected:
  ~CommObserver() = default;  // never deleted through the hook: it lives as long as the process
};

// Installs the observer (not owned; it must outlive every wait and communicator): the
// watchdog's start(). Null uninstalls.
void setCommObserver(CommObserver* observer);
CommObserver* commObserver();

// A wait for a collective, reported to the observer in effect when it began (RAII).
class ObservedWait {
 public:
  ObservedWait(const CommTrace* t, uint64_t seq, const char* what) : observer_(commObserver()) {
    if (observer_ != nullptr) observer_->waitBegin(t, seq, what, state_);
  }
  ~ObservedWait() {
    if (observer_ != nullptr) observer_->waitEnd(state_);
  }
  ObservedWait(const ObservedWait&) = delete;
  ObservedWait& operator=(const ObservedWait&) = delete;

 private:
  CommObserver* observer_;
  CommObserver::WaitState state_;
};

}  // namespace hsdp
