// The fp32/bf16 schedules (two-phase, pipelined, the all-reduce) and the public class; the
// shared machinery is in hier_internal.h, the block-quantized schedules in hier_quantized.cc.
#include "hsdp/hier_collectives.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/hier/hier_internal.h"
#include "hsdp/log.h"

namespace hsdp {

using hier_detail::ChunkPipeline;
using hier_detail::chunkRange;
using hier_detail::PhasedSchedule;
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

}  // namespace

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
  PipelinedAllGather(State& h, HostBuffer* slot, const void* shard, void* full, size_t count,
                     DType dtype, DType wire)
      : ChunkPipeline(h, slot, h.chunkCount(count, dtype), {kInter, kIntra}, 2),
        shard_(static_cast<const char*>(shard)),
        full_(static_cast<char*>(full)),
        count_(count),
        dtype_(dtype),
        wire_(wire),
        I_(h.intra_.size()),
        J_(h.inter_.size()),
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

// reduce-scatter: chunk c's I*J pieces of the user's buffer are reduced inside the node (-> half,
// J pieces; a transport that cannot read them in place packs them into `full` first), then
// across nodes (half -> the shard's chunk).
class PipelinedReduceScatter final : public ChunkPipeline {
 public:
  PipelinedReduceScatter(State& h, HostBuffer* slot, const void* full, void* shard, size_t count,
                         DType dtype, RedOp op, DType wire)
      : ChunkPipeline(h, slot, h.chunkCount(count, dtype), {kIntra, kInter}, 2),
        full_(static_cast<const char*>(full)),
        shard_(static_cast<char*>(shard)),
        count_(count),
        dtype_(dtype),
        op_(op),
        wire_(wire),
        I_(h.intra_.size()),
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
    if (stage == 0)  // the chunk's I*J pieces, read where they lie (or packed into `full`)
      return h_.intra_.ireduceScatterRuns(full_ + off * es, st_.half[b], {n, J_, count_}, dtype_,
                                          op_, st_.full[b]);
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
  for (const WireFormat* w : {&options.gather_wire, &options.reduce_wire, &options.allreduce_wire})
    if (wireQuantized(w->wire)) HSDP_RETURN_IF_ERROR(validate(*w));
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

bool State::pipelined(size_t count, DType dtype, DType wire) const {
  return chunkCount(count, dtype) > 1 || wire != dtype;
}

size_t State::stagingBytes(size_t count, DType dtype, DType wire) const {
  const size_t I = intra_.size(), J = inter_.size(), es = dtypeSize(dtype);
  if (!pipelined(count, dtype, wire)) return J * count * es;  // two-phase reduce-scatter's middle
  const size_t nmax = (count + chunkCount(count, dtype) - 1) / chunkCount(count, dtype);
  const size_t w = wire != dtype ? sizeof(bf16) : 0;
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
  // The largest staging any operation of this object may take: the plain schedules (an exact
  // gather ignores the wires), the bf16 ones, the quantized ones.
  size_t staging = s.stagingBytes(max_count, dtype, dtype);
  for (const WireFormat& w : {s.gatherWire(), s.reduceWire()})
    staging = std::max(staging, s.stagingBytes(max_count, dtype, State::wire16(w, dtype)));
  if (s.quantizes(s.gatherWire(), dtype))
    staging = std::max(staging, quantGatherBytes(s, max_count, s.gatherWire()));
  if (s.quantizes(s.reduceWire(), dtype))
    staging = std::max(staging, quantReduceBytes(s, max_count, s.reduceWire()));
  if (s.encodesAllReduce(dtype)) staging = std::max(staging, encodedAllReduceBytes(s, max_count));
  HSDP_RETURN_IF_ERROR(s.pool_->reserve(staging));
  const size_t chunk =
      (max_count + s.chunkCount(max_count, dtype) - 1) / s.chunkCount(max_count, dtype);
  HSDP_RETURN_IF_ERROR(s.intra_.reserveScratch(s.inter_.size() * std::max(chunk, max_count) * es));
  HSDP_RETURN_IF_ERROR(s.inter_.reserveScratch(max_count * es));
  return okStatus();
}

StatusOr<WorkHandle> State::iallGather(const void* shard, void* full, size_t count, DType dtype,
                                       const WireFormat& wire, const void* encoded) {
  auto lock = progressLock();
  if (quantizes(wire, dtype)) {
    HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(quantGatherBytes(*this, count, wire)));
    return startQuantAllGather(*this, slot, static_cast<const float*>(shard), encoded,
                               static_cast<float*>(full), count, wire);
  }
  if (encoded != nullptr)
    return failedPrecondition("all-gather of an encoded shard, but the ", wireName(wire.wire),
                              " wire over ", inter_.size(), " node(s) quantizes nothing");
  const DType w = wire16(wire, dtype);
  if (issuing_.empty() && (w == dtype || inter_.size() == 1) &&
      (intra_.size() == 1 || inter_.size() == 1)) {
    // One level only: the sub-communicator's own collective lands shards in place.
    if (inter_.size() > 1) return inter_.iallGather(shard, full, count, dtype);
    return intra_.iallGather(shard, full, count, dtype);
  }
  if (!pipelined(count, dtype, w))
    return WorkHandle(std::make_unique<TwoPhaseAllGather>(*this, shard, full, count, dtype));
  HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(stagingBytes(count, dtype, w)));
  return WorkHandle(
      std::make_unique<PipelinedAllGather>(*this, slot, shard, full, count, dtype, w));
}

