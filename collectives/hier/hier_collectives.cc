#include "hsdp/hier_collectives.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/progress.h"
#include "collectives/scratch_pool.h"
#include "hsdp/log.h"

namespace hsdp {
namespace {

void convert(const void* src, DType from, void* dst, DType to, size_t n) {
  if (from == to) {
    std::memcpy(dst, src, n * dtypeSize(from));
  } else if (from == DType::kFloat32 && to == DType::kBFloat16) {
    auto* s = static_cast<const float*>(src);
    auto* d = static_cast<bf16*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = toBf16(s[i]);
  } else {  // bf16 -> float32
    auto* s = static_cast<const bf16*>(src);
    auto* d = static_cast<float*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = toFloat(s[i]);
  }
}

// Chunk c of `count` elements cut into `chunks` nearly equal parts (the first count % chunks
// parts are one longer), so any chunk count works with any size.
std::pair<size_t, size_t> chunkRange(size_t count, size_t chunks, size_t c) {
  const size_t base = count / chunks, extra = count % chunks;
  const size_t off = c * base + std::min(c, extra);
  return {off, base + (c < extra ? 1 : 0)};
}

}  // namespace

// A schedule of sub-communicator operations, advanced by the process-wide progress loop.
class ScheduleWork : public ProgressiveWork {
 public:
  ScheduleWork(HierarchicalCollectives& h, HostBuffer* slot) : h_(h), slot_(slot) {
    h_.issuing_.push_back(this);
  }
  ~ScheduleWork() override { h_.doneIssuing(this); }

 protected:
  // Runs step() until it makes no more progress; converts failures into the Work's status.
  void advance() final {
    for (int guard = 0; guard < 64; ++guard) {
      StatusOr<bool> moved = step();
      if (!moved.ok()) return complete(moved.status());
      if (done()) return;
      if (!*moved) return;
    }
  }
  // One pass over the schedule; true if anything changed.
  virtual StatusOr<bool> step() = 0;

  void complete(Status s) {
    h_.doneIssuing(this);
    if (slot_ != nullptr) h_.pool_->release(slot_);
    slot_ = nullptr;
    finish(std::move(s));
  }
  // Tests an in-flight sub-operation; true (and resets it) once complete.
  static StatusOr<bool> finished(WorkHandle& w) {
    if (!w) return false;
    HSDP_ASSIGN_OR_RETURN(bool ok, isComplete(*w));
    if (ok) w.reset();
    return ok;
  }

  HierarchicalCollectives& h_;
  HostBuffer* slot_;
};

namespace {

enum ChunkState { kPending, kInterBusy, kInterDone, kIntraBusy, kDone };

}  // namespace

// all-gather: chunk c goes inter (shard chunk -> A[c%2], J pieces), then intra (A -> B, I*J
// pieces), then B is unpacked into the full buffer at (i*J + j)*count + offset.
class PipelinedAllGather final : public ScheduleWork {
 public:
  PipelinedAllGather(HierarchicalCollectives& h, HostBuffer* slot, const void* shard, void* full,
                     size_t count, DType dtype)
      : ScheduleWork(h, slot), shard_(static_cast<const char*>(shard)),
        full_(static_cast<char*>(full)), count_(count), dtype_(dtype),
        wire_(h.options().inter_dtype == DType::kBFloat16 && dtype == DType::kFloat32
                  ? DType::kBFloat16 : dtype),
        I_(h.intra_.size()), J_(h.inter_.size()), C_(h.chunkCount(count)), state_(C_, kPending),
        works_(C_) {
    const size_t nmax = chunkRange(count_, C_, 0).second, es = dtypeSize(dtype_);
    char* p = slot->as<char>();
    // Carved exactly as stagingBytes() sizes it: wire-type stages only when they exist.
    const size_t w = wire_ != dtype_ ? 2 : 0;
    for (int b = 0; b < 2; ++b) {
      A_[b] = p, p += J_ * nmax * es;
      B_[b] = p, p += I_ * J_ * nmax * es;
      S16_[b] = p, p += nmax * w;
      A16_[b] = p, p += J_ * nmax * w;
    }
    advance();
  }
  ~PipelinedAllGather() override { waitForDestruction(); }

