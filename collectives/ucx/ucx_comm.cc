// The UCX transport's collectives: a CollectiveOp executes a Schedule (schedule.h) with tagged
// UCP messages; communicators are built in ucx_create.cc, the shared state is in ucx_internal.h.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "collectives/ucx/ucx_check.h"
#include "collectives/ucx/ucx_internal.h"
#include "core/progress.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/transport_registry.h"

namespace hsdp::ucx {

// How long an aborted collective of a communicator built from addresses waits for UCX to
// complete its transfers once their endpoints are closed (CollectiveOp::drain).
constexpr auto kDrainTimeout = std::chrono::seconds(2);

// One collective in flight: executes its Schedule step by step with tagged UCP messages. The
// engine calls advance() on every progress round; the Work handle (or a blocking call) waits
// for done().
class CollectiveOp final : public ActiveOp {
 public:
  CollectiveOp(UcxComm::State& comm, const char* name, Algorithm algorithm, uint32_t seq)
      : comm_(&comm), name_(name), algorithm_(algorithm), seq_(seq) {}
  ~CollectiveOp() override = default;

  Schedule& schedule() { return schedule_; }
  void holdScratch(ScratchSlot* slot) { scratch_ = slot; }
  bool done() const { return done_; }
  const Status& status() const { return status_; }

  bool advance() override {
    while (!done_) {
      if (posted_) {
        if (!collect()) return false;
        posted_ = false;
        if (!status_.ok()) break;
        const Schedule::Step& st = schedule_.step(step_);
        for (uint32_t i = st.op_begin; i < st.op_end; ++i) runLocalOp(schedule_.opAt(i));
        ++step_;
      }
      if (step_ == schedule_.numSteps()) break;
      post();
      posted_ = true;
    }
    finish();
    return true;
  }

  // The communicator is going away with this collective unfinished: cancel what is posted and
  // finish with an error.
  void abandon() {
    abortWith(failedPrecondition("ucx ", name_, " (", comm_->describe(),
                                 "): communicator destroyed while the collective was in flight"));
  }

