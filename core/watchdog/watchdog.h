// The watchdog module's internal interface (watchdog/, layer 1.5: on core, below the transports;
// the public side is hsdp/watchdog.h): what the transports call on every collective, what
// mpi::Session starts and stops, and how the job ends. Core's own waits (the progress loop)
// reach it through the observer start() installs (core/comm_observer.h).
//
// Transports (layer 2) own one CommTrace per communicator (Comm::trace()), made by traceComm()
// when the communicator is built, and route every collective through startCollective() (the
// nonblocking ones) or runCollective() (the blocking ones). Those publish the fingerprint
// (watch_table.h) and, with HSDP_CHECK_COLLECTIVES=1, compare it across the members first. Work
// waits open a CommWait so that a timeout report names the communicator and the sequence number.
//
// Cost on the hot path with checking off: one 96-byte record and two release stores per
// collective, a clock read and a few stores per wait (bench/hsdp_bench.cc measures it).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/comm_observer.h"
#include "core/watchdog/watch_table.h"
#include "hsdp/transport.h"
#include "hsdp/watchdog.h"

namespace hsdp {

using watchdog::CommSlot;
using watchdog::Fingerprint;
using watchdog::kRing;

// OpKind: core/comm_observer.h (Comm's calls report it through the hook).
const char* opKindName(OpKind kind);  // "all-gather", "reduce-scatter", ...

// A communicator's entry in the watchdog's table. Collectives on one communicator are entered
// by one thread at a time (the transports hold progressLock()).
class CommTrace {
 public:
  ~CommTrace();  // frees the table slot

  // Publishes the next collective with this thread's Label; returns its sequence number.
  uint64_t enter(OpKind kind, size_t count, DType dtype, RedOp op = RedOp::kSum, int root = -1,
                 int ops = 1);
  const Fingerprint& fingerprint(uint64_t seq) const;  // this rank's, while the ring holds it
  uint64_t entered() const { return seq_; }
  // When this rank last entered a collective here, as a count of all collectives it entered
  // (the report's guess of where a rank is stuck when the peers cannot be asked).
  uint64_t lastEnter() const { return last_enter_; }

  uint64_t id() const { return id_; }
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const { return members_; }  // world ranks, by comm rank
  std::string name() const;
  void setName(std::string name);

  // HSDP_CHECK_COLLECTIVES: the communicator the fingerprints are compared over (same members,
  // host memory, untraced); null when checking is off.
  Comm* checker() const { return checker_.get(); }
  const std::shared_ptr<Comm>& sharedChecker() const { return checker_; }
  // Checked collectives start in call order: the last sequence number started.
  uint64_t started = 0;

 private:
  friend StatusOr<std::shared_ptr<CommTrace>> traceComm(
      std::vector<int>, int, const std::function<StatusOr<std::shared_ptr<Comm>>()>&);
  CommTrace() = default;
  CommSlot* slot_ = nullptr;
  uint64_t id_ = 0;
  uint64_t seq_ = 0;
  uint64_t last_enter_ = 0;
  int rank_ = 0;
  std::vector<int> members_;
  std::string name_;
  std::shared_ptr<Comm> checker_;
};

// The trace of a communicator of the given members (world ranks, by communicator rank; `rank` is
// this rank's index among them). Local, no communication: members agree on the communicator's id
// because every one of them creates its communicators with the same member list in the same order
// (their creation is collective over a parent that holds them all). Null when the watchdog is
// off, for a communicator of one rank, or when this rank already traces kMaxComms communicators.
// `make_checker` is called only with checking on: the communicator the fingerprints are compared
// over (same members in the same order, host memory, its collectives issued only by the checks
// and in call order; it may be shared with the bootstrap's checks).
StatusOr<std::shared_ptr<CommTrace>> traceComm(
    std::vector<int> members, int rank,
    const std::function<StatusOr<std::shared_ptr<Comm>>()>& make_checker);
// The trace of a communicator built over `bootstrap` (its members, in its order): the members
// from the bootstrap's trace, the checks over the bootstrap's checker. Null when the bootstrap is
// untraced.
StatusOr<std::shared_ptr<CommTrace>> traceOver(Comm& bootstrap);

// With checking on: compares this rank's fingerprint of `seq` with every member's (an
// all-gather over t.checker()); a mismatch ends the job (watchdog::fatal) naming both ranks.
// checkedStart returns a Work that starts `start` once the comparison passed and every earlier
// collective of the communicator has started; checkNow blocks for the comparison and for them.
StatusOr<WorkHandle> checkedStart(CommTrace& t, uint64_t seq,
                                  std::function<StatusOr<WorkHandle>()> start);
Status checkNow(CommTrace& t, uint64_t seq);

// A nonblocking collective: the fingerprint is published and `start` runs at once; with checking
// on, `start` runs once every member's fingerprint of this call matched (the Work returned
// meanwhile starts it from the progress loop, in call order), so `start` must capture its
// arguments by value. `t` null (untraced): just `start`.
template <typename Start>
StatusOr<WorkHandle> startCollective(CommTrace* t, OpKind kind, size_t count, DType dtype, RedOp op,
                                     Start&& start) {
  if (t == nullptr) return start();
  const uint64_t seq = t->enter(kind, count, dtype, op);
  if (t->checker() == nullptr) return start();
  return checkedStart(*t, seq, std::function<StatusOr<WorkHandle>()>(std::forward<Start>(start)));
}

namespace watchdog {

// A transport's wait for collective `seq` of the communicator traced by `t` (t may be null).
class CommWait {
 public:
  CommWait(const CommTrace* t, uint64_t seq, const char* what);
  ~CommWait();
  CommWait(const CommWait&) = delete;
  CommWait& operator=(const CommWait&) = delete;

