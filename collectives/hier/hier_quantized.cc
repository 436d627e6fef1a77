// The block-quantized inter wire (int8/int4, hsdp/quantize.h) of the hierarchical all-gather and
// reduce-scatter. Both are ChunkPipelines (hier_internal.h) whose chunks are whole blocks of the
// shard, so a chunk's codes are one contiguous range of the shard's encoding:
//   all-gather      inter all-gather of the chunk's codes (J pieces), intra all-gather of those
//                   (I*J pieces), then every piece decoded into the gathered buffer. Codes, not
//                   floats, cross the node's ranks too, and every rank decodes the same bytes.
//   reduce-scatter  intra reduce-scatter in fp32 (J pieces of partial sums, the chunk's pieces
//                   read from the caller's buffer where they lie), then each rank
//                   encodes the J-1 pieces other nodes own (with error feedback), one inter
//                   all-to-all of the codes, and the J pieces of its own block summed in fp32 in
//                   node order, its own piece exact (qgZ: no partial sum is quantized twice).
//   all-reduce      (HierOptions::allreduce_wire, bf16/int8/int4; one chunk) intra
//                   reduce-scatter in fp32, inter all-to-all of encoded pieces summed in fp32, the
//                   sum encoded once and all-gathered, every piece decoded by every rank, intra
//                   all-gather: all ranks hold bitwise the same result (replicas stay equal).
#include <cstring>

#include "collectives/hier/hier_internal.h"

namespace hsdp::hier_detail {
namespace {

// Chunk c of a quantized operation over shards of `count` elements: elements [off, off + n),
// whole blocks but the shard's last, and where its codes start in the shard's encoding.
struct QuantChunk {
  size_t off, n, byte_off, bytes;
};
QuantChunk quantChunk(size_t count, size_t chunks, const WireFormat& w, size_t c) {
  const size_t blocks = (count + w.block - 1) / w.block;
  auto [b0, nb] = chunkRange(blocks, chunks, c);
  const size_t off = b0 * w.block, n = std::min(count, (b0 + nb) * w.block) - off;
  return {off, n, encodedOffset(w, b0), encodedBytes(w, n)};
}

// The largest chunk (the first: chunkRange makes the leading chunks the longer ones).
QuantChunk largest(const State& h, size_t count, const WireFormat& w) {
  return quantChunk(count, quantChunkCount(h, count, w), w, 0);
}

// Our block's J pieces summed in node order into `acc` (n elements): piece j decoded from
// `recv` (q bytes each) for j != me, `own` exactly for j == me; with avg times 1/J, as the
// transports divide (the intra phase already divided by I).
void sumPieces(const WireFormat& w, const char* recv, size_t q, const float* own, size_t n,
               size_t me, size_t J, RedOp op, float* acc) {
  for (size_t j = 0; j < J; ++j) {
    if (j != me) {
      wireDecode(w, recv + j * q, n, acc, /*accumulate=*/j > 0);
    } else if (j == 0) {
      std::memcpy(acc, own, n * sizeof(float));
    } else {
      for (size_t i = 0; i < n; ++i) acc[i] += own[i];
    }
  }
  if (op == RedOp::kAvg) {
    const float f = 1.0f / static_cast<float>(J);
    for (size_t i = 0; i < n; ++i) acc[i] *= f;
  }
}

// The inter step of both encoded reductions (qgZ): of this node's J partial sums (`pieces`, n
// elements each), the J-1 that other nodes own are encoded into `send` (error feedback into
// residual(j) where that is not null; our own piece stays here, exact, for sumPieces) and
// exchanged in one inter all-to-all into `recv` (J pieces of encodedBytes(w, n) each).
template <class ResidualOf>
StatusOr<WorkHandle> exchangeEncoded(Comm& inter, const WireFormat& w, const float* pieces,
                                     size_t n, size_t me, char* send, char* recv,
                                     ResidualOf residual) {
  const size_t J = static_cast<size_t>(inter.size()), q = encodedBytes(w, n);
  for (size_t j = 0; j < J; ++j)
    if (j != me) wireEncode(w, pieces + j * n, n, send + j * q, residual(j));
  return inter.iallToAll(send, recv, q, DType::kUInt8);
}

// What the quantized all-gather and reduce-scatter pipelines share: `count` elements per shard
// cut into quantChunkCount chunks of whole blocks of `w`, one stage per level (`first`, then the
// other) in the two-stage order, two operations per level in flight.
class QuantPipeline : public ChunkPipeline {
 protected:
  QuantPipeline(State& h, HostBuffer* slot, size_t count, const WireFormat& w, Level first)
      : ChunkPipeline(h, slot, quantChunkCount(h, count, w),
                      {first, first == kIntra ? kInter : kIntra}, 2),
        count_(count),
        w_(w) {
    setTwoStageOrder();
  }

