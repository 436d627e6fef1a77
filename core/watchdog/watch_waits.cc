// The watchdog's settings, labels and waits: what every thread touches on the hot path (a
// Label around each engine collective, a WaitScope around each wait), apart from the watchdog's
// own life (watchdog.cc).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/watchdog/watchdog_state.h"
#include "hsdp/env.h"
#include "hsdp/log.h"

namespace hsdp::watchdog {

// ---- settings ----------------------------------------------------------------------------------

namespace detail {
Config& mutableConfig() {
  static Config c = [] {
    Config d;
    d.enabled = true;
    d.timeout_s = 600;
    d.check_collectives = false;
    return d;
  }();
  return c;
}
}  // namespace detail

namespace {

Config& current() { return detail::mutableConfig(); }

const env::BoolParam kWatchdog{
    "HSDP_WATCHDOG", true,
    "The watchdog: fingerprints of every collective in a node-local table, the out-of-band TCP "
    "channel and the timeout. 0 turns all of it off (for measuring its cost; then nothing bounds "
    "a wait)."};
const env::BoolParam kCheckCollectives{
    "HSDP_CHECK_COLLECTIVES", false,
    "Compare every collective's fingerprint (sequence number, operation, count, dtype, "
    "communicator, unit) across its members before it starts (one small all-gather each); a "
    "mismatch prints both ranks' collectives on every rank and ends the job with exit 3."};
const env::NumberParam kTimeout{
    "HSDP_TIMEOUT_S", "600", "a positive number of seconds",
    "Seconds a wait (a collective, or the engine's unshard / reduceGrad / step waits) may go "
    "without progress before the watchdog ends the job: every live rank prints one line naming "
    "the collective, its communicator and sequence number and the ranks that did not arrive "
    "(stopped, gone, unreachable), and the job exits with code 3. Every transport. A positive "
    "number (fractions allowed); also EngineConfig::failure.timeout_s. docs/reliability.md."};
const env::IntParam kNcclTimeout{
    "HSDP_NCCL_TIMEOUT_S", env::Unset{""}, 0, 604800,
    "Deprecated: read as HSDP_TIMEOUT_S (with a warning) when that is unset; 0 meant no "
    "timeout."};

}  // namespace

StatusOr<Config> resolveConfig(Config cfg) {
  if (!cfg.enabled) {
    HSDP_ASSIGN_OR_RETURN(cfg.enabled, kWatchdog.get());
  }
  if (!cfg.check_collectives) {
    HSDP_ASSIGN_OR_RETURN(cfg.check_collectives, kCheckCollectives.get());
  }
  if (!cfg.timeout_s) {
    HSDP_ASSIGN_OR_RETURN(std::optional<double> t, kTimeout.get());
    if (t) {
      cfg.timeout_s = *t;
    } else if (kNcclTimeout.isSet()) {
      // The old NCCL-only name: an integer, 0 meaning no timeout.
      HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> s, kNcclTimeout.get());
      static bool warned = false;
      if (!warned) {
        HSDP_WARN(kInit, "HSDP_NCCL_TIMEOUT_S is deprecated: it now sets HSDP_TIMEOUT_S, the ",
                  "timeout of every transport; use HSDP_TIMEOUT_S");
        warned = true;
      }
      cfg.timeout_s = *s > 0 ? static_cast<double>(*s) : HUGE_VAL;
    } else {
      cfg.timeout_s = 600;
    }
  } else if (!(*cfg.timeout_s > 0)) {
    return invalidArgument("watchdog timeout_s=", *cfg.timeout_s, " must be > 0");
  }
  return cfg;
}

const Config& config() { return current(); }

Status setTimeout(double seconds) {
  if (!(seconds > 0))
    return invalidArgument("watchdog timeout ", seconds, " s must be a positive number");
  current().timeout_s = seconds;
  if (detail::State* s = detail::state()) s->timeout_s.store(seconds);
  return okStatus();
}

// ---- labels ------------------------------------------------------------------------------------

namespace {
thread_local LabelData t_label = {};

void copyField(char* dst, size_t cap, std::string_view s) {
  const size_t n = std::min(cap - 1, s.size());
  if (n > 0) std::memcpy(dst, s.data(), n);  // an empty view may have no data() at all
  std::memset(dst + n, 0, cap - n);
}
}  // namespace

