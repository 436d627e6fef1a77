// A unit's reduce-scatter, then its replica all-reduce in chunks, driven by the progress loop
// (reduce_chain.h).
#include "engine/reduce_chain.h"

#include <algorithm>
#include <utility>

#include "engine/trace.h"
#include "engine/unit_collectives.h"
#include "hsdp/watchdog.h"

namespace hsdp::engine {

ReduceChain::ReduceChain(UnitCollectives& coll, WorkHandle scatter, float* shard, size_t count,
                         size_t chunk, float* residual, std::string label, uint64_t seq)
    : coll_(coll),
      scatter_(std::move(scatter)),
      shard_(shard),
      count_(count),
      chunk_(chunk == 0 || residual != nullptr ? count : std::min(chunk, count)),
      residual_(residual),
      label_(std::move(label)),
      seq_(seq) {}

ReduceChain::~ReduceChain() { waitForDestruction(); }

namespace {
class ChainView final : public Work {
 public:
  explicit ChainView(Work& w) : w_(w) {}
  Status wait() override { return w_.wait(); }
  StatusOr<bool> test() override { return w_.test(); }

 private:
  Work& w_;
};
}  // namespace

WorkHandle ReduceChain::view() { return std::make_unique<ChainView>(*this); }

bool ReduceChain::scatterLanded() const {
  auto lock = progressLock();
  return landed_;
}

Status ReduceChain::issueNext() {
  if (!coll_.replicaTurn(seq_)) return okStatus();  // an earlier unit's chunks go first
  if (count_ == 0) {
    coll_.replicaIssued(seq_);
    return okStatus();
  }
  // By need: a chunk already on the link keeps it busy; more wait for the gathers in flight.
  if (inflight_[0] && coll_.crossNodeGatherInFlight()) return okStatus();
  for (WorkHandle& slot : inflight_) {
    if (slot || issued_ == count_) continue;
    const size_t n = std::min(chunk_, count_ - issued_);
    watchdog::Label label(label_, "replica group");
    HSDP_ASSIGN_OR_RETURN(slot, coll_.replicaReduce(shard_ + issued_, n, residual_));
    if (issued_ == 0) replica_issued_us_ = Tracer::nowUs();
    issued_ += n;
    if (issued_ == count_) coll_.replicaIssued(seq_);
  }
  return okStatus();
}

void ReduceChain::advance() {
  if (!landed_) {
    StatusOr<bool> r = isComplete(*scatter_);
    if (!r.ok()) return finish(r.status());
    if (!*r) return;
    landed_ = true;
    landed_us_ = Tracer::nowUs();
    scatter_.reset();
  }
  for (;;) {  // retire the oldest chunk while done, refilling the window
    Status s = issueNext();
    if (!s.ok()) return finish(s.withContext("replica all-reduce"));
    if (!inflight_[0]) break;
    StatusOr<bool> r = isComplete(*inflight_[0]);
    if (!r.ok()) return finish(r.status());
    if (!*r) return;
    inflight_[0] = std::move(inflight_[1]);
  }
  if (issued_ == count_) finish(okStatus());
}

}  // namespace hsdp::engine
