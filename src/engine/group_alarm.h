// Internal to the engine: the alarm of an elastic group's ranks (docs/elastic.md, "The group's
// alarm"). Every rank of a replica group runs the replica level with its same-position ranks of
// the other groups, each on its own. When a rank of group A dies, its sibling ranks in A stay
// alive for a while (until mpirun ends them) and stuck in A's own collectives; the other groups'
// ranks facing the dead rank see its endpoint fail at once, but those facing a live sibling
// would wait for it until the replica deadline. So a rank whose average failed raises the
// alarm: it tells every other rank of its own group, which abort their average of the same
// attempt at once, and the group votes fail together, naming the suspect.
//
// One TCP listener per rank (core/socket.h), its address all-gathered over the group's control
// plane; one thread that accepts an alarm (an attempt tag and a reason) and hands it to the
// owner. raise() is best effort, bounded: a sibling that cannot be reached within the deadline
// is skipped (it is then the one that failed).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/socket.h"
#include "engine/unit_collectives.h"
#include "hsdp/status.h"

namespace hsdp::engine {

class GroupAlarm {
 public:
  // Called on the alarm's thread with the tag and the reason the sender gave.
  using Handler = std::function<void(uint64_t tag, const std::string& reason)>;

  // Collective over the group's control plane: opens this rank's listener on `host` and learns
  // every other rank's.
  static StatusOr<std::unique_ptr<GroupAlarm>> create(UnitCollectives& control,
                                                      const std::string& host, Handler handler);
  ~GroupAlarm();
  GroupAlarm(const GroupAlarm&) = delete;
  GroupAlarm& operator=(const GroupAlarm&) = delete;

  // Tells every other rank of the group: `tag` (which attempt), `reason` (at most 1 KiB kept).
  // Returns how many were told; each connection and write is bounded by `deadline_ms`.
  int raise(uint64_t tag, const std::string& reason, int64_t deadline_ms = 500);
  // How many alarms this rank received (tests, logs).
  int64_t received() const { return received_.load(std::memory_order_relaxed); }

 private:
  GroupAlarm() = default;
  void serve();

  int rank_ = 0;
  std::vector<sockaddr_in> peers_;  // every rank's listener, by control rank
  net::Fd listener_;
  net::Fd wake_[2];  // a pipe: the destructor writes, serve() returns
  Handler handler_;
  std::atomic<int64_t> received_{0};
  std::thread thread_;
};

}  // namespace hsdp::engine
