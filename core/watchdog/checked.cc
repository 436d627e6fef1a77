// Traced communicators: their table entries (CommTrace), the fingerprint of every collective, and
// HSDP_CHECK_COLLECTIVES, which compares the fingerprints across the members before a collective
// starts.
#include <sched.h>

#include <algorithm>
#include <cstring>

#include "core/progress.h"
#include "core/watchdog/watchdog_state.h"
#include "hsdp/log.h"

namespace hsdp {

using watchdog::kMaxComms;
using watchdog::RankSlot;
using watchdog::detail::State;

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllGather:
      return "all-gather";
    case OpKind::kReduceScatter:
      return "reduce-scatter";
    case OpKind::kAllReduce:
      return "all-reduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kGroup:
      return "group";
    case OpKind::kAllToAll:
      return "all-to-all";
  }
  return "collective";
}

// ---- the trace ---------------------------------------------------------------------------------

StatusOr<std::shared_ptr<CommTrace>> traceComm(
    std::vector<int> members, int rank,
    const std::function<StatusOr<std::shared_ptr<Comm>>()>& make_checker) {
  State* s = watchdog::detail::state();
  if (s == nullptr || members.size() < 2 || watchdog::untracedHere())
    return std::shared_ptr<CommTrace>();
  // The id: the member list's hash, and how many communicators of exactly these members this
  // rank created before (the same count on every member, see the header).
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int m : members) {
    h ^= static_cast<uint64_t>(static_cast<uint32_t>(m));
    h *= 1099511628211ull;
  }
  const uint64_t nth = s->comms_of_members[h]++;
  uint64_t id = h ^ ((nth + 1) * 0x9e3779b97f4a7c15ull);
  if (id == 0) id = 1;
  std::shared_ptr<CommTrace> t(new CommTrace());
  t->members_ = std::move(members);
  t->id_ = id;
  t->rank_ = rank;
  if (*s->cfg.check_collectives) {
    HSDP_ASSIGN_OR_RETURN(t->checker_, make_checker());
  }
  RankSlot& slot = s->table->slot(s->my_local);
  for (CommSlot& c : slot.comms) {
    if (c.id.load(std::memory_order_relaxed) != 0) continue;
    for (Fingerprint& f : c.ring) f = Fingerprint();
    c.entered.store(0, std::memory_order_relaxed);
    c.id.store(id, std::memory_order_release);
    t->slot_ = &c;
    break;
  }
  if (t->slot_ == nullptr) {
    static bool warned = false;
    if (!warned)
      HSDP_WARN(kColl, "watchdog: more than ", kMaxComms,
                " communicators at once; the newer ones go untraced");
    warned = true;
    return std::shared_ptr<CommTrace>();
  }
  std::lock_guard<std::mutex> lock(s->mu);
  s->traces.push_back(t.get());
  return t;
}

StatusOr<std::shared_ptr<CommTrace>> traceOver(Comm& bootstrap) {
  CommTrace* boot = bootstrap.trace();
  if (boot == nullptr) return std::shared_ptr<CommTrace>();
  return traceComm(boot->members(), bootstrap.rank(),
                   [boot]() -> StatusOr<std::shared_ptr<Comm>> { return boot->sharedChecker(); });
}

CommTrace::~CommTrace() {
  State* s = watchdog::detail::state();
  if (s == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->traces.erase(std::remove(s->traces.begin(), s->traces.end(), this), s->traces.end());
  }
  if (slot_ != nullptr) slot_->id.store(0, std::memory_order_release);
}

namespace {
std::atomic<uint64_t> g_enters{0};  // collectives this rank entered, on all communicators
}  // namespace

uint64_t CommTrace::enter(OpKind kind, size_t count, DType dtype, RedOp op, int root, int ops) {
  const uint64_t s = ++seq_;
  last_enter_ = g_enters.fetch_add(1, std::memory_order_relaxed) + 1;
  Fingerprint& f = slot_->ring[s % kRing];
  // Readers take a record only when its seq reads back the same before and after the copy.
  std::atomic_ref<uint64_t> seq(f.seq);
  seq.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  f.comm_id = id_;
  f.count = count;
  f.root = root;
  f.kind = static_cast<uint8_t>(kind);
  f.dtype = static_cast<uint8_t>(dtype);
  f.redop = static_cast<uint8_t>(op);
  f.ops = static_cast<uint8_t>(std::min(ops, 255));
  const watchdog::LabelData& l = watchdog::detail::threadLabel();
  std::memcpy(f.unit, l.unit, sizeof f.unit);
  std::memcpy(f.group, l.group, sizeof f.group);
  seq.store(s, std::memory_order_release);
  slot_->entered.store(s, std::memory_order_release);
  return s;
}

const Fingerprint& CommTrace::fingerprint(uint64_t seq) const { return slot_->ring[seq % kRing]; }

namespace {
// Why a lock: names are set by the training thread and read by the watchdog thread's report.
std::mutex& nameMutex() {
  static std::mutex m;
  return m;
}
}  // namespace

std::string CommTrace::name() const {
  std::lock_guard<std::mutex> lock(nameMutex());
  return name_;
}

