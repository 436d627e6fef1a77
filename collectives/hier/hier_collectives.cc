#include "hsdp/hier_collectives.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "core/progress.h"
#include "core/scratch_pool.h"
#include "core/watchdog.h"
#include "hsdp/log.h"

namespace hsdp {

using hier_detail::State;

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

// Everything the schedules of one HierarchicalCollectives share: the two levels, the options,
// the staging slots and the issue order. The public class is a handle to it (pImpl), so the
// schedule classes below need no friendship.
struct hier_detail::State {
  State(Comm& intra, Comm& inter, HierOptions options)
      : intra_(intra), inter_(inter), options_(options),
        pool_(std::make_unique<ScratchPool>()) {}

  int groupSize() const { return intra_.size() * inter_.size(); }
  size_t chunkCount(size_t count, DType dtype) const;
  bool pipelined(size_t count, DType dtype) const;
  DType wireType(DType dtype) const;
  size_t stagingBytes(size_t count, DType dtype) const;
  size_t allReduceBytes(size_t count, DType dtype) const;
  // The one level to hand a small all-reduce to (null: run the schedule).
  Comm* singleLevelAllReduce(size_t count, DType dtype);
  bool mayIssue(const void* w) const { return !issuing_.empty() && issuing_.front() == w; }
  void doneIssuing(const void* w);

  StatusOr<WorkHandle> iallGather(const void* shard, void* full, size_t count, DType dtype);
  StatusOr<WorkHandle> ireduceScatter(const void* full, void* shard, size_t count, DType dtype,
                                      RedOp op);
  StatusOr<WorkHandle> iallReduce(void* buf, size_t count, DType dtype, RedOp op);

  Comm& intra_;
  Comm& inter_;
  HierOptions options_;
  // Staging for pipelined chunks and the all-reduce's padded buffer: one slot per work in flight.
  std::unique_ptr<ScratchPool> pool_;
  std::deque<const void*> issuing_;  // works that still have steps to issue, in order
};

// A schedule of sub-communicator operations, advanced by the process-wide progress loop.
class ScheduleWork : public ProgressiveWork {
 public:
  // The caller's Label goes with the schedule: its sub-collectives are issued later, from any
  // wait or the progress thread, and carry the unit they move in their fingerprints.
  ScheduleWork(State& h, HostBuffer* slot) : h_(h), slot_(slot), label_(watchdog::currentLabel()) {
    h_.issuing_.push_back(this);
  }
  ~ScheduleWork() override {
    auto lock = progressLock();
    h_.doneIssuing(this);
  }

 protected:
  // Runs step() until it makes no more progress; converts failures into the Work's status.
  void advance() final {
    watchdog::LabelRestore label(label_);
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

  State& h_;
  HostBuffer* slot_;
  watchdog::LabelData label_;
};

// A pipelined schedule. The data is cut into C chunks, and every chunk passes through the same
// stages, each one sub-collective on one level (intra or inter). Per level, operations are issued
// in one fixed order, the same on every rank (a communicator must see its nonblocking collectives
// in the same order everywhere). An operation waits only for the earlier stages of its own chunk
// and, for a chunk's first stage, for its staging slot (chunk c uses slot c % slots, free once
// chunk c - slots is done); both come earlier in every level's order, so the schedule cannot
// deadlock. At most `max_in_flight` operations per level are on the wire at once: two keep a link
// busy across a chunk boundary (the next one is queued while the current one drains), where one
// at a time leaves the link idle for a completion-and-issue round trip per chunk.
class ChunkPipeline : public ScheduleWork {
 public:
  // Staging slots: chunks in flight at once.
  static constexpr size_t kSlots = 4;
  static size_t slotsFor(size_t chunks) { return std::min(kSlots, chunks); }

 protected:
  enum Level { kIntra = 0, kInter = 1 };
  struct Op {
    size_t chunk;
    int stage;
  };

