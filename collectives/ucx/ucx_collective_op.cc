// CollectiveOp's waits and failures (ucx_collective_op.h): the checks made while a caller waits
// (an abort, a member's notice, a failed endpoint, the deadline) and the abort that drains.
#include "collectives/ucx/ucx_collective_op.h"

namespace hsdp::ucx {

void CollectiveOp::police() {
  if (done_) return;
  if (comm_->aborted.load(std::memory_order_acquire)) {
    abortWaited(comm_->abortedStatus(name_));
    return;
  }
  // A member of a communicator built from addresses aborted it (its notice, drain()).
  if (comm_->addressed) {
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
      ucs_status_ptr_t r =
          ucp_tag_msg_recv_nbx(worker, failed.data(), failed.size() * sizeof(int32_t), notice, &rp);
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
      abortWaited(Status(
          StatusCode::kAborted,
          strCat("ucx ", name_, " (", algorithmName(algorithm_), ", ", comm_->describe(),
                 ", collective #", seq_, "): ", comm_->peerName(who), " aborted this communicator",
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
          "ucx ", name_, " (", algorithmName(algorithm_), ", ", comm_->describe(), ", collective #",
          seq_, "): ", comm_->peerName(p), " failed: UCX error ", static_cast<int>(st), " (",
          ucs_status_string(st), ") on the endpoint to it"));
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

void CollectiveOp::abortWith(Status s) {
  fail(std::move(s));
  if (comm_->addressed) drain();
  for (Pending& p : pending_) {
    if (p.req != nullptr) ucp_request_free(p.req);
    p.req = nullptr;
  }
  finish();
}

void CollectiveOp::drain() {
  ucp_worker_h worker = comm_->engine->worker();
  // First the notice to every member (a member waiting for a message this rank will now never
  // send learns it at once, not at its deadline), flushed within a short bound; then every
  // request of this collective cancelled. The endpoints stay open: they are the engine's,
  // shared with the other communicators of the same peers (ucx_internal.h says why). A receive
  // not yet matched is cancelled at once; a matched one completes when its sender's data is in
  // (or its endpoint fails); a send completes when the peer takes it, and one the peer never
  // takes (its receive was cancelled: the tag is this communicator's alone) never touches its
  // buffer again once released.
  std::vector<void*> notices;
  ucp_request_param_t np{};
  comm_->notice.assign(comm_->suspects.begin(), comm_->suspects.end());
  const size_t bytes = comm_->notice.size() * sizeof(int32_t);
  for (size_t p = 0; p < comm_->eps.size(); ++p) {
    if (comm_->eps[p] == nullptr || comm_->eps[p]->get() == nullptr) continue;
    if (comm_->eps[p]->failure() != UCS_OK) continue;
    ucs_status_ptr_t r =
        ucp_tag_send_nbx(comm_->eps[p]->get(), comm_->notice.data(), bytes,
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
  for (Pending& p : pending_)
    if (p.req != nullptr && p.is_recv) ucp_request_cancel(worker, p.req);
  // Receives (which write into the caller's buffers) for up to kDrainTimeout, then the endpoints
  // to the senders of those still in flight closed and as long again; sends a peer is taking
  // complete within the first 200 ms, the rest are released (above).
  const auto start = std::chrono::steady_clock::now();
  auto deadline = start + kDrainTimeout;
  const auto sends_deadline = start + std::chrono::milliseconds(200);
  bool closed = false;
  bool all_done = false;
  while (!all_done) {
    ucp_worker_progress(worker);
    all_done = true;
    const bool sends_too = std::chrono::steady_clock::now() < sends_deadline;
    for (Pending& p : pending_) {
      if (p.req == nullptr) continue;
      if (ucp_request_check_status(p.req) != UCS_INPROGRESS) {
        ucp_request_free(p.req);
        p.req = nullptr;
      } else if (p.is_recv || sends_too) {
        all_done = false;
      }
    }
    if (!all_done && std::chrono::steady_clock::now() > deadline) {
      if (!closed) {
        // A receive matched in the middle of a rendezvous whose sender stopped: only closing
        // the endpoint to that sender completes it (as cancelled), so UCX never writes into the
        // buffer later. The engine retires that endpoint; both sides connect anew.
        for (const Pending& p : pending_)
          if (p.req != nullptr && p.is_recv && comm_->eps[transfer(p).peer] != nullptr)
            comm_->engine->retire(comm_->eps[transfer(p).peer]);
        closed = true;
        deadline = std::chrono::steady_clock::now() + kDrainTimeout;
        continue;
      }
      HSDP_WARN(kColl, "ucx ", name_, " (", comm_->describe(), "): ", "transfers still in flight ",
                std::chrono::duration_cast<std::chrono::milliseconds>(kDrainTimeout).count(),
                " ms after the abort closed the endpoints to their peers; released to UCX");
      break;
    }
  }
}

}  // namespace hsdp::ucx