  // Called while waiting: ends the collective at once when its communicator was aborted, or when
  // nothing of it has completed for the communicator's deadline (communicators built from
  // addresses), naming the members it was still waiting for.
  void police() {
    if (done_) return;
    if (comm_->aborted.load(std::memory_order_acquire)) {
      abortWaited(comm_->abortedStatus(name_));
      return;
    }
    // A member of a communicator built from addresses aborted it (its notice, drain()).
    if (!comm_->own_eps.empty()) {
      ucp_tag_recv_info_t info{};
      ucp_worker_h worker = comm_->engine->worker();
      ucp_tag_message_h notice = ucp_tag_probe_nb(
          worker, makeTag(comm_->id, kAbortNotice, kAbortNotice, 0), kNoticeMask, 1, &info);
      if (notice != nullptr) {
        // Taken off UCX's unexpected queue (a few bytes: eager, received at once), so that a
        // later communicator given the same id does not see it. Its payload: the members the
        // sender found failed, which become this member's suspects too.
        std::vector<int32_t> failed(std::min<size_t>(info.length / sizeof(int32_t), 64));
        ucp_request_param_t rp{};
        ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker, failed.data(),
                                                  failed.size() * sizeof(int32_t), notice, &rp);
        if (UCS_PTR_IS_PTR(r)) {
          while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker);
          ucp_request_free(r);
        }
        std::string named;
        for (int32_t f : failed) {
          if (f < 0 || f >= comm_->size) continue;
          comm_->suspects.push_back(f);
          named += (named.empty() ? "" : ", ") + comm_->peerName(f);
        }
        const int who = static_cast<int>(info.sender_tag & 0xffff);
        abortWaited(Status(StatusCode::kAborted,
                           strCat("ucx ", name_, " (", algorithmName(algorithm_), ", ",
                                  comm_->describe(), ", collective #", seq_,
                                  "): ", comm_->peerName(who), " aborted this communicator",
                                  named.empty() ? "" : strCat(" (it found ", named, " failed)"))));
        return;
      }
    }
    // A receive is bound to no endpoint, so UCX never fails it when its sender dies: the
    // sender's endpoint says so instead (peer-failure handling).
    std::vector<int> peers;
    for (const Pending& p : pending_)
      if (p.req != nullptr) peers.push_back(transfer(p).peer);
    for (int p : peers) {
      const ucs_status_t st = comm_->eps[p] ? comm_->eps[p]->failure() : UCS_OK;
      if (st != UCS_OK) {
        comm_->suspects.push_back(p);
        abortWaited(internalError(
            "ucx ", name_, " (", algorithmName(algorithm_), ", ", comm_->describe(),
            ", collective #", seq_, "): ", comm_->peerName(p), " failed: UCX error ",
            static_cast<int>(st), " (", ucs_status_string(st), ") on the endpoint to it"));
        return;
      }
    }
    if (comm_->timeout_ms <= 0 || std::chrono::steady_clock::now() - last_progress_ <
                                      std::chrono::milliseconds(comm_->timeout_ms))
      return;
    std::sort(peers.begin(), peers.end());
    peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
    std::string who;
    for (int p : peers) who += (who.empty() ? "" : ", ") + comm_->peerName(p);
    abortWaited(failedPrecondition("ucx ", name_, " (", algorithmName(algorithm_), ", ",
                                   comm_->describe(), ", collective #", seq_, "): no progress for ",
                                   comm_->timeout_ms, " ms (HSDP_REPLICA_TIMEOUT_MS); waiting for ",
                                   who.empty() ? "nobody (a local stall)" : who));
  }

 private:
  struct Pending {
    void* req;
    uint32_t index;  // into the schedule's sends or receives
    bool is_recv;
    bool cancelled;
  };

  ucp_request_param_t params(const void* buf, size_t bytes) const {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    p.memory_type = kHostMemory;
    if (ucp_mem_h memh = comm_->memhFor(buf, bytes)) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p.memh = memh;
    }
    return p;
  }

  const Transfer& transfer(const Pending& p) const {
    return p.is_recv ? schedule_.recvAt(p.index) : schedule_.sendAt(p.index);
  }

  Status transferError(const Transfer& t, bool is_recv, ucs_status_t st) const {
    std::string hint;
    if (st == UCS_ERR_MESSAGE_TRUNCATED)
      hint =
          "; ranks started different collectives or counts (every rank must start the same "
          "collectives, in the same order, with the same counts)";
    return internalError("ucx ", name_, " (", algorithmName(algorithm_), ", ", comm_->describe(),
                         ", collective #", seq_, "): ", is_recv ? "receive" : "send",
                         " of message ", t.msg, " (", t.bytes, " bytes) ", is_recv ? "from" : "to",
                         " ", comm_->peerName(t.peer), " failed: UCX error ", static_cast<int>(st),
                         " (", ucs_status_string(st), ")", hint);
  }

  void checkLength(const Transfer& t, size_t received) {
    if (received == t.bytes) return;
    fail(failedPrecondition("ucx ", name_, " (", algorithmName(algorithm_), ", ", comm_->describe(),
                            ", collective #", seq_, "): message ", t.msg, " from rank ", t.peer,
                            " has ", received, " bytes, expected ", t.bytes,
                            "; ranks started different collectives or counts (every "
                            "rank must start the same collectives, in the same order, with the "
                            "same counts)"));
  }

  // Fails, cancels and releases what is posted, and finishes now. A communicator built from
  // addresses (the replica level, which outlives its failures) first drains: a receive matched
  // in the middle of a rendezvous cannot be cancelled, and a send is never cancelled, so UCX
  // would go on writing into (or reading from) buffers the caller reuses and scratch that is
  // freed with the communicator. Its own endpoints to every peer with a transfer in flight are
  // force-closed (UCX completes those transfers as cancelled; the peers' endpoints of this
  // communicator fail) and the worker progressed until each request has completed, for at most
  // kDrainTimeout. Other communicators abort only when the job ends: their requests are released
  // (UCX frees a request once it completes; a send to a stopped peer may still read its buffer).
  void abortWith(Status s) {
    fail(std::move(s));
    if (!comm_->own_eps.empty()) drain();
    for (Pending& p : pending_) {
      if (p.req != nullptr) ucp_request_free(p.req);
      p.req = nullptr;
    }
    finish();
  }
  void drain() {
    ucp_worker_h worker = comm_->engine->worker();
    // First the notice to every member (a member waiting for a message this rank will now never
    // send learns it at once, not at its deadline), flushed within a short bound; then every
    // endpoint closed.
    std::vector<void*> notices;
    ucp_request_param_t np{};
    comm_->notice.assign(comm_->suspects.begin(), comm_->suspects.end());
    const size_t bytes = comm_->notice.size() * sizeof(int32_t);
    for (size_t p = 0; p < comm_->own_eps.size(); ++p) {
      if (!comm_->own_eps[p] || comm_->own_eps[p]->get() == nullptr) continue;
      ucs_status_ptr_t r =
          ucp_tag_send_nbx(comm_->own_eps[p]->get(), comm_->notice.data(), bytes,
                           makeTag(comm_->id, kAbortNotice, kAbortNotice, comm_->rank), &np);
      if (UCS_PTR_IS_PTR(r)) notices.push_back(r);
    }
    const auto flushed = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    for (void* r : notices) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS &&
             std::chrono::steady_clock::now() < flushed)
        ucp_worker_progress(worker);
      ucp_request_free(r);
    }
    for (auto& ep : comm_->own_eps)
      if (ep) ep->close();
    const auto deadline = std::chrono::steady_clock::now() + kDrainTimeout;
    bool all_done = false;
    while (!all_done) {
      ucp_worker_progress(worker);
      all_done = true;
      for (Pending& p : pending_) {
        if (p.req == nullptr) continue;
        if (ucp_request_check_status(p.req) != UCS_INPROGRESS) {
          ucp_request_free(p.req);
          p.req = nullptr;
        } else {
          all_done = false;
        }
      }
      if (!all_done && std::chrono::steady_clock::now() > deadline) {
        HSDP_WARN(kColl, "ucx ", name_, " (", comm_->describe(),
                  "): ", "transfers still in flight ",
                  std::chrono::duration_cast<std::chrono::milliseconds>(kDrainTimeout).count(),
                  " ms after the abort closed their endpoints; released to UCX");
        break;
      }
    }
  }
  // From a wait (not from the engine's own round): abortWith, and out of the engine's list now.
  void abortWaited(Status s) {
    abortWith(std::move(s));
    comm_->engine->forget(this);
  }

  void fail(Status s) {
    if (status_.ok()) status_ = std::move(s);
    ucp_worker_h worker = comm_->engine->worker();
    for (Pending& p : pending_) {
      if (p.req != nullptr && !p.cancelled) {
        ucp_request_cancel(worker, p.req);
        p.cancelled = true;
      }
    }
  }

  // Posts the current step: receives first, so that messages arriving find their buffer
  // instead of going through UCX's unexpected queue.
  void post() {
    const Schedule::Step& st = schedule_.step(step_);
    const uint32_t id = comm_->id;
    pending_.clear();
    for (uint32_t i = st.recv_begin; i < st.recv_end && status_.ok(); ++i) {
      const Transfer& t = schedule_.recvAt(i);
      ucp_request_param_t p = params(t.buf, t.bytes);
      // Always a request, even when the message is already here: its length is then read the
      // same way in collect() (UCX 1.13 does not fill recv_info on every immediate path).
      p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      ucs_status_ptr_t r = ucp_tag_recv_nbx(comm_->engine->worker(), t.buf, t.bytes,
                                            makeTag(id, seq_, t.msg, t.peer), kFullMask, &p);
      if (UCS_PTR_IS_ERR(r))
        fail(transferError(t, true, UCS_PTR_STATUS(r)));
      else if (r != nullptr)
        pending_.push_back({r, i, true, false});
    }
    for (uint32_t i = st.send_begin; i < st.send_end && status_.ok(); ++i) {
      const Transfer& t = schedule_.sendAt(i);
      if (comm_->eps[t.peer]->get() == nullptr) {  // closed by an earlier abort (drain)
        fail(failedPrecondition("ucx ", name_, " (", comm_->describe(), "): the endpoint to ",
                                comm_->peerName(t.peer),
                                " was closed by an earlier abort of this communicator"));
        break;
      }
      ucp_request_param_t p = params(t.buf, t.bytes);
      ucs_status_ptr_t r = ucp_tag_send_nbx(comm_->eps[t.peer]->get(), t.buf, t.bytes,
                                            makeTag(id, seq_, t.msg, comm_->rank), &p);
      if (UCS_PTR_IS_ERR(r))
        fail(transferError(t, false, UCS_PTR_STATUS(r)));
      else if (r != nullptr)
        pending_.push_back({r, i, false, false});
    }
  }

  // True once every request of the step has completed (successfully or not) and been freed.
  bool collect() {
    bool all_done = true;
    for (Pending& p : pending_) {
      if (p.req == nullptr) continue;
      ucs_status_t st;
      ucp_tag_recv_info_t info{};
      if (p.is_recv)
        st = ucp_tag_recv_request_test(p.req, &info);
      else
        st = ucp_request_check_status(p.req);
      if (st == UCS_INPROGRESS) {
        all_done = false;
        continue;
      }
      ucp_request_free(p.req);
      p.req = nullptr;
      last_progress_ = std::chrono::steady_clock::now();
      const Transfer& t = transfer(p);
      if (st != UCS_OK) {
        if (!p.cancelled) comm_->suspects.push_back(t.peer);
        if (!p.cancelled) fail(transferError(t, p.is_recv, st));
      } else if (p.is_recv) {
        checkLength(t, info.length);
      }
    }
    return all_done;
  }

  void finish() {
    if (done_) return;
    done_ = true;
    pending_.clear();
    if (scratch_ != nullptr) scratch_->busy = false;
    scratch_ = nullptr;
    auto& list = comm_->in_flight;
    list.erase(std::remove(list.begin(), list.end(), this), list.end());
  }

  UcxComm::State* comm_;
  const char* name_;
  Algorithm algorithm_;
  uint32_t seq_;
  Schedule schedule_;
  size_t step_ = 0;
  bool posted_ = false;
  std::vector<Pending> pending_;
  ScratchSlot* scratch_ = nullptr;
  Status status_;
  bool done_ = false;
  std::chrono::steady_clock::time_point last_progress_ = std::chrono::steady_clock::now();
};