  ChunkPipeline(State& h, HostBuffer* slot, size_t chunks,
                std::vector<Level> stage_levels, size_t max_in_flight)
      : ScheduleWork(h, slot), C_(chunks), slots_(slotsFor(chunks)),
        levels_(std::move(stage_levels)), max_in_flight_(max_in_flight), stage_(chunks, 0),
        busy_(chunks, false), works_(chunks) {}

  // The fixed issue order of each level; every (chunk, stage) of that level exactly once, each
  // chunk's stages in stage order. Set by the subclass before its first advance().
  void setOrder(Level level, std::vector<Op> order) { order_[level] = std::move(order); }
  // The orders of a two-stage pipeline: every chunk's stage 0, then every chunk's stage 1.
  void setTwoStageOrder() {
    std::vector<Op> first, second;
    for (size_t c = 0; c < C_; ++c) first.push_back({c, 0}), second.push_back({c, 1});
    setOrder(levels_[0], std::move(first));
    setOrder(levels_[1], std::move(second));
  }

  // Starts `stage` of chunk `c`; its inputs are ready.
  virtual StatusOr<WorkHandle> issue(size_t c, int stage) = 0;
  // `stage` of chunk `c` has completed (unpack, convert); after its last stage the chunk's slot
  // is reused.
  virtual void landed(size_t c, int stage) {}

  size_t slotOf(size_t c) const { return c % slots_; }
  size_t numChunks() const { return C_; }

 private:
  StatusOr<bool> step() final {
    bool moved = false;
    const int last = static_cast<int>(levels_.size());
    for (size_t c = 0; c < C_; ++c) {
      if (!busy_[c]) continue;
      HSDP_ASSIGN_OR_RETURN(bool ok, finished(works_[c]));
      if (!ok) continue;
      busy_[c] = false;
      --in_flight_[levels_[stage_[c]]];
      landed(c, stage_[c]);
      if (++stage_[c] == last) ++done_chunks_;
      moved = true;
    }
    if (done_chunks_ == C_) {
      complete(Status());
      return true;
    }
    if (!h_.mayIssue(this)) return moved;
    for (bool again = true; again;) {
      again = false;
      for (Level l : {kIntra, kInter}) {
        while (next_[l] < order_[l].size() && in_flight_[l] < max_in_flight_) {
          const Op op = order_[l][next_[l]];
          if (busy_[op.chunk] || stage_[op.chunk] != op.stage) break;
          if (op.stage == 0 && op.chunk >= slots_ && stage_[op.chunk - slots_] != last) break;
          HSDP_ASSIGN_OR_RETURN(works_[op.chunk], issue(op.chunk, op.stage));
          busy_[op.chunk] = true;
          ++in_flight_[l];
          ++next_[l];
          again = moved = true;
        }
      }
    }
    if (next_[kIntra] == order_[kIntra].size() && next_[kInter] == order_[kInter].size())
      h_.doneIssuing(this);
    return moved;
  }

