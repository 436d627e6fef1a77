// ElasticGroup's abort watch (elastic_group.h): survivors stop waiting for a member the
// coordinator already knows is gone. Rank 0 of each group watches the job's member keys
// (elastic/member_watch.h); when a member of the step's quorum ended while the step's averages
// may still run, it raises the group's alarm for that attempt (group_alarm.h): its own replica
// worker and its sibling ranks' abort the average at once, the group votes fail, and the next
// attempt's quorum is built without the gone member. Without the watch they wait for the
// replica transport's deadline (HSDP_REPLICA_TIMEOUT_MS).
#include <chrono>

#include "engine/elastic_group.h"
#include "hsdp/log.h"

namespace hsdp::engine {
namespace {

// One watch request's wait: the bound on how late the destructor joins the watcher.
constexpr int64_t kWatchWaitMs = 500;
// Ends kept for a quorum armed after they were seen (a member gone while begin() ran).
constexpr size_t kEndsKept = 256;

}  // namespace

void ElasticGroup::noteAlarm(uint64_t tag, const std::string& why) {
  std::lock_guard<std::mutex> lock(alarm_mu_);
  alarm_reason_ = why;
  alarm_tag_.store(tag, std::memory_order_release);
}

uint64_t ElasticGroup::endedLocked(std::string* why) {
  if (watch_tag_ == 0) return 0;
  for (const elastic::Member& m : watch_members_)
    for (const elastic::MemberEnd& e : ended_)
      if (e.ends(m)) {
        *why = strCat("the coordinator: group ", m.group, " (incarnation ", m.incarnation,
                      ") is gone (its member key ", e.keep ? "replaced" : "deleted",
                      " at revision ", e.revision, ")");
        const uint64_t tag = watch_tag_;
        watch_tag_ = 0;
        return tag;
      }
  return 0;
}

void ElasticGroup::armWatch() {
  if (!watch_) return;
  std::string why;
  uint64_t tag = 0;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_tag_ = attemptTag();
    watch_members_.clear();
    for (const elastic::Member& m : q_.members)
      if (m.group != name_) watch_members_.push_back(m);
    tag = endedLocked(&why);
  }
  if (tag == 0) return;
  HSDP_WARN(kShard, "elastic: ", name_, " step ", q_.step, " attempt ", q_.attempt, ": ", why);
  noteAlarm(tag, why);
  if (alarm_) alarm_->raise(tag, why);
}

void ElasticGroup::disarmWatch() {
  if (!watch_) return;
  std::lock_guard<std::mutex> lock(watch_mu_);
  watch_tag_ = 0;
}

void ElasticGroup::watchLoop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      if (watch_stop_) return;
    }
    StatusOr<std::vector<elastic::MemberEnd>> ends = watch_->next(kWatchWaitMs);
    if (!ends.ok()) {
      HSDP_INFO(kShard, "elastic: the abort watch: ", ends.status().message());
      std::unique_lock<std::mutex> lock(watch_mu_);
      watch_cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return watch_stop_; });
      continue;
    }
    std::string why;
    uint64_t tag = 0;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      for (elastic::MemberEnd& e : *ends) {
        ended_.push_back(std::move(e));
        if (ended_.size() > kEndsKept) ended_.pop_front();
      }
      tag = endedLocked(&why);
    }
    if (tag == 0) continue;
    HSDP_WARN(kShard, "elastic: ", name_, ": ", why, "; the attempt's averages are aborted");
    noteAlarm(tag, why);
    if (alarm_) alarm_->raise(tag, why);
  }
}

}  // namespace hsdp::engine
