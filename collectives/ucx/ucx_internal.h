// Private to collectives/ucx/: what the UCX transport's files share: the tag layout, the
// scratch slots and the communicator's state (UcxComm::State). ucx_create.cc builds
// communicators, ucx_comm.cc runs their collectives (CollectiveOp executes a Schedule).
#pragma once

#include <ucp/api/ucp.h>
#include <ucs/memory/memory_type.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/ucx/schedule.h"
#include "collectives/ucx/ucx_comm.h"
#include "collectives/ucx/ucx_engine.h"
#include "collectives/ucx/ucx_resources.h"
#include "core/host_buffer.h"
#include "hsdp/log.h"

namespace hsdp::ucx {

// Tag layout, 16 bits each from the top: communicator id | collective sequence number (mod 2^16)
// | message id within the collective | sender rank. Receives match all 64 bits, so a message can
// only land in the receive posted for it, whatever else is in flight on the worker. The
// sequence number wraps, which is safe while fewer than 65536 collectives of one communicator
// are in flight at once. Communicator ids: the low half for communicators built over a bootstrap
// (agreed through it), the high half (kAddressedBit set) for those built from addresses
// (createUcxCommFromAddresses: the id its members were given), so the two never share a tag.
constexpr uint64_t kFullMask = ~0ull;
constexpr uint32_t kMaxCommIds = 1u << 15;
constexpr uint32_t kAddressedBit = 1u << 15;
// Sender ranks need 16 bits, and the ring all-reduce uses 2(n-1) message ids.
constexpr int kMaxRanks = 1 << 15;

// A communicator built from addresses that aborts tells its members with one empty message of
// this sequence and message number (no collective uses both), matched by comm id alone.
constexpr uint32_t kAbortNotice = 0xffff;
constexpr uint64_t kNoticeMask = ~0xffffull;  // every field but the sender
inline uint64_t makeTag(uint32_t comm, uint32_t seq, uint32_t msg, int sender) {
  return (static_cast<uint64_t>(comm & 0xffff) << 48) |
         (static_cast<uint64_t>(seq & 0xffff) << 32) | (static_cast<uint64_t>(msg & 0xffff) << 16) |
         static_cast<uint64_t>(sender & 0xffff);
}

// Every buffer this transport moves is host memory, and saying so spares UCX a memory-type
// lookup per request. The GPU path replaces this with UCS_MEMORY_TYPE_UNKNOWN (UCX detects
// CUDA memory itself) and runs the Schedule's local ops on the device (see ucx_comm.h).
constexpr ucs_memory_type_t kHostMemory = UCS_MEMORY_TYPE_HOST;

// The first scratch slot covers the small algorithms (at most 2 * small_bytes: the
// recursive-doubling reduce-scatter's working copy and partner buffer), capped so that a large
// HSDP_UCX_SMALL_BYTES does not pre-fault a large buffer on every communicator up front.
inline size_t initialSlotBytes(const UcxOptions& options) {
  constexpr size_t kMinSlot = 4096, kMaxInitialSlot = size_t(4) << 20;
  return std::clamp(2 * options.small_bytes, kMinSlot, kMaxInitialSlot);
}

// One scratch buffer of the pool, registered once for as long as it lives.
struct ScratchSlot {
  HostBuffer buffer;
  UcpMemRegion region;  // declared after `buffer`: unregistered before the memory is freed
  bool busy = false;
};

class CollectiveOp;  // ucx_comm.cc: one collective in flight

// Registers "ucx" as a peer transport (hsdp/transport_registry.h): createFromAddresses.
void registerPeerUcx();

struct UcxComm::State {
  std::shared_ptr<Engine> engine;  // first: outlives the endpoints and regions below
  std::unique_ptr<Comm> bootstrap;
  UcxOptions options;
  int rank = 0;
  int size = 1;
  uint32_t id = 0;
  uint32_t seq = 0;
  // The communicator's bytesSent() counter: every send a schedule posts adds its bytes.
  std::atomic<uint64_t>* sent = nullptr;
  // By rank, owned by the engine and shared with every other communicator reaching the same
  // peers (Engine::endpointTo); our own stays null: no algorithm sends to itself.
  std::vector<const UcpEndpoint*> eps;
  // Built from addresses (no bootstrap): peer-failure handling, abort notices, drain().
  // Its endpoints are the engine's too, one per peer worker for as long as it has not failed,
  // and no abort closes them: UCX 1.13 over tcp pairs the endpoints two workers create to each
  // other by their order of creation, so a set of endpoints created on one side only (an
  // attempt a stopped peer never joined, a heal a peer never reached) left every later pair of
  // that side crosswise, and closing either of a crosswise pair cancelled the other's transfers
  // ("Request canceled") or tripped an assertion in UCX's tcp transport (docs/elastic.md).
  bool addressed = false;
  uint32_t splits = 0;  // splitAddressed() calls so far: the next part's id is id + 1 + splits
  std::vector<std::unique_ptr<ScratchSlot>> scratch;
  size_t slot_bytes = 0;  // size of a new slot: reserveScratch's promise, or the small paths'
  std::vector<UcpMemRegion> registered;  // registerMemory()
  std::vector<CollectiveOp*> in_flight;  // started and not finished; owned by the engine/Work
  uint8_t token = 0;                     // the barrier's (empty) message buffer
  std::vector<int32_t> notice;  // an abort notice's payload: the members this one found failed