  QuantChunk chunk(size_t c) const { return quantChunk(count_, numChunks(), w_, c); }

  const size_t count_;
  const WireFormat w_;
};

class QuantAllGather final : public QuantPipeline {
 public:
  QuantAllGather(State& h, HostBuffer* slot, const float* shard, const void* encoded, float* full,
                 size_t count, const WireFormat& w)
      : QuantPipeline(h, slot, count, w, kInter),
        shard_(shard),
        encoded_(static_cast<const char*>(encoded)),
        full_(full) {
    const size_t q = largest(h, count, w).bytes;
    char* p = slot->as<char>();
    for (size_t b = 0; b < slotsFor(numChunks()); ++b) {
      one_[b] = p, p += q;
      half_[b] = p, p += J_ * q;
      all_[b] = p, p += I_ * J_ * q;
    }
    advance();
  }
  ~QuantAllGather() override { waitForDestruction(); }

  static size_t bytes(const State& h, size_t count, const WireFormat& w) {
    const size_t I = h.intra_.size(), J = h.inter_.size();
    return slotsFor(quantChunkCount(h, count, w)) * (1 + J + I * J) * largest(h, count, w).bytes;
  }

 private:
  StatusOr<WorkHandle> issue(size_t c, int stage) override {
    const QuantChunk k = chunk(c);
    const size_t b = slotOf(c);
    if (stage == 1) return h_.intra_.iallGather(half_[b], all_[b], J_ * k.bytes, DType::kUInt8);
    const char* mine = encoded_ != nullptr ? encoded_ + k.byte_off : one_[b];
    if (encoded_ == nullptr) wireEncode(w_, shard_ + k.off, k.n, one_[b]);
    return h_.inter_.iallGather(mine, half_[b], k.bytes, DType::kUInt8);
  }
  void landed(size_t c, int stage) override {
    if (stage != 1) return;
    const QuantChunk k = chunk(c);
    const char* pieces = all_[slotOf(c)];
    for (size_t q = 0; q < I_ * J_; ++q)  // piece q is shard q (q = intra_idx * J + inter_idx)
      wireDecode(w_, pieces + q * k.bytes, k.n, full_ + q * count_ + k.off);
  }

  const float* shard_;
  const char* encoded_;
  float* full_;
  char* one_[kSlots];   // our chunk's codes (when not given encoded)
  char* half_[kSlots];  // J pieces of codes, after the inter phase
  char* all_[kSlots];   // I*J pieces, after the intra phase
};

class QuantReduceScatter final : public QuantPipeline {
 public:
  QuantReduceScatter(State& h, HostBuffer* slot, const float* full, float* shard, size_t count,
                     RedOp op, const WireFormat& w, float* residual)
      : QuantPipeline(h, slot, count, w, kIntra),
        full_(full),
        shard_(shard),
        op_(op),
        residual_(residual),
        me_(h.inter_.rank()) {
    const QuantChunk big = largest(h, count, w);
    char* p = slot->as<char>();
    for (size_t b = 0; b < slotsFor(numChunks()); ++b) {
      pack_[b] = reinterpret_cast<float*>(p);
      if (numChunks() > 1) p += I_ * J_ * big.n * sizeof(float);  // one chunk needs no packing
      half_[b] = reinterpret_cast<float*>(p), p += J_ * big.n * sizeof(float);
      send_[b] = p, p += J_ * big.bytes;
      recv_[b] = p, p += J_ * big.bytes;
    }
    advance();
  }
  ~QuantReduceScatter() override { waitForDestruction(); }