 private:
  StatusOr<bool> step() override {
    bool moved = false;
    const size_t es = dtypeSize(dtype_);
    for (size_t c = 0; c < C_; ++c) {
      if (state_[c] != kInterBusy && state_[c] != kIntraBusy) continue;
      HSDP_ASSIGN_OR_RETURN(bool ok, finished(works_[c]));
      if (!ok) continue;
      moved = true;
      auto [off, n] = chunkRange(count_, C_, c);
      if (state_[c] == kInterBusy) {
        if (wire_ != dtype_) convert(A16_[c % 2], wire_, A_[c % 2], dtype_, J_ * n);
        state_[c] = kInterDone;
      } else {
        const char* b = B_[c % 2];
        for (size_t k = 0; k < I_ * J_; ++k)
          std::memcpy(full_ + (k * count_ + off) * es, b + k * n * es, n * es);
        state_[c] = kDone;
        ++done_chunks_;
      }
    }
    if (done_chunks_ == C_) {
      complete(Status());
      return true;
    }
    if (!h_.mayIssue(this)) return moved;
    // Inter phase: chunk order, one on the wire at a time, when its staging pair is free.
    while (next_inter_ < C_) {
      const size_t c = next_inter_;
      if (c > 0 && state_[c - 1] < kInterDone) break;
      if (c >= 2 && state_[c - 2] != kDone) break;
      auto [off, n] = chunkRange(count_, C_, c);
      if (wire_ != dtype_) {
        convert(shard_ + off * es, dtype_, S16_[c % 2], wire_, n);
        HSDP_ASSIGN_OR_RETURN(works_[c], h_.inter_.iallGather(S16_[c % 2], A16_[c % 2], n, wire_));
      } else {
        HSDP_ASSIGN_OR_RETURN(works_[c], h_.inter_.iallGather(shard_ + off * es, A_[c % 2], n, dtype_));
      }
      state_[c] = kInterBusy;
      ++next_inter_;
      moved = true;
    }
    // Intra phase: chunk order, as soon as the chunk's inter phase has landed.
    while (next_intra_ < C_ && state_[next_intra_] == kInterDone) {
      const size_t c = next_intra_;
      auto [off, n] = chunkRange(count_, C_, c);
      HSDP_ASSIGN_OR_RETURN(works_[c], h_.intra_.iallGather(A_[c % 2], B_[c % 2], J_ * n, dtype_));
      state_[c] = kIntraBusy;
      ++next_intra_;
      moved = true;
    }
    if (next_intra_ == C_) h_.doneIssuing(this);
    return moved;
  }

  const char* shard_;
  char* full_;
  size_t count_;
  DType dtype_, wire_;
  size_t I_, J_, C_;
  std::vector<ChunkState> state_;
  std::vector<WorkHandle> works_;
  char* A_[2];
  char* B_[2];
  char* S16_[2];
  char* A16_[2];
  size_t next_inter_ = 0, next_intra_ = 0, done_chunks_ = 0;
};

// reduce-scatter: chunk c is packed from the full buffer (I*J pieces) into P, reduced inside the
// node (P -> Q, J pieces), then across nodes (Q -> shard chunk).
class PipelinedReduceScatter final : public ScheduleWork {
 public:
  PipelinedReduceScatter(HierarchicalCollectives& h, HostBuffer* slot, const void* full,
                         void* shard, size_t count, DType dtype, RedOp op)
      : ScheduleWork(h, slot), full_(static_cast<const char*>(full)),
        shard_(static_cast<char*>(shard)), count_(count), dtype_(dtype), op_(op),
        wire_(h.options().inter_dtype == DType::kBFloat16 && dtype == DType::kFloat32
                  ? DType::kBFloat16 : dtype),
        I_(h.intra_.size()), J_(h.inter_.size()), C_(h.chunkCount(count)), state_(C_, kPending),
        works_(C_) {
    const size_t nmax = chunkRange(count_, C_, 0).second, es = dtypeSize(dtype_);
    char* p = slot->as<char>();
    const size_t w = wire_ != dtype_ ? 2 : 0;
    for (int b = 0; b < 2; ++b) {
      P_[b] = p, p += I_ * J_ * nmax * es;
      Q_[b] = p, p += J_ * nmax * es;
      Q16_[b] = p, p += J_ * nmax * w;
      R16_[b] = p, p += nmax * w;
    }
    advance();
  }
  ~PipelinedReduceScatter() override { waitForDestruction(); }

