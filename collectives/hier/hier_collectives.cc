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
        I_(h.intra_.size()), J_(h.inter_.size()), C_(h.chunkCount(count, dtype)), state_(C_, kPending),
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
        I_(h.intra_.size()), J_(h.inter_.size()), C_(h.chunkCount(count, dtype)), state_(C_, kPending),
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

// all-reduce, pipelined. The buffer is cut into C chunks at multiples of the group size G = I*J
// (a chunk of m*G elements gives every rank m), and each chunk goes through four sub-collectives,
// two per level:
//   intra reduce-scatter (chunk -> Q, J*m), inter reduce-scatter (Q -> R, m),
//   inter all-gather (R -> Q, J*m, in place), intra all-gather (Q -> chunk, in place).
// Each node thus sends the all-reduce minimum across its link, 2*(J-1)/J of its data, while the
// intra phases of neighbouring chunks run. Chunks work in place in the user's buffer; only a
// last chunk that is not a multiple of G is staged, zero-padded, in P. Up to kSlots chunks are in
// flight, each with its own Q and R, so the link has the next chunk queued when one finishes.
//
// Both levels carry two kinds of operation, so the issue order on each communicator is fixed
// (identical on every rank, as nonblocking collectives require; see issueOrder()): the
// reduce-scatter of chunk c+L is issued before the all-gather of chunk c. Every operation waits
// only on operations earlier in that order or on the other level, so it cannot deadlock.
class PipelinedAllReduce final : public ScheduleWork {
 public:
  PipelinedAllReduce(HierarchicalCollectives& h, HostBuffer* slot, void* buf, size_t count,
                     DType dtype, RedOp op)
      : ScheduleWork(h, slot), buf_(static_cast<char*>(buf)), count_(count), dtype_(dtype),
        op_(op), I_(h.intra_.size()), J_(h.inter_.size()), G_(I_ * J_),
        units_((count + G_ - 1) / G_), C_(chunks(h, count, dtype)),
        m_(pieceCount(count, C_, G_)), order_(issueOrder(C_)), stage_(C_, 0), works_(C_) {
    const size_t es = dtypeSize(dtype_);
    char* p = slot->as<char>();
    P_ = p, p += G_ * m_ * es;
    for (size_t b = 0; b < kSlots; ++b) {
      Q_[b] = p, p += J_ * m_ * es;
      R_[b] = p, p += m_ * es;
    }
    advance();
  }
  ~PipelinedAllReduce() override { waitForDestruction(); }

  // Staging slots: chunks in flight at once (chunk c uses slot c % kSlots).
  static constexpr size_t kSlots = 4;

  static size_t chunks(const HierarchicalCollectives& h, size_t count, DType dtype) {
    const size_t g = static_cast<size_t>(h.groupSize());
    return h.chunkCount((count + g - 1) / g, dtype);
  }
  // Elements per rank in the largest chunk.
  static size_t pieceCount(size_t count, size_t chunks, size_t group) {
    return chunkRange((count + group - 1) / group, chunks, 0).second;
  }
  // Bytes of staging: the padded tail chunk P, and Q and R per slot.
  static size_t bytes(const HierarchicalCollectives& h, size_t count, DType dtype) {
    const size_t I = h.intra_.size(), J = h.inter_.size();
    const size_t m = pieceCount(count, chunks(h, count, dtype), I * J);
    return (I * J + kSlots * (J + 1)) * m * dtypeSize(dtype);
  }

 private:
  // Stages of a chunk: 0 not started; odd = that sub-collective in flight; even = it is done.
  //   1 intra RS, 3 inter RS, 5 inter AG, 7 intra AG, 8 done.
  enum : int { kIntraRs = 1, kInterRs = 3, kInterAg = 5, kIntraAg = 7, kAllDone = 8 };

  // The per-level issue order: RS0 .. RS(L-1), then AG0, RS(L), AG1, RS(L+1), ..., then the
  // remaining all-gathers; L = kSlots - 1 reduce-scatters run ahead of the all-gathers.
  static std::vector<std::pair<size_t, bool>> issueOrder(size_t chunks) {
    std::vector<std::pair<size_t, bool>> order;
    const size_t ahead = std::min<size_t>(kSlots - 1, chunks);
    for (size_t c = 0; c < ahead; ++c) order.emplace_back(c, true);
    for (size_t c = 0; c < chunks; ++c) {
      order.emplace_back(c, false);
      if (c + ahead < chunks) order.emplace_back(c + ahead, true);
    }
    return order;
  }