namespace {

class UcxWork final : public Work {
 public:
  UcxWork(std::shared_ptr<Engine> engine, std::shared_ptr<CollectiveOp> op, const CommTrace* t)
      : engine_(std::move(engine)), op_(std::move(op)), trace_(t), seq_(t ? t->entered() : 0) {}

  Status wait() override {
    auto lock = progressLock();
    watchdog::CommWait watched(trace_, seq_, "ucx wait");
    engine_->progressUntil([this] {
      op_->police();
      return op_->done();
    });
    return op_->status();
  }

  StatusOr<bool> test() override {
    auto lock = progressLock();
    if (!op_->done()) engine_->progress();
    op_->police();
    if (!op_->done()) return false;
    if (!op_->status().ok()) return op_->status();
    return true;
  }

 private:
  std::shared_ptr<Engine> engine_;
  std::shared_ptr<CollectiveOp> op_;
  const CommTrace* trace_;  // for the watchdog's report of a wait on it
  uint64_t seq_;
};

}  // namespace

template <typename Build>
StatusOr<std::shared_ptr<CollectiveOp>> UcxComm::State::start(const char* name, Algorithm algorithm,
                                                              size_t scratch_bytes, Build build) {
  if (aborted.load(std::memory_order_acquire)) return abortedStatus(name);
  auto op = std::make_shared<CollectiveOp>(*this, name, algorithm, seq++);
  void* buf = nullptr;
  if (scratch_bytes > 0) {
    HSDP_ASSIGN_OR_RETURN(ScratchSlot * slot, acquireScratch(scratch_bytes, name));
    op->holdScratch(slot);
    buf = slot->buffer.data();
  }
  build(op->schedule(), buf);
  in_flight.push_back(op.get());
  engine->start(op);
  return op;
}

