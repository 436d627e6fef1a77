// The watchdog: failures end the job cleanly and name their cause. Every rank runs it from
// mpi::Session::init on (docs/reliability.md):
//
//  - A wait that makes no progress for the timeout (HSDP_TIMEOUT_S, default 600 s) ends the job:
//    every live rank prints one line,
//      hsdp [rank 5]: timeout: reduce-scatter of unit "fc2" (shard group, inter level, seq 1841)
//      not complete after 600 s; not arrived: rank 2 (hsdp-node0, stopped for 601 s)
//    and the job exits with code 3 (kExitCode). A wait is any blocking point of a transport
//    (Work::wait, the blocking collectives) or of the engine (waitForUnshard, reshard, step);
//    WaitScope below lets any other wait (a checkpoint save, a user barrier) join in.
//  - Who did not arrive is known from a table every rank publishes: per communicator the
//    sequence number and fingerprint (operation, count, dtype, unit) of the last collective it
//    entered, in a node-local shared-memory segment that stays readable when a rank is stopped,
//    and served to other nodes by a small out-of-band TCP channel started at init, so a stopped
//    rank, a dead rank and a node whose link is cut are told apart.
//  - HSDP_CHECK_COLLECTIVES=1 compares every collective's fingerprint across its members before
//    it starts; a mismatch ends the job naming both ranks and what each entered.
//
// The unit name reaches the transports through a Label: transports know buffers, not units.
#pragma once

#include <optional>
#include <string_view>

#include "hsdp/status.h"

namespace hsdp {
class Work;  // hsdp/transport.h
}

namespace hsdp::watchdog {

// Exit code of a job ended by a timeout or a collective mismatch.
constexpr int kExitCode = 3;

struct Config {
  // Watchdog thread, fingerprints and the out-of-band channel. HSDP_WATCHDOG; default true.
  // Off: nothing is published and nothing times out (for measuring its cost).
  std::optional<bool> enabled;
  // Seconds a wait may go without progress before the job ends; > 0. HSDP_TIMEOUT_S (the old
  // HSDP_NCCL_TIMEOUT_S is read, with a warning, when it is unset); default 600.
  std::optional<double> timeout_s;
  // Compare every collective's fingerprint across its communicator before it starts (one small
  // all-gather per collective). HSDP_CHECK_COLLECTIVES; default false.
  std::optional<bool> check_collectives;
};

// `cfg` with every unset field from its HSDP_* variable, else its default. A value that is not a
// positive number of seconds (or not a boolean) is an InvalidArgument naming the variable.
StatusOr<Config> resolveConfig(Config cfg);

// The settings in effect (the resolved defaults before mpi::Session::init).
const Config& config();
// Changes the timeout of the running watchdog (EngineConfig::failure.timeout_s does this at
// ShardedModel::create); every rank must set the same value. InvalidArgument unless > 0.
[[nodiscard]] Status setTimeout(double seconds);
// True once the watchdog thread runs on this rank.
bool running();

// Collectives started on this thread while a Label lives carry its unit and group in their
// fingerprints (nested Labels stack). The engine labels every collective it starts with the
// unit's name and the group it runs over ("shard group", "replica").
class Label {
 public:
  Label(std::string_view unit, const char* group);
  ~Label();
  Label(const Label&) = delete;
  Label& operator=(const Label&) = delete;

 private:
  char saved_[64];  // the label this one replaced
};

// Marks the calling thread as waiting: the watchdog's clock for this thread runs from the start
// of the innermost wait (or the end of the last one inside it), so a long computation between
// waits never times out, and a wait that sees no collective complete for the timeout does.
// `what` and `detail` name the wait in the report ("save", "step 1200"); both must outlive the
// scope. Cheap: a few stores and a clock read (nothing while the watchdog is off).
class WaitScope {
 public:
  explicit WaitScope(const char* what, std::string_view detail = {});
  ~WaitScope();
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  friend class CommWait;
  bool active_;
  bool outer_;
};

// Waits for `work` while another rank does long local work inside a collective program (rank 0
// sampling, or training the single-process reference of --check, while the others wait for its
// verdict): polls work.test() every `poll_ms`, asleep in between (ranks sharing the working rank's
// cores leave them to it), and outside any WaitScope. This is the one way to mark such a wait as
// expected: the others' clocks do not run while the worker computes (a blocking collective there
// is ended by the timeout after HSDP_TIMEOUT_S, however healthy the worker). Nothing bounds this
// wait but the worker itself: a worker that exits ends the job (the launcher), one that hangs is
// not reported. Use it only around local work of bounded size.
[[nodiscard]] Status waitForPeerWork(Work& work, int poll_ms = 10);

}  // namespace hsdp::watchdog