void CommTrace::setName(std::string name) {
  std::lock_guard<std::mutex> lock(nameMutex());
  name_ = std::move(name);
}

// ---- HSDP_CHECK_COLLECTIVES ---------------------------------------------------------------------

namespace {

// Every member's fingerprint of one collective against the others'. When they differ every
// member sees the same table and reaches the same verdict, so each prints it and the job ends.
void verify(const CommTrace& t, uint64_t seq, const std::vector<Fingerprint>& all) {
  const int n = static_cast<int>(all.size());
  // The reference is the fingerprint most members hold (ties: the lowest rank's).
  int ref = 0, best = 0;
  for (int q = 0; q < n; ++q) {
    int same = 0;
    for (int p = 0; p < n; ++p) same += sameCollective(all[q], all[p]) ? 1 : 0;
    if (same > best) best = same, ref = q;
  }
  if (best == n) return;
  int odd = -1, differ = 0;
  for (int q = 0; q < n; ++q)
    if (!sameCollective(all[q], all[ref])) {
      if (odd < 0) odd = q;
      ++differ;
    }
  State* s = watchdog::detail::state();
  const int me = s ? s->rank : t.members()[t.rank()];
  const std::string comm = t.name().empty() ? strCat("communicator ", t.id()) : t.name();
  std::string line =
      strCat("hsdp [rank ", me, "]: collective mismatch on ", comm, " (seq ", seq, "): rank ",
             t.members()[odd], " entered ", watchdog::describe(all[odd]), " where rank ",
             t.members()[ref], " entered ", watchdog::describe(all[ref]));
  if (differ > 1) line += strCat(" (", differ - 1, " more ranks differ)");
  line += "; ranks must start the same collectives in the same order (HSDP_CHECK_COLLECTIVES=1)";
  watchdog::fatal(line, strCat("collective mismatch on ", comm, " seq ", seq));
}

// A collective waiting for its fingerprint comparison, then for its turn, then running.
class CheckedWork final : public ProgressiveWork {
 public:
  CheckedWork(CommTrace& t, uint64_t seq, std::function<StatusOr<WorkHandle>()> start)
      : t_(t), seq_(seq), start_(std::move(start)), all_(t.size()) {
    watchAs(&t, seq);
    mine_ = t.fingerprint(seq);
    StatusOr<WorkHandle> w =
        t.checker()->iallGather(&mine_, all_.data(), sizeof(Fingerprint), DType::kUInt8);
    if (!w.ok()) {
      t_.started = std::max(t_.started, seq_);
      finish(w.status().withContext("comparing collective fingerprints"));
      return;
    }
    exchange_ = std::move(*w);
    advance();
  }
  ~CheckedWork() override { waitForDestruction(); }

 private:
  void advance() override {
    if (done()) return;
    if (exchange_) {
      StatusOr<bool> d = isComplete(*exchange_);
      if (!d.ok()) return fail(d.status().withContext("comparing collective fingerprints"));
      if (!*d) return;
      exchange_.reset();
      verify(t_, seq_, all_);
    }
    if (!inner_) {
      if (t_.started + 1 != seq_) return;  // an earlier collective of this communicator first
      t_.started = seq_;
      StatusOr<WorkHandle> w = start_();
      if (!w.ok()) return finish(w.status());
      inner_ = std::move(*w);
    }
    StatusOr<bool> d = isComplete(*inner_);
    if (!d.ok()) return finish(d.status());
    if (*d) finish(okStatus());
  }

  void fail(Status s) {
    if (t_.started + 1 == seq_) t_.started = seq_;
    finish(std::move(s));
  }

  CommTrace& t_;
  uint64_t seq_;
  std::function<StatusOr<WorkHandle>()> start_;
  Fingerprint mine_;
  std::vector<Fingerprint> all_;
  WorkHandle exchange_;
  WorkHandle inner_;
};

}  // namespace

StatusOr<WorkHandle> checkedStart(CommTrace& t, uint64_t seq,
                                  std::function<StatusOr<WorkHandle>()> start) {
  auto lock = progressLock();
  return WorkHandle(std::make_unique<CheckedWork>(t, seq, std::move(start)));
}

Status checkNow(CommTrace& t, uint64_t seq) {
  auto lock = progressLock();
  const Fingerprint mine = t.fingerprint(seq);
  std::vector<Fingerprint> all(t.size());
  {
    watchdog::CommWait wait(&t, seq, "collective check");
    HSDP_RETURN_IF_ERROR(t.checker()
                             ->allGather(&mine, all.data(), sizeof(Fingerprint), DType::kUInt8)
                             .withContext("comparing collective fingerprints"));
  }
  verify(t, seq, all);
  // Earlier nonblocking collectives of this communicator start first (their comparisons are
  // complete or about to be: every member has entered this later one).
  watchdog::CommWait wait(&t, seq, "collective check");
  while (t.started + 1 < seq) {
    ProgressiveWork::progressAll();
    if (t.started + 1 < seq) sched_yield();
  }
  t.started = seq;
  return okStatus();
}

}  // namespace hsdp