  size_t C_, slots_;
  std::vector<Level> levels_;  // the level of each stage
  size_t max_in_flight_;
  std::vector<int> stage_;     // per chunk: stages completed
  std::vector<bool> busy_;     // per chunk: a stage in flight
  std::vector<WorkHandle> works_;
  std::vector<Op> order_[2];
  size_t next_[2] = {0, 0}, in_flight_[2] = {0, 0}, done_chunks_ = 0;
};

// Staging regions start on 64-byte boundaries: a float stage that followed an odd number of bf16
// elements would be misaligned (stores through it are undefined behaviour), and a region per
// cache line keeps the levels' buffers apart.
constexpr size_t kStageAlign = 64;
constexpr size_t stageBytes(size_t bytes) {
  return (bytes + kStageAlign - 1) / kStageAlign * kStageAlign;
}

// Staging of the pipelined all-gather and reduce-scatter: per slot, the I*J-piece and J-piece
// stages in the data type and, with a bf16 inter wire, the 1-piece and J-piece wire stages.
struct TwoLevelStaging {
  char* full[ChunkPipeline::kSlots];  // I*J pieces
  char* half[ChunkPipeline::kSlots];  // J pieces
  char* one16[ChunkPipeline::kSlots];   // 1 piece, wire type
  char* half16[ChunkPipeline::kSlots];  // J pieces, wire type
  // Carved exactly as State::stagingBytes() sizes it.
  TwoLevelStaging(HostBuffer* slot, size_t slots, size_t I, size_t J, size_t nmax, size_t es,
                  bool wire16) {
    char* p = slot->as<char>();
    const size_t w = wire16 ? 2 : 0;
    for (size_t b = 0; b < slots; ++b) {
      full[b] = p, p += stageBytes(I * J * nmax * es);
      half[b] = p, p += stageBytes(J * nmax * es);
      one16[b] = p, p += stageBytes(nmax * w);
      half16[b] = p, p += stageBytes(J * nmax * w);
    }
  }
};

// all-gather: chunk c goes inter (shard chunk -> half, J pieces), then intra (half -> full, I*J
// pieces), then `full` is unpacked into the user's buffer at (i*J + j)*count + offset.
class PipelinedAllGather final : public ChunkPipeline {
 public:
  PipelinedAllGather(State& h, HostBuffer* slot, const void* shard, void* full,
                     size_t count, DType dtype)
      : ChunkPipeline(h, slot, h.chunkCount(count, dtype), {kInter, kIntra}, 2),
        shard_(static_cast<const char*>(shard)), full_(static_cast<char*>(full)), count_(count),
        dtype_(dtype), wire_(h.wireType(dtype)), I_(h.intra_.size()), J_(h.inter_.size()),
        st_(slot, slotsFor(numChunks()), I_, J_, chunkRange(count, numChunks(), 0).second,
            dtypeSize(dtype), wire_ != dtype) {
    setTwoStageOrder();
    advance();
  }
  ~PipelinedAllGather() override { waitForDestruction(); }

 private:
  StatusOr<WorkHandle> issue(size_t c, int stage) override {
    const size_t es = dtypeSize(dtype_), b = slotOf(c);
    auto [off, n] = chunkRange(count_, numChunks(), c);
    if (stage == 1) return h_.intra_.iallGather(st_.half[b], st_.full[b], J_ * n, dtype_);
    if (wire_ == dtype_) return h_.inter_.iallGather(shard_ + off * es, st_.half[b], n, dtype_);
    convert(shard_ + off * es, dtype_, st_.one16[b], wire_, n);
    return h_.inter_.iallGather(st_.one16[b], st_.half16[b], n, wire_);
  }
  void landed(size_t c, int stage) override {
    const size_t es = dtypeSize(dtype_), b = slotOf(c);
    auto [off, n] = chunkRange(count_, numChunks(), c);
    if (stage == 0) {
      if (wire_ != dtype_) convert(st_.half16[b], wire_, st_.half[b], dtype_, J_ * n);
      return;
    }
    for (size_t k = 0; k < I_ * J_; ++k)
      std::memcpy(full_ + (k * count_ + off) * es, st_.full[b] + k * n * es, n * es);
  }

  const char* shard_;
  char* full_;
  size_t count_;
  DType dtype_, wire_;
  size_t I_, J_;
  TwoLevelStaging st_;
};

// reduce-scatter: chunk c is packed from the user's buffer (I*J pieces) into `full`, reduced
// inside the node (full -> half, J pieces), then across nodes (half -> the shard's chunk).
class PipelinedReduceScatter final : public ChunkPipeline {
 public:
  PipelinedReduceScatter(State& h, HostBuffer* slot, const void* full,
                         void* shard, size_t count, DType dtype, RedOp op)
      : ChunkPipeline(h, slot, h.chunkCount(count, dtype), {kIntra, kInter}, 2),
        full_(static_cast<const char*>(full)), shard_(static_cast<char*>(shard)), count_(count),
        dtype_(dtype), op_(op), wire_(h.wireType(dtype)), I_(h.intra_.size()),
        J_(h.inter_.size()),
        st_(slot, slotsFor(numChunks()), I_, J_, chunkRange(count, numChunks(), 0).second,
            dtypeSize(dtype), wire_ != dtype) {
    setTwoStageOrder();
    advance();
  }
  ~PipelinedReduceScatter() override { waitForDestruction(); }