Label::Label(std::string_view unit, const char* group) {
  static_assert(sizeof(saved_) >= sizeof(LabelData));
  std::memcpy(saved_, &t_label, sizeof(LabelData));
  copyField(t_label.unit, sizeof t_label.unit, unit);
  copyField(t_label.group, sizeof t_label.group, group ? group : "");
}
Label::~Label() { std::memcpy(&t_label, saved_, sizeof(LabelData)); }

LabelData currentLabel() { return t_label; }
LabelRestore::LabelRestore(const LabelData& label) : saved_(t_label) { t_label = label; }
LabelRestore::~LabelRestore() { t_label = saved_; }

namespace detail {
const LabelData& threadLabel() { return t_label; }
}  // namespace detail

// ---- waits -------------------------------------------------------------------------------------

namespace {

// A short string in relaxed atomic words: the seqlock's data (plain chars written by one thread
// while another reads them would be a data race, however the version check turns out).
constexpr int kFieldWords = 6;  // 47 characters and the terminator
struct AtomicField {
  std::atomic<uint64_t> w[kFieldWords] = {};
  void store(std::string_view s) {
    char buf[kFieldWords * 8] = {};
    const size_t n = std::min(sizeof buf - 1, s.size());
    if (n > 0) std::memcpy(buf, s.data(), n);
    for (int k = 0; k < kFieldWords; ++k) {
      uint64_t v;
      std::memcpy(&v, buf + 8 * k, 8);
      w[k].store(v, std::memory_order_relaxed);
    }
  }
  std::string load() const {
    char buf[kFieldWords * 8];
    for (int k = 0; k < kFieldWords; ++k) {
      const uint64_t v = w[k].load(std::memory_order_relaxed);
      std::memcpy(buf + 8 * k, &v, 8);
    }
    return std::string(buf, strnlen(buf, sizeof buf - 1));
  }
};

// One waiting thread. The owner writes; the watchdog thread reads. The descriptive fields are
// written under a sequence count (odd while writing) and read only after a long wait.
struct ThreadWait {
  std::atomic<bool> used{false};
  std::atomic<int64_t> since_ns{0};  // last start or end of a wait inside the outermost one
  std::atomic<int> depth{0};
  std::atomic<uint32_t> version{0};
  AtomicField what;
  AtomicField detail;
  std::atomic<uint64_t> comm_id{0};
  std::atomic<uint64_t> seq{0};
};
constexpr int kMaxThreads = 64;
ThreadWait g_waits[kMaxThreads];
thread_local ThreadWait* t_wait = nullptr;

std::atomic<bool> g_watching{false};  // the watchdog thread reads the slots
thread_local bool t_untraced = false;

ThreadWait* myWait() {
  if (t_wait != nullptr) return t_wait;
  for (ThreadWait& w : g_waits) {
    bool expected = false;
    if (w.used.compare_exchange_strong(expected, true)) {
      t_wait = &w;
      return t_wait;
    }
  }
  static ThreadWait overflow;  // more than 64 waiting threads: shared, best effort
  t_wait = &overflow;
  return t_wait;
}

}  // namespace

Untraced::Untraced() : prev_(t_untraced) { t_untraced = true; }
Untraced::~Untraced() { t_untraced = prev_; }
bool untracedHere() { return t_untraced; }

namespace detail {
void setWatching(bool on) { g_watching.store(on); }
}  // namespace detail

WaitScope::WaitScope(const char* what, std::string_view detail)
    : active_(g_watching.load(std::memory_order_relaxed) && !t_untraced), outer_(false) {
  if (!active_) return;
  ThreadWait* w = myWait();
  const int d = w->depth.fetch_add(1, std::memory_order_relaxed);
  outer_ = d == 0;
  if (outer_) {
    // The seqlock's writer: odd while writing (the acquire half keeps the stores below after
    // it), even again after (release: the stores before it).
    w->version.fetch_add(1, std::memory_order_acq_rel);
    w->what.store(what ? what : "");
    w->detail.store(detail);
    w->version.fetch_add(1, std::memory_order_release);
  }
  w->since_ns.store(monotonicNs(), std::memory_order_release);
}