  // Chunk c: its first element, elements per rank, and where it is reduced (the user's buffer,
  // or P for a tail that is not a multiple of G).
  struct Chunk {
    size_t off, m;
    char* data;
    bool staged;
  };
  Chunk chunk(size_t c) const {
    auto [u0, m] = chunkRange(units_, C_, c);
    const size_t off = u0 * G_;
    const bool staged = off + m * G_ > count_;
    return {off, m, staged ? P_ : buf_ + off * dtypeSize(dtype_), staged};
  }

  StatusOr<bool> step() override {
    bool moved = false;
    const size_t es = dtypeSize(dtype_);
    for (size_t c = 0; c < C_; ++c) {
      if (stage_[c] % 2 == 0) continue;
      HSDP_ASSIGN_OR_RETURN(bool ok, finished(works_[c]));
      if (!ok) continue;
      moved = true;
      if (++stage_[c] == kAllDone) {
        const Chunk k = chunk(c);
        if (k.staged) std::memcpy(buf_ + k.off * es, P_, (count_ - k.off) * es);
        ++done_chunks_;
      }
    }
    if (done_chunks_ == C_) {
      complete(Status());
      return true;
    }
    if (!h_.mayIssue(this)) return moved;
    for (bool again = true; again;) {
      again = false;
      if (next_intra_ < order_.size()) {
        HSDP_ASSIGN_OR_RETURN(bool issued, issueIntra());
        again = again || issued;
      }
      if (next_inter_ < order_.size()) {
        HSDP_ASSIGN_OR_RETURN(bool issued, issueInter());
        again = again || issued;
      }
      moved = moved || again;
    }
    if (next_intra_ == order_.size() && next_inter_ == order_.size()) h_.doneIssuing(this);
    return moved;
  }

  // Next intra operation in the fixed order, if its inputs are ready.
  StatusOr<bool> issueIntra() {
    const size_t es = dtypeSize(dtype_);
    auto [c, rs] = order_[next_intra_];
    const size_t b = c % kSlots;
    const Chunk k = chunk(c);
    const size_t piece = J_ * k.m;
    if (rs) {
      if (c >= kSlots && stage_[c - kSlots] != kAllDone) return false;  // slot still in use
      if (k.staged) {
        const size_t n = count_ - k.off;
        std::memcpy(P_, buf_ + k.off * es, n * es);
        std::memset(P_ + n * es, 0, (G_ * k.m - n) * es);
      }
      HSDP_ASSIGN_OR_RETURN(works_[c], h_.intra_.ireduceScatter(k.data, Q_[b], piece, dtype_, op_));
      stage_[c] = kIntraRs;
    } else {
      if (stage_[c] != kInterAg + 1) return false;
      // Our all-reduced J*m block goes to our place in the chunk; the collective fills the rest.
      char* mine = k.data + static_cast<size_t>(h_.intra_.rank()) * piece * es;
      std::memcpy(mine, Q_[b], piece * es);
      HSDP_ASSIGN_OR_RETURN(works_[c], h_.intra_.iallGather(mine, k.data, piece, dtype_));
      stage_[c] = kIntraAg;
    }
    ++next_intra_;
    return true;
  }

  // Next inter operation in the fixed order, if its inputs are ready.
  StatusOr<bool> issueInter() {
    const size_t es = dtypeSize(dtype_);
    auto [c, rs] = order_[next_inter_];
    const size_t b = c % kSlots, m = chunk(c).m;
    if (rs) {
      if (stage_[c] != kIntraRs + 1) return false;
      // With avg the intra phase divides by I and this one by J: 1/(I*J) in all.
      HSDP_ASSIGN_OR_RETURN(works_[c], h_.inter_.ireduceScatter(Q_[b], R_[b], m, dtype_, op_));
      stage_[c] = kInterRs;
    } else {
      if (stage_[c] != kInterRs + 1) return false;
      char* mine = Q_[b] + static_cast<size_t>(h_.inter_.rank()) * m * es;
      std::memcpy(mine, R_[b], m * es);
      HSDP_ASSIGN_OR_RETURN(works_[c], h_.inter_.iallGather(mine, Q_[b], m, dtype_));
      stage_[c] = kInterAg;
    }
    ++next_inter_;
    return true;
  }