Status UcxComm::State::wait(CollectiveOp& op) {
  engine->progressUntil([&op] {
    op.police();
    return op.done();
  });
  return op.status();
}

UcxComm::~UcxComm() {
  if (s_ == nullptr) return;
  if (!s_->in_flight.empty()) {
    HSDP_WARN(kColl, "ucx ", s_->describe(), " destroyed with ", s_->in_flight.size(),
              " collectives in flight; cancelling them");
    const std::vector<CollectiveOp*> ops = s_->in_flight;
    for (CollectiveOp* op : ops) {
      op->abandon();
      s_->engine->forget(op);
    }
  }
  // Members go in reverse order: registrations, scratch, the bootstrap, and last our hold on the
  // engine (which closes the endpoints when the last communicator goes).
}

// ---- accessors ---------------------------------------------------------------------------------

int UcxComm::rank() const { return s_->rank; }
int UcxComm::size() const { return s_->size; }
Comm& UcxComm::bootstrap() { return *s_->bootstrap; }
const UcxOptions& UcxComm::options() const { return s_->options; }
uint32_t UcxComm::id() const { return s_->id; }

// ---- collectives -------------------------------------------------------------------------------

StatusOr<WorkHandle> UcxComm::startAllGather(const void* send, void* recv, size_t count,
                                             DType dtype) {
  State& s = *s_;
  const Algorithm a = chooseAllGather(s.size, count, dtype, s.options.small_bytes);
  HSDP_ASSIGN_OR_RETURN(auto op,
                        s.start("allGather", a, allGatherScratchBytes(a, s.size, count, dtype),
                                [&](Schedule& sched, void* scratch) {
                                  buildAllGather(sched, a, s.rank, s.size, send, recv, count, dtype,
                                                 scratch);
                                }));
  return WorkHandle(std::make_unique<UcxWork>(s.engine, std::move(op), trace()));
}

