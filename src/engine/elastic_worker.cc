// ElasticGroup's replica worker (the gradient averages of a step, one after the other, on the
// peer-transport Comm) and the step's end: commit() waits for them, votes, and moves
// the group to Committed or Decided; applied() after the engine applied the step. The rest of
// the group (create, begin, the quorum's reads) is elastic_group.cc.
#include <algorithm>
#include <thread>  // std::this_thread::yield

#include "engine/elastic_group.h"
#include "engine/transition.h"

namespace hsdp::engine {

using G = GroupState;

ElasticGroup::~ElasticGroup() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stop_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();  // at most one watch wait (kWatchWaitMs)
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  // The alarm's thread calls into alarm_mu_/alarm_reason_, declared after alarm_ (so destroyed
  // before it): it is stopped first.
  alarm_.reset();
}

void ElasticGroup::workLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_
    std::span<float> g = queue_.front();
    queue_.pop_front();
    busy_ = true;
    const bool skip = !work_status_.ok();  // an average failed: the step fails anyway
    lock.unlock();
    Status st = skip ? okStatus() : average(g);
    // This rank saw the failure first: its sibling ranks may be waiting on a member that is
    // alive but stuck (the failed group's other ranks), so they are told to abort now.
    const uint64_t tag = attemptTag();
    if (!st.ok() && replica_.comm && alarm_tag_.load(std::memory_order_acquire) != tag && alarm_)
      alarm_->raise(tag, st.message());
    lock.lock();
    if (!st.ok() && work_status_.ok()) {
      work_status_ = st;
      work_culprits_ = suspects();
    }
    busy_ = false;
    cv_.notify_all();
  }
}

Status ElasticGroup::average(std::span<float> g) {
  // Polled, not waited: test() holds the progress lock briefly; the main thread's go on beside.
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, control_.peerAverage(*replica_.comm, g.data(), g.size()));
  const uint64_t tag = attemptTag();
  bool aborted = false;
  while (true) {
    if (!aborted && alarm_tag_.load(std::memory_order_acquire) == tag) {
      std::string why;
      {
        std::lock_guard<std::mutex> lock(alarm_mu_);
        why = alarm_reason_;
      }
      replica_.abort(strCat("the group's alarm: ", why));  // test() now ends with it
      aborted = true;
    }
    HSDP_ASSIGN_OR_RETURN(bool done, w->test());
    if (done) return okStatus();
    std::this_thread::yield();
  }
}

std::vector<int> ElasticGroup::suspects() const {
  return replica_.comm ? replica_.suspects() : std::vector<int>{};
}

Status ElasticGroup::startAverage(std::span<float> grad) {
  HSDP_RETURN_IF_ERROR(requireState(strCat("elastic group ", name_), state_, G::kInStep,
                                    "elastic gradient average", "beginStep first"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(grad);
  }
  cv_.notify_all();
  return okStatus();
}

StatusOr<bool> ElasticGroup::commit() {
  HSDP_RETURN_IF_ERROR(requireState(strCat("elastic group ", name_), state_, G::kInStep,
                                    "elastic step", "call beginStep() before step()"));
  Status local;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
    disarmWatch();  // the averages are done: nothing left for a gone member to stall
    local = work_status_;
    culprits_ = work_culprits_;
    work_status_ = okStatus();
    work_culprits_.clear();
  }
  // Committed until the engine applies the step; Decided when aborted, or when the vote itself
  // failed (the step is given up).
  StatusOr<bool> decided = voteAndDecide(local);
  const bool commit = decided.ok() && *decided;
  HSDP_RETURN_IF_ERROR(transition(commit ? G::kCommitted : G::kDecided, "elastic step"));
  if (!decided.ok()) return decided.status();
  if (!commit) {
    dropComms();
    return false;
  }
  committed_.step = q_.step;
  committed_.present = presentGroups();
  return true;
}

Status ElasticGroup::applied() {
  return transition(G::kDecided, "elastic step applied", "commit first");
}

}  // namespace hsdp::engine
