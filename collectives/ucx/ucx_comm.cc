// The UCX transport's collectives: each starts a CollectiveOp (ucx_collective_op.h), which
// executes a Schedule (schedule.h) with tagged UCP messages; communicators are built in
// ucx_create.cc, the shared state is in ucx_internal.h.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "collectives/ucx/ucx_check.h"
#include "collectives/ucx/ucx_collective_op.h"
#include "collectives/ucx/ucx_internal.h"
#include "core/progress.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/transport_registry.h"

namespace hsdp::ucx {

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