StatusOr<WorkHandle> State::ireduceScatter(const void* full, void* shard, size_t count, DType dtype,
                                           RedOp op, float* residual) {
  auto lock = progressLock();
  const WireFormat wire = reduceWire();
  if (quantizes(wire, dtype)) {
    HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(quantReduceBytes(*this, count, wire)));
    return startQuantReduceScatter(*this, slot, static_cast<const float*>(full),
                                   static_cast<float*>(shard), count, op, wire, residual);
  }
  const DType w = wire16(wire, dtype);
  if (issuing_.empty() && (w == dtype || inter_.size() == 1) &&
      (intra_.size() == 1 || inter_.size() == 1)) {
    if (intra_.size() == 1) return inter_.ireduceScatter(full, shard, count, dtype, op);
    return intra_.ireduceScatter(full, shard, count, dtype, op);
  }
  HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(stagingBytes(count, dtype, w)));
  if (!pipelined(count, dtype, w))
    return WorkHandle(
        std::make_unique<TwoPhaseReduceScatter>(*this, slot, full, shard, count, dtype, op));
  return WorkHandle(
      std::make_unique<PipelinedReduceScatter>(*this, slot, full, shard, count, dtype, op, w));
}

StatusOr<WorkHandle> State::iallReduce(void* buf, size_t count, DType dtype, RedOp op,
                                       float* residual) {
  auto lock = progressLock();
  if (encodesAllReduce(dtype)) {
    if (count == 0) return completedWork();
    HSDP_ASSIGN_OR_RETURN(HostBuffer * slot, pool_->acquire(encodedAllReduceBytes(*this, count)));
    return startEncodedAllReduce(*this, slot, static_cast<float*>(buf), count, op, residual);
  }
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
  const WireFormat wire = s.gatherWire();
  if (s.issuing_.empty() && total < kBlockingBytes && !s.quantizes(wire, dtype) &&
      State::wire16(wire, dtype) == dtype) {
    if (s.inter_.size() == 1) return s.intra_.allGather(shard, full, count, dtype);
    if (s.intra_.size() == 1) return s.inter_.allGather(shard, full, count, dtype);
  }
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, iallGather(shard, full, count, dtype));
  return w->wait();
}

Status HierarchicalCollectives::reduceScatter(const void* full, void* shard, size_t count,
                                              DType dtype, RedOp op, float* residual) {
  auto lock = progressLock();
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, ireduceScatter(full, shard, count, dtype, op, residual));
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

Status HierarchicalCollectives::allReduce(void* buf, size_t count, DType dtype, RedOp op,
                                          float* residual) {
  auto lock = progressLock();
  // Blocking: the transport's blocking call (MPI's tuned MPI_Allreduce, not libnbc's schedule).
  if (!s_->encodesAllReduce(dtype))
    if (Comm* level = s_->singleLevelAllReduce(count, dtype))
      return level->allReduce(buf, count, dtype, op);
  HSDP_ASSIGN_OR_RETURN(WorkHandle w, iallReduce(buf, count, dtype, op, residual));
  return w->wait();
}

StatusOr<WorkHandle> HierarchicalCollectives::iallGather(const void* shard, void* full,
                                                         size_t count, DType dtype) {
  return s_->iallGather(shard, full, count, dtype, s_->gatherWire(), nullptr);
}

StatusOr<WorkHandle> HierarchicalCollectives::iallGather(const void* shard, void* full,
                                                         size_t count, DType dtype,
                                                         const WireFormat& wire) {
  if (wireQuantized(wire.wire)) HSDP_RETURN_IF_ERROR(validate(wire));
  return s_->iallGather(shard, full, count, dtype, wire, nullptr);
}

StatusOr<WorkHandle> HierarchicalCollectives::iallGatherEncoded(const void* encoded, float* full,
                                                                size_t count) {
  return s_->iallGather(nullptr, full, count, DType::kFloat32, s_->gatherWire(), encoded);
}

bool HierarchicalCollectives::gatherQuantizes() const {
  return s_->quantizes(s_->gatherWire(), DType::kFloat32);
}

size_t HierarchicalCollectives::residualCount(size_t count) const {
  if (!s_->quantizes(s_->reduceWire(), DType::kFloat32)) return 0;
  return static_cast<size_t>(s_->inter_.size() - 1) * count;
}

StatusOr<WorkHandle> HierarchicalCollectives::ireduceScatter(const void* full, void* shard,
                                                             size_t count, DType dtype, RedOp op,
                                                             float* residual) {
  return s_->ireduceScatter(full, shard, count, dtype, op, residual);
}

StatusOr<WorkHandle> HierarchicalCollectives::iallReduce(void* buf, size_t count, DType dtype,
                                                         RedOp op, float* residual) {
  return s_->iallReduce(buf, count, dtype, op, residual);
}

size_t HierarchicalCollectives::allReduceResidualCount(size_t count) const {
  if (!s_->encodesAllReduce(DType::kFloat32)) return 0;
  return encodedAllReduceResidual(*s_, count);
}

}  // namespace hsdp