 private:
  StatusOr<bool> step() override {
    bool moved = false;
    const size_t es = dtypeSize(dtype_);
    for (size_t c = 0; c < C_; ++c) {
      if (state_[c] != kInterBusy && state_[c] != kIntraBusy) continue;
      HSDP_ASSIGN_OR_RETURN(bool ok, finished(works_[c]));
      if (!ok) continue;
      moved = true;
      auto [off, n] = chunkRange(count_, C_, c);
      if (state_[c] == kIntraBusy) {
        state_[c] = kInterDone;  // here: "intra done, ready for the inter phase"
      } else {
        if (wire_ != dtype_) convert(R16_[c % 2], wire_, shard_ + off * es, dtype_, n);
        state_[c] = kDone;
        ++done_chunks_;
      }
    }
    if (done_chunks_ == C_) {
      complete(Status());
      return true;
    }
    if (!h_.mayIssue(this)) return moved;
    // Intra phase: chunk order, one at a time, when the staging pair is free again.
    while (next_intra_ < C_) {
      const size_t c = next_intra_;
      if (c > 0 && state_[c - 1] < kInterDone) break;
      if (c >= 2 && state_[c - 2] != kDone) break;
      auto [off, n] = chunkRange(count_, C_, c);
      char* p = P_[c % 2];
      for (size_t k = 0; k < I_ * J_; ++k)
        std::memcpy(p + k * n * es, full_ + (k * count_ + off) * es, n * es);
      HSDP_ASSIGN_OR_RETURN(works_[c], h_.intra_.ireduceScatter(p, Q_[c % 2], J_ * n, dtype_, op_));
      state_[c] = kIntraBusy;
      ++next_intra_;
      moved = true;
    }
    // Inter phase: chunk order, once the chunk's intra reduction is complete.
    while (next_inter_ < C_ && state_[next_inter_] == kInterDone) {
      const size_t c = next_inter_;
      auto [off, n] = chunkRange(count_, C_, c);
      if (wire_ != dtype_) {
        convert(Q_[c % 2], dtype_, Q16_[c % 2], wire_, J_ * n);
        HSDP_ASSIGN_OR_RETURN(works_[c], h_.inter_.ireduceScatter(Q16_[c % 2], R16_[c % 2], n, wire_, op_));
      } else {
        HSDP_ASSIGN_OR_RETURN(works_[c], h_.inter_.ireduceScatter(Q_[c % 2], shard_ + off * es, n, dtype_, op_));
      }
      state_[c] = kInterBusy;
      ++next_inter_;
      moved = true;
    }
    if (next_inter_ == C_) h_.doneIssuing(this);
    return moved;
  }

  const char* full_;
  char* shard_;
  size_t count_;
  DType dtype_;
  RedOp op_;
  DType wire_;
  size_t I_, J_, C_;
  std::vector<ChunkState> state_;
  std::vector<WorkHandle> works_;
  char* P_[2];
  char* Q_[2];
  char* Q16_[2];
  char* R16_[2];
  size_t next_intra_ = 0, next_inter_ = 0, done_chunks_ = 0;
};

// A schedule of phases that run one after another, each one sub-operation (the unpipelined
// two-phase forms and the all-reduce). A phase is issued only in this object's turn (start
// order), and the work completes when the last phase has.
class PhasedSchedule : public ScheduleWork {
 public:
  PhasedSchedule(HierarchicalCollectives& h, HostBuffer* slot, int phases)
      : ScheduleWork(h, slot), phases_(phases) {}

 protected:
  // Starts phase `p` (0-based).
  virtual StatusOr<WorkHandle> issue(int p) = 0;
  // Runs after the last phase completed (e.g. copies a staged result out).
  virtual void finishPhases() {}

 private:
  StatusOr<bool> step() final {
    if (work_) {
      HSDP_ASSIGN_OR_RETURN(bool ok, finished(work_));
      if (!ok) return false;
      ++phase_;
    }
    if (phase_ == phases_) {
      finishPhases();
      complete(Status());
      return true;
    }
    if (!h_.mayIssue(this)) return false;
    HSDP_ASSIGN_OR_RETURN(work_, issue(phase_));
    if (phase_ == phases_ - 1) h_.doneIssuing(this);
    return true;
  }

  int phases_;
  int phase_ = 0;
  WorkHandle work_;
};

// Unpipelined two-phase all-gather (one chunk, one wire type): lands in place, no staging.
class TwoPhaseAllGather final : public PhasedSchedule {
 public:
  TwoPhaseAllGather(HierarchicalCollectives& h, const void* shard, void* full, size_t count,
                    DType dtype)
      : PhasedSchedule(h, nullptr, 2), shard_(shard), full_(full), count_(count), dtype_(dtype) {
    block_ = static_cast<char*>(full) +
             static_cast<size_t>(h.intra_.rank()) * h.inter_.size() * count * dtypeSize(dtype);
    advance();
  }
  ~TwoPhaseAllGather() override { waitForDestruction(); }