 private:
  WaitScope scope_;
  uint64_t prev_comm_;
  uint64_t prev_seq_;
};

}  // namespace watchdog

// A blocking collective: published, checked (blocking), then `run` inside a CommWait named
// `what` (the foreign call, e.g. "MPI_Allgather").
template <typename Run>
Status runCollective(CommTrace* t, OpKind kind, size_t count, DType dtype, RedOp op, int root,
                     const char* what, Run&& run) {
  uint64_t seq = 0;
  if (t != nullptr) {
    seq = t->enter(kind, count, dtype, op, root);
    if (t->checker() != nullptr) HSDP_RETURN_IF_ERROR(checkNow(*t, seq));
  }
  watchdog::CommWait wait(t, seq, what);
  return run();
}

namespace watchdog {

// Communicators created on this thread while an Untraced lives are not traced, and its waits
// are not watched: hsdp-bench measures the watchdog's cost with traced and untraced
// communicators side by side in one run.
class Untraced {
 public:
  Untraced();
  ~Untraced();
  Untraced(const Untraced&) = delete;
  Untraced& operator=(const Untraced&) = delete;

 private:
  bool prev_;
};
bool untracedHere();

// The calling thread's label, for schedules that start sub-operations later (possibly on the
// progress thread): capture at creation, restore around each issue.
struct LabelData {
  char unit[48];
  char group[16];
};
static_assert(sizeof(LabelData) <= 64);
LabelData currentLabel();
class LabelRestore {
 public:
  explicit LabelRestore(const LabelData& label);
  ~LabelRestore();

 private:
  LabelData saved_;
};

// mpi::Session: collective over `world` (exchanges addresses, maps the node's table, starts the
// threads); nothing when both the watchdog and checking are off. stop() joins the threads.
[[nodiscard]] Status start(Comm& world, const Config& cfg);
void stop();
// Whether collectives are traced (the watchdog or checking is on and start() ran).
bool tracing();

// Ends the job from any thread: prints `line` (one line, "hsdp [rank r]: ..."), tells every
// other rank (they print their own view), waits a few seconds at most until the others have
// printed, and exits with kExitCode. `reason` is the short cause the others quote.
[[noreturn]] void fatal(const std::string& line, const std::string& reason);

// "all-gather of unit "fc1" (1000 floats)", for reports and mismatch messages.
std::string describe(const Fingerprint& f);

// internal to watchdog/: the report of a timeout (watch_report.cc)
struct WaitInfo {
  bool waiting = false;
  double seconds = 0;    // since the wait started or last made progress
  std::string what;      // the outermost WaitScope ("waitForUnshard")
  std::string detail;    // its detail ("fc2")
  uint64_t comm_id = 0;  // the innermost CommWait's communicator (0: none)
  uint64_t seq = 0;
};
struct TraceInfo {
  uint64_t id = 0;
  std::string name;
  std::vector<int> members;
  uint64_t entered = 0;
  uint64_t last_enter = 0;
  Fingerprint ring[kRing];
};
struct JobView {
  std::vector<RankView> ranks;     // by world rank; state 'U' when its node did not answer
  std::vector<std::string> hosts;  // by world rank
};
std::string timeoutLine(int me, const WaitInfo& wait, const std::vector<TraceInfo>& traces,
                        const JobView& job, double timeout_s, const std::string& cause);

}  // namespace watchdog
}  // namespace hsdp