  static size_t bytes(const State& h, size_t count, const WireFormat& w) {
    const size_t I = h.intra_.size(), J = h.inter_.size();
    const QuantChunk big = largest(h, count, w);
    const size_t chunks = quantChunkCount(h, count, w), pack = chunks == 1 ? 0 : I * J;
    return slotsFor(chunks) * ((pack + J) * big.n * sizeof(float) + 2 * J * big.bytes);
  }

 private:
  StatusOr<WorkHandle> issue(size_t c, int stage) override {
    const QuantChunk k = chunk(c);
    const size_t b = slotOf(c);
    if (stage == 0) {
      // One chunk is already laid out as the intra reduce-scatter wants it; more are read where
      // they lie (a transport that cannot packs them into pack_ first).
      if (numChunks() == 1)
        return h_.intra_.ireduceScatter(full_, half_[b], J_ * k.n, DType::kFloat32, op_);
      return h_.intra_.ireduceScatterRuns(full_ + k.off, half_[b], {k.n, J_, count_},
                                          DType::kFloat32, op_, pack_[b]);
    }
    // The residual holds the J-1 other nodes' pieces of the whole shard, in node order.
    return exchangeEncoded(h_.inter_, w_, half_[b], k.n, me_, send_[b], recv_[b], [&](size_t j) {
      return residual_ == nullptr ? nullptr : residual_ + (j < me_ ? j : j - 1) * count_ + k.off;
    });
  }
  void landed(size_t c, int stage) override {
    if (stage != 1) return;
    const QuantChunk k = chunk(c);
    const size_t b = slotOf(c);
    // In node order, so every run sums the same way.
    sumPieces(w_, recv_[b], k.bytes, half_[b] + me_ * k.n, k.n, me_, J_, op_, shard_ + k.off);
  }

  const float* full_;
  float* shard_;
  RedOp op_;
  float* residual_;
  size_t me_;
  float* pack_[kSlots];  // the chunk's I*J pieces, where the transport packs them
  float* half_[kSlots];  // J pieces of this node's partial sums, after the intra phase
  char* send_[kSlots];   // J pieces of codes (our own slot unused)
  char* recv_[kSlots];   // J pieces of codes from the other nodes
};

// The encoded all-reduce: the buffer padded to G*m (G = I*J ranks, m = ceil(count/G) elements
// each) in P; phases: intra reduce-scatter P -> Q (J*m: our node's partial sums of J pieces),
// inter all-to-all of the encoded pieces, inter all-gather of our encoded sum, intra
// all-gather Q -> P; the sums and decodes run as each phase is issued.
class EncodedAllReduce final : public PhasedSchedule {
 public:
  EncodedAllReduce(State& h, HostBuffer* slot, float* buf, size_t count, RedOp op,
                   const WireFormat& w, float* residual)
      : PhasedSchedule(h, slot, 4),
        buf_(buf),
        count_(count),
        op_(op),
        w_(w),
        residual_(residual),
        me_(h.inter_.rank()),
        m_(pieceCount(h, count)),
        q_(encodedBytes(w, m_)) {
    char* p = slot->as<char>();
    P_ = reinterpret_cast<float*>(p), p += I_ * J_ * m_ * sizeof(float);
    Q_ = reinterpret_cast<float*>(p), p += J_ * m_ * sizeof(float);
    sum_ = reinterpret_cast<float*>(p), p += m_ * sizeof(float);
    send_ = p, p += J_ * q_;
    recv_ = p, p += J_ * q_;
    gathered_ = p;
    std::memcpy(P_, buf, count * sizeof(float));
    std::memset(P_ + count, 0, (I_ * J_ * m_ - count) * sizeof(float));
    advance();
  }
  ~EncodedAllReduce() override { waitForDestruction(); }

