#include "collectives/ucx/ucx_resources.h"

#include <ucs/memory/memory_type.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "collectives/ucx/ucx_check.h"
#include "hsdp/log.h"

namespace hsdp::ucx {
namespace {

// How long a destructor keeps progressing an endpoint close before leaving it to the worker.
constexpr auto kCloseTimeout = std::chrono::seconds(2);

}  // namespace

// ---- context -----------------------------------------------------------------------------------

StatusOr<UcpContext> UcpContext::create(const ContextSettings& settings) {
  ucp_config_t* raw_config = nullptr;
  HSDP_UCX_CHECK(ucp_config_read(nullptr, nullptr, &raw_config));
  std::unique_ptr<ucp_config_t, void (*)(ucp_config_t*)> config(raw_config, ucp_config_release);
  const std::pair<const char*, const std::string*> overrides[] = {
      {"TLS", &settings.tls}, {"NET_DEVICES", &settings.net_devices}};
  for (const auto& [key, value] : overrides) {
    if (value->empty()) continue;
    ucs_status_t st = ucp_config_modify(config.get(), key, value->c_str());
    if (st != UCS_OK)
      return ucxError(st, "ucp_config_modify", __FILE__, __LINE__)
          .withContext(strCat("HSDP_UCX_", key, "='", *value, "'"));
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_TAG_SENDER_MASK | UCP_PARAM_FIELD_NAME;
  // WAKEUP: a waiting rank sleeps on the worker's event descriptor (Engine::progressUntil).
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  // The low 16 bits of every hsdp tag are the sender's rank (see ucx_comm.cc); telling UCX lets
  // it attribute unexpected messages to their sender.
  params.tag_sender_mask = 0xffffull;
  params.name = "hsdp";
  UcpContext c;
  ucs_status_t st = ucp_init(&params, config.get(), &c.h_);
  if (st != UCS_OK) {
    Status s = ucxError(st, "ucp_init", __FILE__, __LINE__);
    if (!settings.tls.empty())
      s = s.withContext(strCat("with HSDP_UCX_TLS='", settings.tls, "' (see `ucx_info -d`)"));
    return s;
  }
  return c;
}

UcpContext::~UcpContext() {
  if (h_ != nullptr) ucp_cleanup(h_);
}

UcpContext::UcpContext(UcpContext&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}

UcpContext& UcpContext::operator=(UcpContext&& o) noexcept {
  if (this != &o) {
    if (h_ != nullptr) ucp_cleanup(h_);
    h_ = std::exchange(o.h_, nullptr);
  }
  return *this;
}

std::string UcpContext::memoryTypeNames() const {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (h_ == nullptr || ucp_context_query(h_, &attr) != UCS_OK) return "?";
  std::string out;
  for (int t = 0; t < UCS_MEMORY_TYPE_LAST; ++t) {
    if (!(attr.memory_types & (1ull << t))) continue;
    if (!out.empty()) out += ", ";
    out += ucs_memory_type_names[t];
  }
  return out;
}

// ---- worker ------------------------------------------------------------------------------------

StatusOr<UcpWorker> UcpWorker::create(ucp_context_h context) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // SERIALIZED, not SINGLE: with the progress thread (core/progress.h) the worker is used
  // from two threads, never at once (every hsdp entry point holds progressLock()).
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  UcpWorker w;
  HSDP_UCX_CHECK(ucp_worker_create(context, &params, &w.h_));
  return w;
}

UcpWorker::~UcpWorker() {
  if (h_ != nullptr) ucp_worker_destroy(h_);
}

UcpWorker::UcpWorker(UcpWorker&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}

UcpWorker& UcpWorker::operator=(UcpWorker&& o) noexcept {
  if (this != &o) {
    if (h_ != nullptr) ucp_worker_destroy(h_);
    h_ = std::exchange(o.h_, nullptr);
  }
  return *this;
}

StatusOr<std::vector<uint8_t>> UcpWorker::address() const {
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  HSDP_UCX_CHECK(ucp_worker_get_address(h_, &addr, &len));
  auto* bytes = reinterpret_cast<const uint8_t*>(addr);
  std::vector<uint8_t> out(bytes, bytes + len);
  ucp_worker_release_address(h_, addr);
  return out;
}

// ---- endpoint ----------------------------------------------------------------------------------

StatusOr<UcpEndpoint> UcpEndpoint::connect(ucp_worker_h worker, const uint8_t* address,
                                           bool remote) {
  UcpEndpoint e;
  e.worker_ = worker;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(address);
  // Same host: NONE, as Open MPI's pml ucx does: UCX 1.13 leaves out its shared-memory
  // transports (sysv, posix, cma) from endpoints with peer-failure handling (PEER), so same-host
  // peers would talk over tcp loopback; a failed same-host peer ends the job through mpirun (or
  // the watchdog), as with MPI. Another host: PEER, which costs nothing there (the network
  // transports support it) and turns a peer's death or a cut link into an error status on the
  // transfers to it, which the collective reports naming the peer; with NONE, UCX aborts this
  // process on the connection reset, and the job's first report names the wrong rank.
  params.err_mode = remote ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
  if (remote) {
    // Records the failure for failure() (the collectives in flight name the peer from it); UCX
    // logs an error for a failed endpoint without a handler.
    e.failure_ = std::make_unique<std::atomic<int>>(UCS_OK);
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t st) {
      static_cast<std::atomic<int>*>(arg)->store(st, std::memory_order_relaxed);
    };
    params.err_handler.arg = e.failure_.get();
  }
  HSDP_UCX_CHECK(ucp_ep_create(worker, &params, &e.h_));
  return e;
}

