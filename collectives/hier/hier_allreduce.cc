// The fp32/bf16 all-reduce of the hierarchical schedules (pipelined over both levels, or handed
// to the one level there is) and its public entry points; the all-gather and reduce-scatter are
// in hier_collectives.cc, the shared machinery in hier_internal.h.
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/hier/hier_internal.h"
#include "hsdp/hier_collectives.h"

namespace hsdp {

using hier_detail::ChunkPipeline;
using hier_detail::chunkRange;
using hier_detail::State;

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
  PipelinedAllReduce(State& h, HostBuffer* slot, void* buf, size_t count, DType dtype, RedOp op)
      : ChunkPipeline(h, slot, chunks(h, count, dtype), {kIntra, kInter, kInter, kIntra}, kSlots),
        buf_(static_cast<char*>(buf)),
        count_(count),
        dtype_(dtype),
        op_(op),
        G_(I_ * J_),
        units_((count + G_ - 1) / G_),
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
    if (k.staged)
      std::memcpy(buf_ + k.off * dtypeSize(dtype_), P_, (count_ - k.off) * dtypeSize(dtype_));
  }

  char* buf_;
  size_t count_;
  DType dtype_;
  RedOp op_;
  size_t G_, units_, m_;
  char* P_;
  char* Q_[kSlots];
  char* R_[kSlots];
};

size_t State::allReduceBytes(size_t count, DType dtype) const {
  return PipelinedAllReduce::bytes(*this, count, dtype);
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

StatusOr<WorkHandle> HierarchicalCollectives::iallReduce(void* buf, size_t count, DType dtype,
                                                         RedOp op, float* residual) {
  return s_->iallReduce(buf, count, dtype, op, residual);
}

size_t HierarchicalCollectives::allReduceResidualCount(size_t count) const {
  if (!s_->encodesAllReduce(DType::kFloat32)) return 0;
  return encodedAllReduceResidual(*s_, count);
}

}  // namespace hsdp
