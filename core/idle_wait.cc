#include "core/idle_wait.h"

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>

#include "hsdp/env.h"

namespace hsdp {
namespace {

const env::IntParam kSpinUs{
    "HSDP_WAIT_SPIN_US", 1000, 0, 1000000,
    "Microseconds a wait for a collective spins (yielding the core between rounds) after its "
    "last progress before it starts sleeping in the kernel (core/idle_wait.h)."};
const env::IntParam kSleepMinUs{
    "HSDP_WAIT_SLEEP_MIN_US", 20, 1, 1000000,
    "A waiting rank's first sleep in microseconds once its spin is over; each sleep without "
    "progress is 1.25x the last, up to HSDP_WAIT_SLEEP_MAX_US."};
const env::IntParam kSleepMaxUs{
    "HSDP_WAIT_SLEEP_MAX_US", 1000, 0, 1000000,
    "The longest sleep of a waiting rank in microseconds (UCX: the timeout of its wait on the "
    "worker's event descriptor). 0: never sleep (spin and yield, as before), for ranks that own "
    "their cores."};

StatusOr<IdleWaitSettings> readSettings() {
  IdleWaitSettings s;
  HSDP_ASSIGN_OR_RETURN(s.spin_us, kSpinUs.value());
  HSDP_ASSIGN_OR_RETURN(s.sleep_min_us, kSleepMinUs.value());
  HSDP_ASSIGN_OR_RETURN(s.sleep_max_us, kSleepMaxUs.value());
  if (s.sleep_max_us > 0 && s.sleep_min_us > s.sleep_max_us)
    return invalidArgument("HSDP_WAIT_SLEEP_MIN_US=", s.sleep_min_us,
                           " is above HSDP_WAIT_SLEEP_MAX_US=", s.sleep_max_us);
  return s;
}

std::atomic<uint64_t> g_epoch{0};

}  // namespace

void noteProgress() { g_epoch.fetch_add(1, std::memory_order_relaxed); }
uint64_t progressEpoch() { return g_epoch.load(std::memory_order_relaxed); }

StatusOr<IdleWaitSettings> idleWaitSettings() {
  static const StatusOr<IdleWaitSettings> s = readSettings();
  return s;
}

IdleBackoff::IdleBackoff()
    : last_progress_(std::chrono::steady_clock::now()), epoch_(progressEpoch()) {
  static const IdleWaitSettings s = [] {
    StatusOr<IdleWaitSettings> r = idleWaitSettings();
    return r.ok() ? *r : IdleWaitSettings{};
  }();
  s_ = s;
}

void IdleBackoff::progressed() {
  last_progress_ = std::chrono::steady_clock::now();
  sleep_us_ = 0;
}

bool IdleBackoff::sawProgress() {
  const uint64_t e = progressEpoch();
  if (e == epoch_) return false;
  epoch_ = e;
  progressed();
  return true;
}

int64_t IdleBackoff::nextPauseUs() {
  if (s_.sleep_max_us == 0) return 0;
  if (sleep_us_ == 0) {
    const auto idle = std::chrono::steady_clock::now() - last_progress_;
    if (idle < std::chrono::microseconds(s_.spin_us)) return 0;
    sleep_us_ = s_.sleep_min_us;
  } else {
    // 1.25x, not 2x: a sleep overshoots the moment the wait could end by at most a quarter of
    // the time already slept (2x: all of it), and reaching 1 ms from 20 us still takes only ~18
    // wake-ups.
    sleep_us_ = std::min(s_.sleep_max_us, std::max(sleep_us_ + 1, sleep_us_ * 5 / 4));
  }
  return sleep_us_;
}

void IdleBackoff::pause() {
  const int64_t us = nextPauseUs();
  if (us == 0) {
    sched_yield();
    return;
  }
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  nanosleep(&ts, nullptr);
}

}  // namespace hsdp
