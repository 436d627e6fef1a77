#include "collectives/ucx/ucx_engine.h"

#include <poll.h>
#include <sched.h>
#include <time.h>

#include <algorithm>

#include "hsdp/env.h"
#include "hsdp/log.h"

namespace hsdp::ucx {
namespace {

// The engine lives as long as some communicator holds it; a later communicator after all are
// gone creates a fresh one.
std::weak_ptr<Engine>& processEngine() {
  static std::weak_ptr<Engine> engine;
  return engine;
}

const env::StringParam kUcxTls{
    "HSDP_UCX_TLS", env::StringParam::Kind::kString, "",
    "UCX transports of hsdp's own UCP context (the UCX_TLS syntax, e.g. tcp or ^cma); unset: "
    "UCX_TLS, else all. Open MPI's use of UCX keeps UCX_TLS."};
const env::StringParam kUcxNetDevices{
    "HSDP_UCX_NET_DEVICES", env::StringParam::Kind::kString, "",
    "Network devices of hsdp's UCP context (the UCX_NET_DEVICES syntax, e.g. eth0 or "
    "mlx5_0:1); unset: UCX_NET_DEVICES, else all."};

}  // namespace

StatusOr<std::shared_ptr<Engine>> Engine::acquire() {
  if (auto existing = processEngine().lock()) return existing;
  std::shared_ptr<Engine> e(new Engine());
  e->settings_.tls = kUcxTls.get();
  e->settings_.net_devices = kUcxNetDevices.get();
  HSDP_ASSIGN_OR_RETURN(e->context_, UcpContext::create(e->settings_));
  HSDP_ASSIGN_OR_RETURN(e->worker_, UcpWorker::create(e->context_.get()));
  HSDP_ASSIGN_OR_RETURN(e->address_, e->worker_.address());
  if (ucs_status_t st = ucp_worker_get_efd(e->worker_.get(), &e->efd_); st != UCS_OK) {
    HSDP_INFO(kInit, "ucx: no worker event descriptor (", ucs_status_string(st),
              "); waits sleep on a timer");
    e->efd_ = -1;
  }
  HSDP_INFO(kInit, "ucx ", ucp_get_version_string(), " context ready: transports ",
            e->settings_.tls.empty() ? "from UCX_TLS (default: all)"
                                     : strCat("HSDP_UCX_TLS=", e->settings_.tls),
            ", memory types ", e->context_.memoryTypeNames(), ", worker address ",
            e->address_.size(), " bytes");
  processEngine() = e;
  return e;
}

Engine::~Engine() {
  if (!active_.empty())
    HSDP_WARN(kColl, "ucx engine destroyed with ", active_.size(), " collectives in flight");
  active_.clear();
  retired_.clear();
  endpoints_.clear();  // before the worker (declaration order would do it too; explicit here)
}

StatusOr<const UcpEndpoint*> Engine::endpointTo(const uint8_t* address, size_t length,
                                                bool remote) {
  // One endpoint per peer and error mode: a communicator built from addresses wants peer-failure
  // handling even to a peer on this host that others reach without it.
  std::string key(reinterpret_cast<const char*>(address), length);
  key.push_back(remote ? 'P' : 'N');
  auto it = endpoints_.find(key);
  if (it != endpoints_.end() && it->second->failure() != UCS_OK) {
    // Failed (the peer was cut off, or reset): UCX never revives an endpoint, but the same
    // worker may be reachable again (a cut link restored). A new communicator gets a new one;
    // the failed one stays alive for the communicators still holding it.
    HSDP_INFO(kColl, "ucx: endpoint failed earlier (", ucs_status_string(it->second->failure()),
              "); connecting again");
    retired_.push_back(std::move(it->second));
    endpoints_.erase(it);
    it = endpoints_.end();
  }
  if (it == endpoints_.end()) {
    HSDP_ASSIGN_OR_RETURN(UcpEndpoint ep, UcpEndpoint::connect(worker_.get(), address, remote));
    it = endpoints_.emplace(std::move(key), std::make_unique<UcpEndpoint>(std::move(ep))).first;
  }
  return it->second.get();
}

void Engine::retire(const UcpEndpoint* ep) {
  for (auto it = endpoints_.begin(); it != endpoints_.end(); ++it) {
    if (it->second.get() != ep) continue;
    it->second->close();
    retired_.push_back(std::move(it->second));
    endpoints_.erase(it);
    return;
  }
}

void Engine::start(std::shared_ptr<ActiveOp> op) {
  if (!op->advance()) active_.push_back(std::move(op));
}

void Engine::forget(const ActiveOp* op) {
  active_.erase(std::remove_if(active_.begin(), active_.end(),
                               [op](const std::shared_ptr<ActiveOp>& a) { return a.get() == op; }),
                active_.end());
}

bool Engine::progress() {
  bool moved = false;
  while (ucp_worker_progress(worker_.get()) != 0) moved = true;
  for (size_t i = 0; i < active_.size();) {
    if (active_[i]->advance()) {
      active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(i));
      moved = true;
    } else {
      ++i;
    }
  }
  if (moved) noteProgress();
  return moved;
}

void Engine::yield() { sched_yield(); }

void Engine::sleepOnWorker(int64_t us) {
  const timespec timeout{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  if (efd_ >= 0) {
    const ucs_status_t st = ucp_worker_arm(worker_.get());
    if (st == UCS_ERR_BUSY) return;  // events pending: progress them
    if (st == UCS_OK) {
      pollfd p{efd_, POLLIN, 0};
      ppoll(&p, 1, &timeout, nullptr);  // an event, the timeout or a signal: progress again
      return;
    }
  }
  nanosleep(&timeout, nullptr);
}

}  // namespace hsdp::ucx