  std::vector<int> world;  // world ranks by rank, from the watchdog's trace (empty: untraced)

  // Built from addresses (no bootstrap): how each member is named in errors, the deadline
  // without progress (<= 0: none) and abort()'s flag and reason (set from any thread).
  std::vector<std::string> labels;
  int64_t timeout_ms = 0;
  std::vector<int> suspects;  // members a failure named (peer failure, deadline), in order
  std::atomic<bool> aborted{false};
  std::mutex abort_mu;
  std::string abort_reason;

  std::string describe() const { return strCat("comm ", id, ", rank ", rank, " of ", size); }
  std::string peerName(int p) const {
    if (!labels.empty()) return labels[p];
    return world.empty() ? strCat("rank ", p) : strCat("rank ", p, " (world rank ", world[p], ")");
  }
  Status abortedStatus(const char* what) {
    std::lock_guard<std::mutex> g(abort_mu);
    return Status(StatusCode::kAborted,
                  strCat("ucx ", what, " (", describe(), "): aborted: ", abort_reason));
  }

  ucp_mem_h memhFor(const void* p, size_t bytes) const {
    for (const auto& slot : scratch)
      if (slot->region.contains(p, bytes)) return slot->region.get();
    for (const UcpMemRegion& r : registered)
      if (r.contains(p, bytes)) return r.get();
    return nullptr;
  }

  StatusOr<std::unique_ptr<ScratchSlot>> newSlot(size_t bytes) {
    auto slot = std::make_unique<ScratchSlot>();
    HSDP_ASSIGN_OR_RETURN(slot->buffer, HostBuffer::allocate(bytes));
    HSDP_ASSIGN_OR_RETURN(slot->region, UcpMemRegion::map(engine->context(), slot->buffer.data(),
                                                          slot->buffer.size(), kHostMemory));
    return slot;
  }

  // A free slot of at least `bytes`. The pool grows when every slot is held by a collective in
  // flight (many outstanding handles) or when a collective needs more than was reserved.
  StatusOr<ScratchSlot*> acquireScratch(size_t bytes, const char* what) {
    for (auto& slot : scratch) {
      if (!slot->busy && slot->buffer.size() >= bytes) {
        slot->busy = true;
        return slot.get();
      }
    }
    if (bytes > slot_bytes) {
      // reserveScratch promises reduce-scatters of a size; like the MPI transport, growing for
      // one is a warning. Other collectives have no reserve contract (the MPI library allocates
      // for them itself): their one-time growth is information.
      if (std::strcmp(what, "reduceScatter") == 0)
        HSDP_WARN(kColl, "ucx ", what, " (", describe(), ") needs ", bytes,
                  " bytes of scratch, more than reserved (", slot_bytes,
                  "); growing on the hot path: call reserveScratch first");
      else
        HSDP_INFO(kColl, "ucx ", what, " (", describe(), ") grows scratch slots from ", slot_bytes,
                  " to ", bytes, " bytes, once");
      slot_bytes = bytes;
    } else {
      HSDP_INFO(kColl, "ucx ", describe(), ": ", in_flight.size(),
                " collectives in flight; scratch pool grows to ", scratch.size() + 1, " slots of ",
                slot_bytes, " bytes");
    }
    HSDP_ASSIGN_OR_RETURN(auto fresh, newSlot(slot_bytes));
    fresh->busy = true;
    // Replace a free slot that is too small rather than keep it around unused.
    for (auto& slot : scratch) {
      if (!slot->busy) {
        slot = std::move(fresh);
        return slot.get();
      }
    }
    scratch.push_back(std::move(fresh));
    return scratch.back().get();
  }

  template <typename Build>
  StatusOr<std::shared_ptr<CollectiveOp>> start(const char* name, Algorithm algorithm,
                                                size_t scratch_bytes, Build build);
  Status wait(CollectiveOp& op);
};

}  // namespace hsdp::ucx