WaitScope::~WaitScope() {
  if (!active_) return;
  ThreadWait* w = t_wait;
  // The end of a wait is progress: the clock restarts for the wait around it.
  if (outer_) {
    w->since_ns.store(0, std::memory_order_release);
    w->comm_id.store(0, std::memory_order_relaxed);
  } else {
    w->since_ns.store(monotonicNs(), std::memory_order_release);
  }
  w->depth.fetch_sub(1, std::memory_order_relaxed);
}

CommWait::CommWait(const CommTrace* t, uint64_t seq, const char* what)
    : scope_(what), prev_comm_(0), prev_seq_(0) {
  if (!scope_.active_) return;
  ThreadWait* w = t_wait;
  prev_comm_ = w->comm_id.load(std::memory_order_relaxed);
  prev_seq_ = w->seq.load(std::memory_order_relaxed);
  if (t != nullptr) {
    w->seq.store(seq, std::memory_order_relaxed);
    w->comm_id.store(t->id(), std::memory_order_release);
  }
}

CommWait::~CommWait() {
  if (!scope_.active_) return;
  ThreadWait* w = t_wait;
  w->comm_id.store(prev_comm_, std::memory_order_relaxed);
  w->seq.store(prev_seq_, std::memory_order_relaxed);
}

// ---- core's hook -------------------------------------------------------------------------------

namespace detail {
namespace {

// The watchdog's side of core/comm_observer.h: a wait of core's progress loop is a CommWait
// (built in the caller's WaitState, so the hot path allocates nothing), a traced communicator's
// new name goes to its trace. Trivially destructible: it outlives every wait, even at exit.
class Observer final : public CommObserver {
 public:
  void waitBegin(const CommTrace* t, uint64_t seq, const char* what, WaitState& s) override {
    static_assert(sizeof(CommWait) <= sizeof(WaitState::bytes) &&
                  alignof(CommWait) <= alignof(WaitState));
    new (s.bytes) CommWait(t, seq, what);
  }
  void waitEnd(WaitState& s) override {
    std::launder(reinterpret_cast<CommWait*>(s.bytes))->~CommWait();
  }
  void renamed(CommTrace& t, const std::string& name) override { t.setName(name); }
  StatusOr<WorkHandle> startTraced(CommTrace& t, const TracedCall& c,
                                   std::function<StatusOr<WorkHandle>()> start) override {
    const uint64_t seq = t.enter(c.kind, c.count, c.dtype, c.op, c.root, c.ops);
    if (t.checker() == nullptr) return start();
    if (c.compare_first) {
      HSDP_RETURN_IF_ERROR(checkNow(t, seq));
      return start();
    }
    return checkedStart(t, seq, std::move(start));
  }
  Status runTraced(CommTrace& t, const TracedCall& c, const char* what,
                   const std::function<Status()>& run) override {
    return runCollective(&t, c.kind, c.count, c.dtype, c.op, c.root, what, run);
  }
};
Observer g_observer;

}  // namespace

CommObserver& observer() { return g_observer; }

}  // namespace detail

namespace detail {

// The longest-waiting thread (or none).
WaitInfo longestWait(int64_t now) {
  WaitInfo best;
  for (ThreadWait& w : g_waits) {
    if (!w.used.load(std::memory_order_relaxed) || w.depth.load() == 0) continue;
    const int64_t since = w.since_ns.load(std::memory_order_acquire);
    if (since == 0) continue;
    const double s = (now - since) * 1e-9;
    if (best.waiting && s <= best.seconds) continue;
    WaitInfo info;
    info.waiting = true;
    info.seconds = s;
    for (int tries = 0; tries < 100; ++tries) {
      const uint32_t v0 = w.version.load(std::memory_order_acquire);
      if (v0 & 1) continue;
      info.what = w.what.load();
      info.detail = w.detail.load();
      std::atomic_thread_fence(std::memory_order_acquire);  // the loads above before the check
      if (w.version.load(std::memory_order_relaxed) == v0) break;
    }
    info.comm_id = w.comm_id.load(std::memory_order_acquire);
    info.seq = w.seq.load(std::memory_order_relaxed);
    best = info;
  }
  return best;
}

}  // namespace detail

}  // namespace hsdp::watchdog