 private:
  StatusOr<WorkHandle> issue(int p) override {
    if (p == 0) return h_.inter_.iallGather(shard_, block_, count_, dtype_);
    return h_.intra_.iallGather(block_, full_, h_.inter_.size() * count_, dtype_);
  }

  const void* shard_;
  void* full_;
  char* block_;
  size_t count_;
  DType dtype_;
};

// Unpipelined two-phase reduce-scatter: stages only the intra phase's J-shard result.
class TwoPhaseReduceScatter final : public PhasedSchedule {
 public:
  TwoPhaseReduceScatter(HierarchicalCollectives& h, HostBuffer* slot, const void* full,
                        void* shard, size_t count, DType dtype, RedOp op)
      : PhasedSchedule(h, slot, 2), full_(full), shard_(shard), count_(count), dtype_(dtype),
        op_(op) {
    advance();
  }
  ~TwoPhaseReduceScatter() override { waitForDestruction(); }

 private:
  StatusOr<WorkHandle> issue(int p) override {
    if (p == 0)
      return h_.intra_.ireduceScatter(full_, slot_->data(), h_.inter_.size() * count_, dtype_, op_);
    return h_.inter_.ireduceScatter(slot_->data(), shard_, count_, dtype_, op_);
  }

  const void* full_;
  void* shard_;
  size_t count_;
  DType dtype_;
  RedOp op_;
};

// all-reduce: copy into a buffer padded to I*m, intra reduce-scatter (m each), inter all-reduce
// of the m-element piece, intra all-gather, copy back.
class HierAllReduce final : public PhasedSchedule {
 public:
  HierAllReduce(HierarchicalCollectives& h, HostBuffer* slot, void* buf, size_t count,
                DType dtype, RedOp op)
      : PhasedSchedule(h, slot, 3), buf_(buf), count_(count), dtype_(dtype), op_(op) {
    const size_t I = h.intra_.size(), es = dtypeSize(dtype);
    m_ = (count + I - 1) / I;
    padded_ = slot->as<char>();
    piece_ = padded_ + I * m_ * es;
    std::memcpy(padded_, buf, count * es);
    std::memset(padded_ + count * es, 0, (I * m_ - count) * es);
    advance();
  }
  ~HierAllReduce() override { waitForDestruction(); }

 private:
  StatusOr<WorkHandle> issue(int p) override {
    const size_t es = dtypeSize(dtype_);
    if (p == 0) return h_.intra_.ireduceScatter(padded_, piece_, m_, dtype_, op_);
    if (p == 1) return h_.inter_.iallReduce(piece_, m_, dtype_, op_);
    char* mine = padded_ + h_.intra_.rank() * m_ * es;
    std::memcpy(mine, piece_, m_ * es);
    return h_.intra_.iallGather(mine, padded_, m_, dtype_);
  }
  void finishPhases() override { std::memcpy(buf_, padded_, count_ * dtypeSize(dtype_)); }