 private:
  StatusOr<WorkHandle> issue(size_t c, int stage) override {
    const size_t es = dtypeSize(dtype_), b = slotOf(c);
    auto [off, n] = chunkRange(count_, numChunks(), c);
    if (stage == 0) {
      char* p = st_.full[b];
      for (size_t k = 0; k < I_ * J_; ++k)
        std::memcpy(p + k * n * es, full_ + (k * count_ + off) * es, n * es);
      return h_.intra_.ireduceScatter(p, st_.half[b], J_ * n, dtype_, op_);
    }
    // With avg the intra phase divides by I and this one by J: 1/(I*J) in all.
    if (wire_ == dtype_)
      return h_.inter_.ireduceScatter(st_.half[b], shard_ + off * es, n, dtype_, op_);
    convert(st_.half[b], dtype_, st_.half16[b], wire_, J_ * n);
    return h_.inter_.ireduceScatter(st_.half16[b], st_.one16[b], n, wire_, op_);
  }
  void landed(size_t c, int stage) override {
    if (stage != 1 || wire_ == dtype_) return;
    const size_t es = dtypeSize(dtype_), b = slotOf(c);
    auto [off, n] = chunkRange(count_, numChunks(), c);
    convert(st_.one16[b], wire_, shard_ + off * es, dtype_, n);
  }