StatusOr<WorkHandle> UcxComm::startAllGatherRuns(const void* send, void* recv,
                                                 const BlockRuns& layout, DType dtype, void* pack) {
  State& s = *s_;
  // Small gathers are latency-bound (Bruck, recursive doubling beat the ring there), and a ring
  // of too many runs would overflow the tags' message ids: those pack and unpack instead.
  const size_t bytes = static_cast<size_t>(s.size) * layout.blockCount() * dtypeSize(dtype);
  if (s.size == 1 || bytes <= s.options.small_bytes || !allGatherRunsFits(s.size, layout))
    return Comm::startAllGatherRuns(send, recv, layout, dtype, pack);
  HSDP_ASSIGN_OR_RETURN(auto op,
                        s.start("allGather", Algorithm::kRing, 0, [&](Schedule& sched, void*) {
                          buildAllGatherRuns(sched, s.rank, s.size, send, recv, layout, dtype);
                        }));
  return WorkHandle(std::make_unique<UcxWork>(s.engine, std::move(op), trace()));
}

StatusOr<WorkHandle> UcxComm::startReduceScatter(const void* send, void* recv, size_t count,
                                                 DType dtype, RedOp op) {
  State& s = *s_;
  const Algorithm a = chooseReduceScatter(s.size, count, dtype, s.options.small_bytes);
  HSDP_ASSIGN_OR_RETURN(
      auto o, s.start("reduceScatter", a, reduceScatterScratchBytes(a, s.size, count, dtype),
                      [&](Schedule& sched, void* scratch) {
                        buildReduceScatter(sched, a, s.rank, s.size, send, recv, count, dtype, op,
                                           scratch);
                      }));
  return WorkHandle(std::make_unique<UcxWork>(s.engine, std::move(o), trace()));
}

StatusOr<WorkHandle> UcxComm::startAllReduce(void* buf, size_t count, DType dtype, RedOp op) {
  State& s = *s_;
  const Algorithm a = chooseAllReduce(s.size, count, dtype, s.options.small_bytes);
  HSDP_ASSIGN_OR_RETURN(
      auto o, s.start("allReduce", a, allReduceScratchBytes(a, s.size, count, dtype),
                      [&](Schedule& sched, void* scratch) {
                        buildAllReduce(sched, a, s.rank, s.size, buf, count, dtype, op, scratch);
                      }));
  return WorkHandle(std::make_unique<UcxWork>(s.engine, std::move(o), trace()));
}

StatusOr<WorkHandle> UcxComm::startAllToAll(const void* send, void* recv, size_t count,
                                            DType dtype) {
  State& s = *s_;
  HSDP_ASSIGN_OR_RETURN(auto o,
                        s.start("allToAll", Algorithm::kPairwise, 0, [&](Schedule& sched, void*) {
                          buildAllToAll(sched, s.rank, s.size, send, recv, count, dtype);
                        }));
  return WorkHandle(std::make_unique<UcxWork>(s.engine, std::move(o), trace()));
}

