// Internal to the UCX transport: one collective in flight (CollectiveOp), which executes its
// Schedule (schedule.h) with tagged UCP messages. Its waits and failures (police, the draining
// abort) are in ucx_collective_op.cc; the communicator's calls that start it in ucx_comm.cc.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/ucx/ucx_check.h"
#include "collectives/ucx/ucx_internal.h"

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
  void police();

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
  // addresses (the replica level, which outlives its failures) first drains (drain(): the
  // members told, the receives cancelled and awaited, for at most kDrainTimeout, so that UCX
  // does not write into buffers the caller reuses; its endpoints stay open, the engine's).
  // Other communicators abort only when the job ends: their requests are released (UCX frees
  // a request once it completes; a send to a stopped peer may still read its buffer).
  void abortWith(Status s);
  void drain();
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
      if (comm_->eps[t.peer]->get() == nullptr) {  // closed (only the engine's teardown does)
        fail(failedPrecondition("ucx ", name_, " (", comm_->describe(), "): the endpoint to ",
                                comm_->peerName(t.peer), " is closed"));
        break;
      }
      ucp_request_param_t p = params(t.buf, t.bytes);
      ucs_status_ptr_t r = ucp_tag_send_nbx(comm_->eps[t.peer]->get(), t.buf, t.bytes,
                                            makeTag(id, seq_, t.msg, comm_->rank), &p);
      if (UCS_PTR_IS_ERR(r)) {
        fail(transferError(t, false, UCS_PTR_STATUS(r)));
        break;
      }
      if (comm_->sent != nullptr) comm_->sent->fetch_add(t.bytes, std::memory_order_relaxed);
      if (r != nullptr) pending_.push_back({r, i, false, false});
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

}  // namespace hsdp::ucx