  const char* full_;
  char* shard_;
  size_t count_;
  DType dtype_;
  RedOp op_;
  DType wire_;
  size_t I_, J_;
  TwoLevelStaging st_;
};

// A schedule of phases that run one after another, each one sub-operation (the unpipelined
// two-phase forms and the all-reduce). A phase is issued only in this object's turn (start
// order), and the work completes when the last phase has.
class PhasedSchedule : public ScheduleWork {
 public:
  PhasedSchedule(State& h, HostBuffer* slot, int phases)
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
  TwoPhaseAllGather(State& h, const void* shard, void* full, size_t count,
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
  TwoPhaseReduceScatter(State& h, HostBuffer* slot, const void* full,
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
// (identical on every rank, as nonblocking collectives require; see the constructor): the
// reduce-scatter of chunk c+L is issued before the all-gather of chunk c. Every operation waits
// only on operations earlier in that order or on the other level, so it cannot deadlock.
class PipelinedAllReduce final : public ChunkPipeline {
 public:
  PipelinedAllReduce(State& h, HostBuffer* slot, void* buf, size_t count,
                     DType dtype, RedOp op)
      : ChunkPipeline(h, slot, chunks(h, count, dtype), {kIntra, kInter, kInter, kIntra}, kSlots),
        buf_(static_cast<char*>(buf)), count_(count), dtype_(dtype), op_(op),
        I_(h.intra_.size()), J_(h.inter_.size()), G_(I_ * J_), units_((count + G_ - 1) / G_),
        m_(pieceCount(count, numChunks(), G_)) {
    const size_t es = dtypeSize(dtype_);
    char* p = slot->as<char>();
    P_ = p, p += G_ * m_ * es;
    for (size_t b = 0; b < slotsFor(numChunks()); ++b) {
      Q_[b] = p, p += J_ * m_ * es;
      R_[b] = p, p += m_ * es;
    }
    // The per-level issue order: RS0 .. RS(L-1), then AG0, RS(L), AG1, RS(L+1), ..., then the
    // remaining all-gathers. L reduce-scatters run ahead of the all-gathers: every chunk when each
    // has a slot of its own, else slots - 1 (RS(c+L) needs the slot of chunk c-1, whose AG is
    // earlier in the order).
    std::vector<Op> intra, inter;
    const size_t C = numChunks(), slots = slotsFor(C), ahead = slots == C ? C : slots - 1;
    auto add = [&](size_t c, bool rs) {
      intra.push_back({c, rs ? kIntraRs : kIntraAg});
      inter.push_back({c, rs ? kInterRs : kInterAg});
    };
    for (size_t c = 0; c < ahead; ++c) add(c, true);
    for (size_t c = 0; c < C; ++c) {
      add(c, false);
      if (c + ahead < C) add(c + ahead, true);
    }
    // Each level sees its reduce-scatter of a chunk before its all-gather; on the intra level
    // RS(c) (stage 0) precedes AG(c) (stage 3) and on the inter level RS(c) (1) precedes AG(c) (2).
    setOrder(kIntra, std::move(intra));
    setOrder(kInter, std::move(inter));
    advance();
  }
  ~PipelinedAllReduce() override { waitForDestruction(); }

  static size_t chunks(const State& h, size_t count, DType dtype) {
    const size_t g = static_cast<size_t>(h.groupSize());
    return h.chunkCount((count + g - 1) / g, dtype);
  }
  // Elements per rank in the largest chunk.
  static size_t pieceCount(size_t count, size_t chunks, size_t group) {
    return chunkRange((count + group - 1) / group, chunks, 0).second;
  }
  // Bytes of staging: the padded tail chunk P, and Q and R per slot.
  static size_t bytes(const State& h, size_t count, DType dtype) {
    const size_t I = h.intra_.size(), J = h.inter_.size(), C = chunks(h, count, dtype);
    const size_t m = pieceCount(count, C, I * J);
    return (I * J + slotsFor(C) * (J + 1)) * m * dtypeSize(dtype);
  }

 private:
  // A chunk's stages: intra RS (chunk -> Q, J*m), inter RS (Q -> R, m), inter AG (R -> Q, in
  // place), intra AG (Q -> chunk, in place).
  enum : int { kIntraRs = 0, kInterRs = 1, kInterAg = 2, kIntraAg = 3 };

  // Chunk c: its first element, elements per rank, and where it is reduced (the user's buffer,
  // or P for a tail that is not a multiple of G).
  struct Chunk {
    size_t off, m;
    char* data;
    bool staged;
  };
  Chunk chunk(size_t c) const {
    auto [u0, m] = chunkRange(units_, numChunks(), c);
    const size_t off = u0 * G_;
    const bool staged = off + m * G_ > count_;
    return {off, m, staged ? P_ : buf_ + off * dtypeSize(dtype_), staged};
  }

  StatusOr<WorkHandle> issue(size_t c, int stage) override {
    const size_t es = dtypeSize(dtype_), b = slotOf(c);
    const Chunk k = chunk(c);
    const size_t piece = J_ * k.m;
    switch (stage) {
      case kIntraRs:
        if (k.staged) {
          const size_t n = count_ - k.off;
          std::memcpy(P_, buf_ + k.off * es, n * es);
          std::memset(P_ + n * es, 0, (G_ * k.m - n) * es);
        }
        return h_.intra_.ireduceScatter(k.data, Q_[b], piece, dtype_, op_);
      case kInterRs:
        // With avg the intra phase divides by I and this one by J: 1/(I*J) in all.
        return h_.inter_.ireduceScatter(Q_[b], R_[b], k.m, dtype_, op_);
      case kInterAg: {
        char* mine = Q_[b] + static_cast<size_t>(h_.inter_.rank()) * k.m * es;
        std::memcpy(mine, R_[b], k.m * es);
        return h_.inter_.iallGather(mine, Q_[b], k.m, dtype_);
      }
      default: {
        // Our all-reduced J*m block goes to our place in the chunk; the collective fills the rest.
        char* mine = k.data + static_cast<size_t>(h_.intra_.rank()) * piece * es;
        std::memcpy(mine, Q_[b], piece * es);
        return h_.intra_.iallGather(mine, k.data, piece, dtype_);
      }
    }
  }
  void landed(size_t c, int stage) override {
    if (stage != kIntraAg) return;
    const Chunk k = chunk(c);
    if (k.staged) std::memcpy(buf_ + k.off * dtypeSize(dtype_), P_, (count_ - k.off) * dtypeSize(dtype_));
  }

  char* buf_;
  size_t count_;
  DType dtype_;
  RedOp op_;
  size_t I_, J_, G_, units_, m_;
  char* P_;
  char* Q_[kSlots];
  char* R_[kSlots];
};

HierarchicalCollectives::HierarchicalCollectives(Comm& intra, Comm& inter, HierOptions options)
    : s_(std::make_unique<State>(intra, inter, options)) {}

HierarchicalCollectives::~HierarchicalCollectives() = default;

int HierarchicalCollectives::groupSize() const { return s_->groupSize(); }
int HierarchicalCollectives::shardIndex() const {
  return s_->intra_.rank() * s_->inter_.size() + s_->inter_.rank();
}
const HierOptions& HierarchicalCollectives::options() const { return s_->options_; }
size_t HierarchicalCollectives::scratchBytes() const { return s_->pool_->totalBytes(); }

Status HierarchicalCollectives::setOptions(HierOptions options) {
  auto lock = progressLock();
  HierOptions& options_ = s_->options_;
  if (options.chunks < 1) return invalidArgument("pipeline chunks ", options.chunks, " must be >= 1");
  if (options.inter_dtype != DType::kFloat32 && options.inter_dtype != DType::kBFloat16)
    return invalidArgument("inter-node dtype ", dtypeName(options.inter_dtype),
                           " is not float or bf16");
  options_ = options;
  return okStatus();
}

size_t State::chunkCount(size_t count, DType dtype) const {
  // `count` units of one element per rank: a chunk of n units moves n * groupSize() elements.
  size_t c = std::min<size_t>(options_.chunks, count);
  if (options_.min_chunk_bytes > 0) {
    const size_t total = count * static_cast<size_t>(groupSize()) * dtypeSize(dtype);
    c = std::min(c, total / options_.min_chunk_bytes);
  }
  return std::max<size_t>(1, c);
}

bool State::pipelined(size_t count, DType dtype) const {
  return chunkCount(count, dtype) > 1 || wireType(dtype) != dtype;
}

DType State::wireType(DType dtype) const {
  return options_.inter_dtype == DType::kBFloat16 && dtype == DType::kFloat32 ? DType::kBFloat16
                                                                              : dtype;
}

size_t State::stagingBytes(size_t count, DType dtype) const {
  const size_t I = intra_.size(), J = inter_.size(), es = dtypeSize(dtype);
  if (!pipelined(count, dtype)) return J * count * es;  // two-phase reduce-scatter's middle
  const size_t nmax = (count + chunkCount(count, dtype) - 1) / chunkCount(count, dtype);
  const size_t w = wireType(dtype) != dtype ? sizeof(bf16) : 0;
  return ChunkPipeline::slotsFor(chunkCount(count, dtype)) *
         (stageBytes(I * J * nmax * es) + stageBytes(J * nmax * es) + stageBytes(nmax * w) +
          stageBytes(J * nmax * w));
}

size_t State::allReduceBytes(size_t count, DType dtype) const {
  return PipelinedAllReduce::bytes(*this, count, dtype);
}

void State::doneIssuing(const void* w) {
  issuing_.erase(std::remove(issuing_.begin(), issuing_.end(), w), issuing_.end());
}

Status HierarchicalCollectives::reserve(size_t max_count, DType dtype) {
  auto lock = progressLock();
  State& s = *s_;
  const size_t es = dtypeSize(dtype);
  HSDP_RETURN_IF_ERROR(s.pool_->reserve(s.stagingBytes(max_count, dtype)));
  const size_t chunk =
      (max_count + s.chunkCount(max_count, dtype) - 1) / s.chunkCount(max_count, dtype);
  HSDP_RETURN_IF_ERROR(s.intra_.reserveScratch(s.inter_.size() * std::max(chunk, max_count) * es));
  HSDP_RETURN_IF_ERROR(s.inter_.reserveScratch(max_count * es));
  return okStatus();
}

StatusOr<WorkHandle> State::iallGather(const void* shard, void* full,
                                                         size_t count, DType dtype) {
  auto lock = progressLock();
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

StatusOr<WorkHandle> State::ireduceScatter(const void* full, void* shard,
                                                             size_t count, DType dtype, RedOp op) {
  auto lock = progressLock();
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

StatusOr<WorkHandle> State::iallReduce(void* buf, size_t count, DType dtype,
                                                         RedOp op) {
  auto lock = progressLock();
  if (Comm* level = singleLevelAllReduce(count, dtype))
    return level->iallReduce(buf, count, dtype, op);
  HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(allReduceBytes(count, dtype)));
  return WorkHandle(std::make_unique<PipelinedAllReduce>(*this, slot, buf, count, dtype, op));
}

Status HierarchicalCollectives::allGather(const void* shard, void* full, size_t count,
                                          DType dtype) {
  auto lock = progressLock();
  // One level, small, nothing queued before it: the transport's blocking call (MPI's tuned
  // MPI_Allgather). libnbc's MPI_Iallgather, which the nonblocking path hands to, is slower there
  // (8 ranks on one node, 1 MiB: 0.65 ms against 0.51 ms) and faster from 4 MiB on (2.6 ms
  // against 3.1 ms).
  constexpr size_t kBlockingBytes = size_t(2) << 20;
  const size_t total = count * static_cast<size_t>(groupSize()) * dtypeSize(dtype);
  State& s = *s_;
  if (s.issuing_.empty() && total < kBlockingBytes && s.wireType(dtype) == dtype) {
    if (s.inter_.size() == 1) return s.intra_.allGather(shard, full, count, dtype);
    if (s.intra_.size() == 1) return s.inter_.allGather(shard, full, count, dtype);
  }
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, iallGather(shard, full, count, dtype));
  return w->wait();
}

Status HierarchicalCollectives::reduceScatter(const void* full, void* shard, size_t count,
                                              DType dtype, RedOp op) {
  auto lock = progressLock();
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, ireduceScatter(full, shard, count, dtype, op));
  return w->wait();
}

Comm* State::singleLevelAllReduce(size_t count, DType dtype) {
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
  auto lock = progressLock();
  // Blocking: the transport's blocking call (MPI's tuned MPI_Allreduce, not libnbc's schedule).
  if (Comm* level = s_->singleLevelAllReduce(count, dtype))
    return level->allReduce(buf, count, dtype, op);
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, iallReduce(buf, count, dtype, op));
  return w->wait();
}

StatusOr<WorkHandle> HierarchicalCollectives::iallGather(const void* shard, void* full,
                                                         size_t count, DType dtype) {
  return s_->iallGather(shard, full, count, dtype);
}

StatusOr<WorkHandle> HierarchicalCollectives::ireduceScatter(const void* full, void* shard,
                                                             size_t count, DType dtype, RedOp op) {
  return s_->ireduceScatter(full, shard, count, dtype, op);
}

StatusOr<WorkHandle> HierarchicalCollectives::iallReduce(void* buf, size_t count, DType dtype,
                                                         RedOp op) {
  return s_->iallReduce(buf, count, dtype, op);
}

}  // namespace hsdp
