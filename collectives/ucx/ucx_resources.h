// RAII owners of the UCP objects the UCX transport holds: the context (the process's
// configured transports and memory domains), the worker (the progress engine with its address),
// endpoints to peer workers and registered memory regions. Each owner is move-only and releases
// its handle in the destructor; creation returns a Status carrying ucs_status_string on failure.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hsdp/status.h"

namespace hsdp::ucx {

// Settings of hsdp's own UCP context. They modify the configuration read from the UCX_*
// environment for this context only, so that Open MPI's pml ucx (which reads UCX_* too) keeps
// its own choice.
struct ContextSettings {
  std::string tls;          // HSDP_UCX_TLS: UCX_TLS for hsdp's context; empty keeps UCX_TLS
  std::string net_devices;  // HSDP_UCX_NET_DEVICES: likewise for UCX_NET_DEVICES
};

class UcpContext {
 public:
  UcpContext() = default;
  // A context with the tag-matching feature, used by one thread (no shared workers).
  static StatusOr<UcpContext> create(const ContextSettings& settings);
  ~UcpContext();
  UcpContext(UcpContext&& o) noexcept;
  UcpContext& operator=(UcpContext&& o) noexcept;
  UcpContext(const UcpContext&) = delete;
  UcpContext& operator=(const UcpContext&) = delete;

  ucp_context_h get() const { return h_; }
  // "host, cuda, ...": the memory types this context can move, as UCX names them.
  std::string memoryTypeNames() const;

 private:
  ucp_context_h h_ = nullptr;
};

class UcpWorker {
 public:
  UcpWorker() = default;
  // A single-threaded worker: hsdp drives UCX from the one thread that runs the collectives.
  static StatusOr<UcpWorker> create(ucp_context_h context);
  ~UcpWorker();
  UcpWorker(UcpWorker&& o) noexcept;
  UcpWorker& operator=(UcpWorker&& o) noexcept;
  UcpWorker(const UcpWorker&) = delete;
  UcpWorker& operator=(const UcpWorker&) = delete;

  ucp_worker_h get() const { return h_; }
  // The packed worker address peers connect to (copied; UCX's buffer is released at once).
  StatusOr<std::vector<uint8_t>> address() const;

 private:
  ucp_worker_h h_ = nullptr;
};

class UcpEndpoint {
 public:
  UcpEndpoint() = default;
  // Endpoint on `worker` to the worker whose packed address is `address`. The connection is
  // wired up lazily, on the first message. `remote`: the peer is on another host, and the
  // endpoint handles peer failure (UCP_ERR_HANDLING_MODE_PEER: a dead or unreachable peer fails
  // the transfers to it instead of aborting this process); same-host peers keep mode NONE (the
  // .cc says why).
  static StatusOr<UcpEndpoint> connect(ucp_worker_h worker, const uint8_t* address, bool remote);
  // Closes without waiting for the peer (UCP_EP_CLOSE_FLAG_FORCE), progressing the worker until
  // UCX has released the endpoint (bounded; a close that does not finish in time is logged and
  // left to the worker's teardown). Close only with nothing in flight on the endpoint.
  ~UcpEndpoint();
  UcpEndpoint(UcpEndpoint&& o) noexcept;
  UcpEndpoint& operator=(UcpEndpoint&& o) noexcept;
  UcpEndpoint(const UcpEndpoint&) = delete;
  UcpEndpoint& operator=(const UcpEndpoint&) = delete;

  ucp_ep_h get() const { return h_; }
  // UCS_OK, or the error UCX reported on this endpoint (peer-failure handling: the peer died,
  // reset the connection or stopped answering UCX's keepalive); set while the worker progresses.
  ucs_status_t failure() const {
    return failure_ ? static_cast<ucs_status_t>(failure_->load(std::memory_order_relaxed)) : UCS_OK;
  }
  // What UCX chose for this endpoint (transports per lane), for TRACE logs.
  std::string describe() const;
  // The destructor's close, now (Engine::retire: with transfers in flight, which FORCE
  // completes as cancelled). Idempotent.
  void close();

 private:
  ucp_ep_h h_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::unique_ptr<std::atomic<int>> failure_;  // the error handler's (stable across moves)
};

class UcpMemRegion {
 public:
  UcpMemRegion() = default;
  // Registers [address, address+bytes) with every memory domain of `context` that needs it, once,
  // so transfers of that memory skip per-call registration. `type` is the memory's type
  // (UCS_MEMORY_TYPE_HOST here); UCS_MEMORY_TYPE_UNKNOWN lets UCX detect it (e.g. CUDA memory).
  static StatusOr<UcpMemRegion> map(ucp_context_h context, void* address, size_t bytes,
                                    ucs_memory_type_t type);
  ~UcpMemRegion();
  UcpMemRegion(UcpMemRegion&& o) noexcept;
  UcpMemRegion& operator=(UcpMemRegion&& o) noexcept;
  UcpMemRegion(const UcpMemRegion&) = delete;
  UcpMemRegion& operator=(const UcpMemRegion&) = delete;

  ucp_mem_h get() const { return h_; }
  const void* address() const { return address_; }
  size_t bytes() const { return bytes_; }
  ucs_memory_type_t memoryType() const { return type_; }
  bool contains(const void* p, size_t n) const {
    auto* b = static_cast<const char*>(address_);
    auto* q = static_cast<const char*>(p);
    return h_ != nullptr && q >= b && q + n <= b + bytes_;
  }

 private:
  void release();
  ucp_context_h context_ = nullptr;
  ucp_mem_h h_ = nullptr;
  const void* address_ = nullptr;
  size_t bytes_ = 0;
  ucs_memory_type_t type_ = UCS_MEMORY_TYPE_HOST;
};

}  // namespace hsdp::ucx