void UcpEndpoint::close() {
  if (h_ == nullptr) return;
  // FORCE: release the endpoint without a handshake. Endpoints close only when the process's
  // UCX engine goes (no collective in flight), usually at exit, when peers have moved on to
  // MPI_Finalize or have exited: a flushing close then waits for them and, on tcp, ends in
  // "Endpoint timeout" errors. UCX documents FORCE for PEER mode because a peer still using the
  // connection would see transport errors; with nothing in flight there is nothing to see, and
  // it is what ucp_worker_destroy does to endpoints left open.
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(h_, &params);
  if (UCS_PTR_IS_PTR(req)) {
    const auto deadline = std::chrono::steady_clock::now() + kCloseTimeout;
    while (ucp_request_check_status(req) == UCS_INPROGRESS) {
      ucp_worker_progress(worker_);
      if (std::chrono::steady_clock::now() > deadline) {
        HSDP_WARN(kColl, "ucx: closing an endpoint did not complete within ",
                  std::chrono::seconds(kCloseTimeout).count(), " s; left to the worker's teardown");
        break;
      }
    }
    ucp_request_free(req);  // released by UCX on completion if still in progress
  }
  h_ = nullptr;
}

UcpEndpoint::~UcpEndpoint() { close(); }

UcpEndpoint::UcpEndpoint(UcpEndpoint&& o) noexcept
    : h_(std::exchange(o.h_, nullptr)),
      worker_(std::exchange(o.worker_, nullptr)),
      failure_(std::move(o.failure_)) {}

UcpEndpoint& UcpEndpoint::operator=(UcpEndpoint&& o) noexcept {
  if (this != &o) {
    close();
    h_ = std::exchange(o.h_, nullptr);
    worker_ = std::exchange(o.worker_, nullptr);
    failure_ = std::move(o.failure_);
  }
  return *this;
}

std::string UcpEndpoint::describe() const {
  if (h_ == nullptr) return "(no endpoint)";
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (f == nullptr) return "(open_memstream failed)";
  ucp_ep_print_info(h_, f);
  std::fclose(f);
  std::string out(text, len);
  std::free(text);
  return out;
}

// ---- registered memory -------------------------------------------------------------------------

StatusOr<UcpMemRegion> UcpMemRegion::map(ucp_context_h context, void* address, size_t bytes,
                                         ucs_memory_type_t type) {
  UcpMemRegion r;
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = address;
  params.length = bytes;
  if (type != UCS_MEMORY_TYPE_UNKNOWN) {
    params.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.memory_type = type;
  }
  HSDP_UCX_CHECK(ucp_mem_map(context, &params, &r.h_));
  r.context_ = context;
  r.address_ = address;
  r.bytes_ = bytes;
  // What UCX found (or was told): for UNKNOWN this is its detection, e.g. CUDA on GPU hosts.
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_MEM_TYPE;
  r.type_ = ucp_mem_query(r.h_, &attr) == UCS_OK ? attr.mem_type : type;
  return r;
}

void UcpMemRegion::release() {
  if (h_ != nullptr) {
    ucs_status_t st = ucp_mem_unmap(context_, h_);
    if (st != UCS_OK)
      HSDP_WARN(kColl, "ucx: ucp_mem_unmap of ", bytes_, " bytes failed: ", ucs_status_string(st));
  }
  h_ = nullptr;
}

UcpMemRegion::~UcpMemRegion() { release(); }

UcpMemRegion::UcpMemRegion(UcpMemRegion&& o) noexcept
    : context_(std::exchange(o.context_, nullptr)),
      h_(std::exchange(o.h_, nullptr)),
      address_(std::exchange(o.address_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      type_(o.type_) {}

UcpMemRegion& UcpMemRegion::operator=(UcpMemRegion&& o) noexcept {
  if (this != &o) {
    release();
    context_ = std::exchange(o.context_, nullptr);
    h_ = std::exchange(o.h_, nullptr);
    address_ = std::exchange(o.address_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    type_ = o.type_;
  }
  return *this;
}

}  // namespace hsdp::ucx
