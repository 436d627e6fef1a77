#include "core/progress.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/comm_observer.h"
#include "core/idle_wait.h"

namespace hsdp {
namespace {

// In start order. A work removes itself when destroyed; completed ones are dropped after a pass.
std::vector<ProgressiveWork*>& active() {
  static std::vector<ProgressiveWork*> list;
  return list;
}

bool g_in_progress = false;

// Threads inside ProgressiveWork::wait(): they advance every work themselves, so the progress
// thread stands back meanwhile instead of competing with them for the lock and the cores.
std::atomic<int> g_waiters{0};

std::recursive_mutex& stateMutex() {
  static std::recursive_mutex m;
  return m;
}

// The progress thread: it sleeps on `wake` while nothing is in flight (a new work bumps
// `generation` and notifies it), and otherwise takes a pass every `interval` under the state lock.
struct Thread {
  std::thread t;
  std::mutex m;  // guards `generation` and `stop` for `wake`; never taken inside the state lock
  std::condition_variable wake;
  uint64_t generation = 0;  // works started so far (while the thread runs)
  bool stop = false;
  std::chrono::microseconds interval{100};

  void run() {
    // While works are in flight: a pass every `interval`, longer (up to HSDP_WAIT_SLEEP_MAX_US)
    // while nothing moves, so that a collective waiting on a late peer costs no core.
    IdleBackoff backoff;
    for (;;) {
      uint64_t seen;
      {
        std::lock_guard<std::mutex> g(m);
        if (stop) return;
        seen = generation;  // read before looking at the list: a work started after the look
                            // has bumped it, so the wait below does not sleep through it
      }
      bool pending = false;
      if (g_waiters.load() > 0) {
        pending = true;  // a waiter is advancing everything; look again after the pause
      } else {
        auto lock = progressLock();
        pending = !active().empty();
        if (pending) ProgressiveWork::progressAll();
      }
      if (pending) {
        backoff.sawProgress();
        const auto pause = std::max(interval, std::chrono::microseconds(backoff.nextPauseUs()));
        std::unique_lock<std::mutex> l(m);
        if (wake.wait_for(l, pause, [&] { return stop || generation != seen; }))
          backoff.progressed();  // a new work: look at it soon
      } else {
        std::unique_lock<std::mutex> l(m);
        wake.wait(l, [&] { return stop || generation != seen; });
        backoff.progressed();
      }
    }
  }
};

Thread& thread() {
  static Thread t;
  return t;
}

std::atomic<bool> g_thread_running{false};

}  // namespace

std::unique_lock<std::recursive_mutex> progressLock() {
  return std::unique_lock<std::recursive_mutex>(stateMutex());
}

ProgressiveWork::ProgressiveWork() {
  {
    auto lock = progressLock();
    active().push_back(this);
  }
  if (g_thread_running.load()) {
    Thread& t = thread();
    {
      std::lock_guard<std::mutex> g(t.m);
      ++t.generation;
    }
    t.wake.notify_one();
  }
}

ProgressiveWork::~ProgressiveWork() {
  auto lock = progressLock();
  auto& a = active();
  a.erase(std::remove(a.begin(), a.end(), this), a.end());
}

void ProgressiveWork::finish(Status s) {
  status_ = std::move(s);
  done_ = true;
  noteProgress();
}

bool ProgressiveWork::progressAll() {
  auto lock = progressLock();
  if (g_in_progress) return false;
  g_in_progress = true;
  bool any = false;
  auto& a = active();
  // Index loop over the live list: works started during the pass are appended (and advanced in
  // this pass), works destroyed during it remove themselves.
  for (size_t i = 0; i < a.size(); ++i) {
    ProgressiveWork* w = a[i];
    if (w->done_) continue;
    w->advance();
    any = any || w->done_;
  }
  a.erase(std::remove_if(a.begin(), a.end(), [](ProgressiveWork* w) { return w->done_; }), a.end());
  g_in_progress = false;
  return any;
}

StatusOr<bool> ProgressiveWork::isComplete(Work& w) {
  if (auto* p = dynamic_cast<ProgressiveWork*>(&w)) {
    auto lock = progressLock();
    if (p->done_ && !p->status_.ok()) return p->status_;
    return p->done_;
  }
  return w.test();  // another transport's work: it progresses itself
}

Status ProgressiveWork::wait() {
  ObservedWait watched(trace_, trace_seq_, "wait");
  g_waiters.fetch_add(1);
  struct Leave {
    ~Leave() { g_waiters.fetch_sub(1); }
  } leave;
  // Spins while the transports report progress, then sleeps (core/idle_wait.h): ranks may
  // outnumber cores (virtual nodes), and the peers we wait for need them.
  IdleBackoff backoff;
  for (;;) {
    {
      auto lock = progressLock();
      if (done_) return status_;
      if (g_in_progress) {
        advance();  // nested inside a pass: only this work can move here
        continue;
      }
      if (progressAll() || done_) continue;  // something completed: look again at once
    }
    backoff.sawProgress();
    backoff.pause();
  }
}

StatusOr<bool> ProgressiveWork::test() {
  auto lock = progressLock();
  if (!done_) progressAll();
  if (done_ && !status_.ok()) return status_;
  return done_;
}

namespace progress_thread {

void start(int interval_us) {
  if (g_thread_running.exchange(true)) return;
  Thread& t = thread();
  t.interval = std::chrono::microseconds(std::max(1, interval_us));
  {
    std::lock_guard<std::mutex> g(t.m);
    t.stop = false;
  }
  t.t = std::thread([&t] { t.run(); });
}

void stop() {
  if (!g_thread_running.exchange(false)) return;
  Thread& t = thread();
  {
    std::lock_guard<std::mutex> g(t.m);
    t.stop = true;
  }
  t.wake.notify_one();
  t.t.join();
}

bool running() { return g_thread_running.load(); }

}  // namespace progress_thread

}  // namespace hsdp
