// Process state the watchdog's files share (internal to watchdog/: watchdog.cc, checked.cc,
// watch_report.cc, watch_waits.cc). Nothing here is on a header that a transport includes.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/comm_observer.h"
#include "core/watchdog/watch_oob.h"
#include "core/watchdog/watchdog.h"

namespace hsdp::watchdog::detail {

// One group of ranks that share a table (a host), as every rank learned it at start().
struct Group {
  std::string host;
  std::vector<int> ranks;               // world ranks, ascending
  std::vector<oob::Address> addresses;  // every address of every member's server
};

struct State {
  Config cfg;     // resolved
  int rank = -1;  // world rank
  int world_size = 0;
  std::vector<int> group_of;  // world rank -> index into groups
  std::vector<Group> groups;
  int my_group = -1;
  int my_local = -1;                    // my slot in `table`
  GroupTable* table = nullptr;          // never unmapped: traces may outlive stop()
  std::unique_ptr<oob::Server> server;  // null when listening failed
  bool watching = false;                // the watchdog thread runs
  std::atomic<double> timeout_s{600};
  std::atomic<bool> stop{false};
  // The live traces, for reports; guarded by `mu`.
  std::mutex mu;
  std::vector<CommTrace*> traces;
  // Communicators created so far per member list (by its hash): part of their ids.
  std::map<uint64_t, uint64_t> comms_of_members;
};

// Null until start() ran with the watchdog or checking on.
State* state();

// Reads the whole job: this group from the table, every other group over the out-of-band
// channel (at most `timeout_ms`, groups in parallel); ranks of a group that did not answer get
// state 'U'.
JobView snapshot(int timeout_ms);
// Copies of this rank's live traces.
std::vector<TraceInfo> traceInfos();
// The calling thread's current Label.
const LabelData& threadLabel();
// The settings in effect (watch_waits.cc), and the thread that has waited longest now.
Config& mutableConfig();
WaitInfo longestWait(int64_t now);
// Whether WaitScopes record anything: on while the watchdog thread runs.
void setWatching(bool on);
// What start() installs as core's observer of waits and names (core/comm_observer.h).
CommObserver& observer();

constexpr int64_t kStaleMs = 3000;  // no heartbeat for this long: stopped

}  // namespace hsdp::watchdog::detail