  static size_t pieceCount(const State& h, size_t count) {
    const size_t g = static_cast<size_t>(h.groupSize());
    return (count + g - 1) / g;
  }
  static size_t bytes(const State& h, size_t count, const WireFormat& w) {
    const size_t I = h.intra_.size(), J = h.inter_.size(), m = pieceCount(h, count);
    return (I * J + J + 1) * m * sizeof(float) + 3 * J * encodedBytes(w, m);
  }

 private:
  float* res(size_t j) const { return residual_ == nullptr ? nullptr : residual_ + j * m_; }

  StatusOr<WorkHandle> issue(int phase) override {
    switch (phase) {
      case 0:
        return h_.intra_.ireduceScatter(P_, Q_, J_ * m_, DType::kFloat32, op_);
      case 1:
        return exchangeEncoded(h_.inter_, w_, Q_, m_, me_, send_, recv_,
                               [this](size_t j) { return res(j); });
      case 2: {
        // Our piece's sum in node order (ours exact), then encoded once, with its own residual
        // (the slot of our piece).
        sumPieces(w_, recv_, q_, Q_ + me_ * m_, m_, me_, J_, op_, sum_);
        char* mine = gathered_ + me_ * q_;
        wireEncode(w_, sum_, m_, mine, res(me_));
        return h_.inter_.iallGather(mine, gathered_, q_, DType::kUInt8);
      }
      default: {
        for (size_t j = 0; j < J_; ++j) wireDecode(w_, gathered_ + j * q_, m_, Q_ + j * m_);
        float* mine = P_ + static_cast<size_t>(h_.intra_.rank()) * J_ * m_;
        std::memcpy(mine, Q_, J_ * m_ * sizeof(float));
        return h_.intra_.iallGather(mine, P_, J_ * m_, DType::kFloat32);
      }
    }
  }
  void finishPhases() override { std::memcpy(buf_, P_, count_ * sizeof(float)); }

  float* buf_;
  size_t count_;
  RedOp op_;
  WireFormat w_;
  float* residual_;
  size_t me_, m_, q_;
  float* P_;        // the padded buffer, I*J*m
  float* Q_;        // our intra block: J pieces of m
  float* sum_;      // our piece's sum
  char* send_;      // J encoded pieces (ours unused)
  char* recv_;      // J encoded pieces from the other nodes
  char* gathered_;  // J encoded sums
};

}  // namespace

size_t encodedAllReduceBytes(const State& h, size_t count) {
  return EncodedAllReduce::bytes(h, count, h.options_.allreduce_wire);
}

size_t encodedAllReduceResidual(const State& h, size_t count) {
  return static_cast<size_t>(h.inter_.size()) * EncodedAllReduce::pieceCount(h, count);
}

StatusOr<WorkHandle> startEncodedAllReduce(State& h, HostBuffer* slot, float* buf, size_t count,
                                           RedOp op, float* residual) {
  return WorkHandle(std::make_unique<EncodedAllReduce>(h, slot, buf, count, op,
                                                       h.options_.allreduce_wire, residual));
}

size_t quantChunkCount(const State& h, size_t count, const WireFormat& wire) {
  const size_t blocks = (count + wire.block - 1) / wire.block;
  return std::max<size_t>(1, std::min(h.chunkCount(count, DType::kFloat32), blocks));
}

size_t quantGatherBytes(const State& h, size_t count, const WireFormat& wire) {
  return QuantAllGather::bytes(h, count, wire);
}

size_t quantReduceBytes(const State& h, size_t count, const WireFormat& wire) {
  return QuantReduceScatter::bytes(h, count, wire);
}

StatusOr<WorkHandle> startQuantAllGather(State& h, HostBuffer* slot, const float* shard,
                                         const void* encoded, float* full, size_t count,
                                         const WireFormat& wire) {
  return WorkHandle(std::make_unique<QuantAllGather>(h, slot, shard, encoded, full, count, wire));
}

StatusOr<WorkHandle> startQuantReduceScatter(State& h, HostBuffer* slot, const float* full,
                                             float* shard, size_t count, RedOp op,
                                             const WireFormat& wire, float* residual) {
  return WorkHandle(
      std::make_unique<QuantReduceScatter>(h, slot, full, shard, count, op, wire, residual));
}

}  // namespace hsdp::hier_detail
