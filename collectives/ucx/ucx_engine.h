// The process's UCX engine: one UCP context and one worker shared by every UCX communicator of
// the process, and the list of collectives in flight on it.
//
// Why one worker for all communicators: a worker is UCX's unit of progress, and ranks may wait
// for their outstanding collectives in different orders, on different communicators (an inter
// all-gather and a replica all-reduce, say). If each communicator had its own worker, a rank
// blocked on one could starve a peer blocked on the other. With one worker, every wait() and
// test() advances every collective in flight, so progress never depends on the order in which
// handles are waited for. Communicators keep their messages apart by an id in the tag.
//
// Why our own context: Open MPI may use UCX itself (pml ucx) with its own context; two contexts
// coexist in one process, and ours can be configured apart (HSDP_UCX_TLS, HSDP_UCX_NET_DEVICES)
// without changing what MPI uses.
//
// Threading: the engine is driven by the one thread that runs hsdp's collectives (the same
// thread that calls MPI, which is initialized FUNNELED); the worker is single-threaded.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ucx/ucx_resources.h"
#include "core/idle_wait.h"
#include "hsdp/status.h"

namespace hsdp::ucx {

// Something the engine advances on every progress round until it reports completion.
class ActiveOp {
 public:
  virtual ~ActiveOp() = default;
  // Moves the operation forward without blocking; true once it has finished (ok or not).
  virtual bool advance() = 0;
};

class Engine {
 public:
  // The process's engine, created on first use (reading HSDP_UCX_TLS, HSDP_UCX_NET_DEVICES) and
  // destroyed when the last communicator holding it goes.
  static StatusOr<std::shared_ptr<Engine>> acquire();
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  ucp_context_h context() const { return context_.get(); }
  ucp_worker_h worker() const { return worker_.get(); }
  const std::vector<uint8_t>& address() const { return address_; }
  const ContextSettings& settings() const { return settings_; }

  // The endpoint to the worker whose packed address is [address, address+length), created on
  // first use and shared by every communicator that reaches that worker: a process keeps one
  // connection per peer process however many communicators it builds, and endpoints close once,
  // when the engine goes (ucx_resources.h says how).
  // `remote`: peer-failure handling (UcpEndpoint::connect: a peer on another host, or any member
  // of a communicator built from addresses); one endpoint per peer and mode.
  StatusOr<const UcpEndpoint*> endpointTo(const uint8_t* address, size_t length, bool remote);

  // Force-closes `ep` (one of endpointTo's) and retires it, so the next endpointTo to that
  // worker connects anew: the draining abort's last resort for a receive stuck in a rendezvous
  // with a stopped peer (ucx_collective_op.cc). The peer's endpoint fails, and it connects anew
  // too. No-op for an endpoint already retired.
  void retire(const UcpEndpoint* ep);

  // Communicator ids: members agree on an id no member has used yet (the largest of their next
  // free ids), so that ids are unique on every process a communicator spans.
  uint32_t nextCommId() const { return next_comm_id_; }
  void takeCommId(uint32_t id) { next_comm_id_ = id + 1; }

  // Takes `op` into the set advanced by progress(), advancing it once right away (which posts
  // its first messages). An op that finishes at once is not kept.
  void start(std::shared_ptr<ActiveOp> op);
  // Drops `op` without finishing it (its communicator is going away).
  void forget(const ActiveOp* op);
  // One round: progresses the worker, then advances every op in flight, oldest first.
  // Returns whether anything happened.
  bool progress();
  // progress() until done(). Spins while things move; once nothing has moved for a while
  // (core/idle_wait.h) it arms the worker and sleeps on its event descriptor, with a timeout
  // that grows to HSDP_WAIT_SLEEP_MAX_US, so that a rank waiting on a late peer leaves the core
  // to the ranks that compute (tests run 8 ranks on 2 cores).
  template <typename Done>
  void progressUntil(Done done) {
    IdleBackoff backoff;
    int idle = 0;
    while (!done()) {
      if (progress()) {
        backoff.progressed();
        idle = 0;
        continue;
      }
      backoff.sawProgress();  // another transport's progress counts too
      const int64_t pause_us = backoff.nextPauseUs();
      if (pause_us > 0) {
        sleepOnWorker(pause_us);
      } else if (++idle >= kSpinsBeforeYield) {
        yield();
        idle = 0;
      }
    }
  }
  size_t inFlight() const { return active_.size(); }

 private:
  static constexpr int kSpinsBeforeYield = 64;
  Engine() = default;
  static void yield();
  // Arms the worker and waits up to `us` for an event on its descriptor (a plain sleep where
  // UCX gave none); returns at once if events are pending.
  void sleepOnWorker(int64_t us);

  ContextSettings settings_;
  // Declaration order is teardown order reversed: the worker goes before the context.
  UcpContext context_;
  UcpWorker worker_;
  // By peer worker address; closed before worker_. Owned by pointer: communicators hold the
  // endpoint's address, which must outlive its retirement.
  std::map<std::string, std::unique_ptr<UcpEndpoint>> endpoints_;
  std::vector<std::unique_ptr<UcpEndpoint>> retired_;  // failed or closed, held by old comms
  std::vector<uint8_t> address_;
  std::vector<std::shared_ptr<ActiveOp>> active_;
  uint32_t next_comm_id_ = 0;
  int efd_ = -1;  // the worker's event descriptor (ucp_worker_get_efd); -1: none
};

}  // namespace hsdp::ucx