  char* buf_;
  size_t count_;
  DType dtype_;
  RedOp op_;
  size_t I_, J_, G_, units_, C_, m_;
  std::vector<std::pair<size_t, bool>> order_;  // (chunk, is reduce-scatter), same on every rank
  std::vector<int> stage_;
  std::vector<WorkHandle> works_;
  char* P_;
  char* Q_[kSlots];
  char* R_[kSlots];
  size_t next_intra_ = 0, next_inter_ = 0, done_chunks_ = 0;
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

size_t HierarchicalCollectives::chunkCount(size_t count, DType dtype) const {
  // `count` units of one element per rank: a chunk of n units moves n * groupSize() elements.
  size_t c = std::min<size_t>(options_.chunks, count);
  if (options_.min_chunk_bytes > 0) {
    const size_t total = count * static_cast<size_t>(groupSize()) * dtypeSize(dtype);
    c = std::min(c, total / options_.min_chunk_bytes);
  }
  return std::max<size_t>(1, c);
}

bool HierarchicalCollectives::pipelined(size_t count, DType dtype) const {
  return chunkCount(count, dtype) > 1 || wireType(dtype) != dtype;
}

DType HierarchicalCollectives::wireType(DType dtype) const {
  return options_.inter_dtype == DType::kBFloat16 && dtype == DType::kFloat32 ? DType::kBFloat16
                                                                              : dtype;
}

size_t HierarchicalCollectives::stagingBytes(size_t count, DType dtype) const {
  const size_t I = intra_.size(), J = inter_.size(), es = dtypeSize(dtype);
  if (!pipelined(count, dtype)) return J * count * es;  // two-phase reduce-scatter's middle
  const size_t nmax = (count + chunkCount(count, dtype) - 1) / chunkCount(count, dtype);
  const size_t wire = wireType(dtype) != dtype ? (J + 1) * nmax * 2 : 0;
  return 2 * ((I * J + J) * nmax * es + wire);
}

size_t HierarchicalCollectives::allReduceBytes(size_t count, DType dtype) const {
  return PipelinedAllReduce::bytes(*this, count, dtype);
}

void HierarchicalCollectives::doneIssuing(const void* w) {
  issuing_.erase(std::remove(issuing_.begin(), issuing_.end(), w), issuing_.end());
}

Status HierarchicalCollectives::reserve(size_t max_count, DType dtype) {
  const size_t es = dtypeSize(dtype);
  HSDP_RETURN_IF_ERROR(pool_->reserve(stagingBytes(max_count, dtype)));
  const size_t chunk =
      (max_count + chunkCount(max_count, dtype) - 1) / chunkCount(max_count, dtype);
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
  if (Comm* level = singleLevelAllReduce(count, dtype))
    return level->iallReduce(buf, count, dtype, op);
  HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(allReduceBytes(count, dtype)));
  return WorkHandle(std::make_unique<PipelinedAllReduce>(*this, slot, buf, count, dtype, op));
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

Comm* HierarchicalCollectives::singleLevelAllReduce(size_t count, DType dtype) {
  // One level only and small: the transport's own all-reduce (MPI's recursive doubling) beats a
  // reduce-scatter ring plus an all-gather, whose ring pays n-1 latency-bound steps (8 ranks on
  // one node here, 1 MiB: 1.3 ms against 3.7 ms; from 16 MiB on the schedule is 1.1-1.2x faster).
  constexpr size_t kSingleLevelBytes = size_t(8) << 20;
  if (!issuing_.empty() || count * dtypeSize(dtype) >= kSingleLevelBytes) return nullptr;
  if (inter_.size() == 1) return &intra_;
  if (intra_.size() == 1) return &inter_;
  return nullptr;
}

Status HierarchicalCollectives::allReduce(void* buf, size_t count, DType dtype, RedOp op) {
  // Blocking: the transport's blocking call (MPI's tuned MPI_Allreduce, not libnbc's schedule).
  if (Comm* level = singleLevelAllReduce(count, dtype)) return level->allReduce(buf, count, dtype, op);
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, iallReduce(buf, count, dtype, op));
  return w->wait();
}

}  // namespace hsdp