  void* buf_;
  size_t count_;
  DType dtype_;
  RedOp op_;
  size_t m_ = 0;
  char* padded_;
  char* piece_;
};

HierarchicalCollectives::HierarchicalCollectives(Comm& intra, Comm& inter, HierOptions options)
    : intra_(intra), inter_(inter), options_(options), pool_(std::make_unique<ScratchPool>()) {}

HierarchicalCollectives::~HierarchicalCollectives() = default;

size_t HierarchicalCollectives::scratchBytes() const { return pool_->totalBytes(); }

Status HierarchicalCollectives::setOptions(HierOptions options) {
  if (options.chunks < 1) return invalidArgument("pipeline chunks ", options.chunks, " must be >= 1");
  if (options.inter_dtype != DType::kFloat32 && options.inter_dtype != DType::kBFloat16)
    return invalidArgument("inter-node dtype ", dtypeName(options.inter_dtype),
                           " is not float or bf16");
  options_ = options;
  return okStatus();
}

size_t HierarchicalCollectives::chunkCount(size_t count) const {
  return std::max<size_t>(1, std::min<size_t>(options_.chunks, count));
}

bool HierarchicalCollectives::pipelined(size_t count, DType dtype) const {
  return chunkCount(count) > 1 || wireType(dtype) != dtype;
}

DType HierarchicalCollectives::wireType(DType dtype) const {
  return options_.inter_dtype == DType::kBFloat16 && dtype == DType::kFloat32 ? DType::kBFloat16
                                                                              : dtype;
}

size_t HierarchicalCollectives::stagingBytes(size_t count, DType dtype) const {
  const size_t I = intra_.size(), J = inter_.size(), es = dtypeSize(dtype);
  if (!pipelined(count, dtype)) return J * count * es;  // two-phase reduce-scatter's middle
  const size_t nmax = (count + chunkCount(count) - 1) / chunkCount(count);
  const size_t wire = wireType(dtype) != dtype ? (J + 1) * nmax * 2 : 0;
  return 2 * ((I * J + J) * nmax * es + wire);
}

size_t HierarchicalCollectives::allReduceBytes(size_t count, DType dtype) const {
  const size_t I = intra_.size(), m = (count + I - 1) / I;  // padded copy plus one piece
  return (I + 1) * m * dtypeSize(dtype);
}

void HierarchicalCollectives::doneIssuing(const void* w) {
  issuing_.erase(std::remove(issuing_.begin(), issuing_.end(), w), issuing_.end());
}

Status HierarchicalCollectives::reserve(size_t max_count, DType dtype) {
  const size_t es = dtypeSize(dtype);
  HSDP_RETURN_IF_ERROR(pool_->reserve(stagingBytes(max_count, dtype)));
  const size_t chunk = (max_count + chunkCount(max_count) - 1) / chunkCount(max_count);
  HSDP_RETURN_IF_ERROR(intra_.reserveScratch(inter_.size() * std::max(chunk, max_count) * es));
  HSDP_RETURN_IF_ERROR(inter_.reserveScratch(max_count * es));
  return okStatus();
}

StatusOr<WorkHandle> HierarchicalCollectives::iallGather(const void* shard, void* full,
                                                         size_t count, DType dtype) {
  const size_t es = dtypeSize(dtype);
  const bool same_wire = options_.inter_dtype == dtype || dtype != DType::kFloat32 ||
                         inter_.size() == 1;
  if (issuing_.empty() && same_wire && (intra_.size() == 1 || inter_.size() == 1)) {
    // One level only: the sub-communicator's own collective lands shards in place.
    if (inter_.size() > 1) return inter_.iallGather(shard, full, count, dtype);
    (void)es;
    return intra_.iallGather(shard, full, count, dtype);
  }
  if (!pipelined(count, dtype))
    return WorkHandle(std::make_unique<TwoPhaseAllGather>(*this, shard, full, count, dtype));
  HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(stagingBytes(count, dtype)));
  return WorkHandle(std::make_unique<PipelinedAllGather>(*this, slot, shard, full, count, dtype));
}

StatusOr<WorkHandle> HierarchicalCollectives::ireduceScatter(const void* full, void* shard,
                                                             size_t count, DType dtype, RedOp op) {
  const bool same_wire = options_.inter_dtype == dtype || dtype != DType::kFloat32 ||
                         inter_.size() == 1;
  if (issuing_.empty() && same_wire && (intra_.size() == 1 || inter_.size() == 1)) {
    if (intra_.size() == 1) return inter_.ireduceScatter(full, shard, count, dtype, op);
    return intra_.ireduceScatter(full, shard, count, dtype, op);
  }
  HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(stagingBytes(count, dtype)));
  if (!pipelined(count, dtype))
    return WorkHandle(
        std::make_unique<TwoPhaseReduceScatter>(*this, slot, full, shard, count, dtype, op));
  return WorkHandle(
      std::make_unique<PipelinedReduceScatter>(*this, slot, full, shard, count, dtype, op));
}

StatusOr<WorkHandle> HierarchicalCollectives::iallReduce(void* buf, size_t count, DType dtype,
                                                         RedOp op) {
  HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(allReduceBytes(count, dtype)));
  return WorkHandle(std::make_unique<HierAllReduce>(*this, slot, buf, count, dtype, op));
}

Status HierarchicalCollectives::allGather(const void* shard, void* full, size_t count,
                                          DType dtype) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, iallGather(shard, full, count, dtype));
  return w->wait();
}

Status HierarchicalCollectives::reduceScatter(const void* full, void* shard, size_t count,
                                              DType dtype, RedOp op) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, ireduceScatter(full, shard, count, dtype, op));
  return w->wait();
}

Status HierarchicalCollectives::allReduce(void* buf, size_t count, DType dtype, RedOp op) {
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, iallReduce(buf, count, dtype, op));
  return w->wait();
}

}  // namespace hsdp