const char* UcxComm::waitName(const char* call) const {
  if (std::strcmp(call, "broadcast") == 0) return "ucx broadcast";
  if (std::strcmp(call, "barrier") == 0) return "ucx barrier";
  return call;
}

Status UcxComm::runBroadcast(void* buf, size_t count, DType dtype, int root) {
  State& s = *s_;
  HSDP_ASSIGN_OR_RETURN(
      auto op, s.start("broadcast", Algorithm::kBinomial, 0, [&](Schedule& sched, void*) {
        buildBroadcast(sched, s.rank, s.size, buf, count * dtypeSize(dtype), root);
      }));
  return s.wait(*op);
}

Status UcxComm::runBarrier() {
  State& s = *s_;
  HSDP_ASSIGN_OR_RETURN(
      auto op, s.start("barrier", Algorithm::kDissemination, 0, [&](Schedule& sched, void*) {
        buildBarrier(sched, s.rank, s.size, &s.token);
      }));
  return s.wait(*op);
}

// ---- communicators, memory ---------------------------------------------------------------------

Status UcxComm::reserveScratch(size_t bytes) {
  auto lock = progressLock();
  State& s = *s_;
  if (s.size == 1) return okStatus();  // one rank: every collective is a local copy
  // Ring: two blocks in flight. Recursive doubling (n*bytes within the small-message limit):
  // a working copy of all n blocks and the partner's copy.
  const size_t small_rs = 2 * std::min(static_cast<size_t>(s.size) * bytes, s.options.small_bytes);
  s.slot_bytes = std::max({s.slot_bytes, 2 * bytes, small_rs});
  bool any = false;
  for (auto& slot : s.scratch) {
    if (slot->busy) continue;
    if (slot->buffer.size() < s.slot_bytes) {
      slot.reset();  // unregister and free before allocating the larger one
      HSDP_ASSIGN_OR_RETURN(slot, s.newSlot(s.slot_bytes));
    }
    any = true;
  }
  if (!any) {
    HSDP_ASSIGN_OR_RETURN(auto slot, s.newSlot(s.slot_bytes));
    s.scratch.push_back(std::move(slot));
  }
  HSDP_INFO(kColl, "ucx ", s.describe(), " scratch slots of ", s.slot_bytes, " bytes (",
            s.scratch.size(), " slots)");
  return okStatus();
}

size_t UcxComm::scratchBytes() const {
  size_t total = 0;
  for (const auto& slot : s_->scratch) total += slot ? slot->buffer.size() : 0;
  return total;
}

Status UcxComm::registerMemory(const void* p, size_t bytes) {
  auto lock = progressLock();
  if (p == nullptr || bytes == 0)
    return invalidArgument("registerMemory: empty region (", p, ", ", bytes, " bytes)");
  // UNKNOWN: let UCX detect the memory type, so GPU memory is recognised rather than
  // mis-registered as host memory.
  HSDP_ASSIGN_OR_RETURN(UcpMemRegion region,
                        UcpMemRegion::map(s_->engine->context(), const_cast<void*>(p), bytes,
                                          UCS_MEMORY_TYPE_UNKNOWN));
  if (region.memoryType() != kHostMemory)
    return unimplemented("registerMemory: ", bytes, " bytes at ", p, " are ",
                         ucs_memory_type_names[region.memoryType()],
                         " memory; the UCX transport moves host memory only (the GPU path is "
                         "not built yet)");
  s_->registered.push_back(std::move(region));
  return okStatus();
}

Status UcxComm::deregisterMemory(const void* p) {
  auto lock = progressLock();
  auto& regs = s_->registered;
  auto it = std::find_if(regs.begin(), regs.end(),
                         [p](const UcpMemRegion& r) { return r.address() == p; });
  if (it == regs.end())
    return notFound("deregisterMemory: no region registered at ", p, " on ucx ", s_->describe());
  regs.erase(it);
  return okStatus();
}

}  // namespace hsdp::ucx

namespace hsdp::modules {
// Called once by the generated module list (cmake/HsdpModules.cmake).
void registerUcxTransport() {
  registerTransport("ucx", [](std::unique_ptr<Comm> bootstrap) {
    return ucx::createUcxComm(std::move(bootstrap));
  });
  ucx::registerPeerUcx();  // the same transport built from addresses (ucx_create.cc)
}
}  // namespace hsdp::modules
