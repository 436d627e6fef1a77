// The fp32/bf16 all-gather and reduce-scatter schedules (two-phase, pipelined) and the public
// class; the all-reduce is in hier_allreduce.cc, the shared machinery in hier_internal.h, the
// block-quantized schedules in hier_quantized.cc.
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
  char* full[ChunkPipeline::kSlots];    // I*J pieces
  char* half[ChunkPipeline::kSlots];    // J pieces
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

// What the fp32/bf16 all-gather and reduce-scatter pipelines share: `count` elements per shard of
// `dtype`, cut into State::chunkCount chunks that each take one stage per level (`first`, then the
// other) in the two-stage order, two operations per level in flight, staged in the slot's
// TwoLevelStaging; `wire` is the element type that crosses nodes (the data's own, or bf16).
class TwoLevelPipeline : public ChunkPipeline {
 protected:
  TwoLevelPipeline(State& h, HostBuffer* slot, size_t count, DType dtype, DType wire, Level first)
      : ChunkPipeline(h, slot, h.chunkCount(count, dtype),
                      {first, first == kIntra ? kInter : kIntra}, 2),
        count_(count),
        dtype_(dtype),
        wire_(wire),
        st_(slot, slotsFor(numChunks()), I_, J_, range(0).second, dtypeSize(dtype), wire != dtype) {
    setTwoStageOrder();
  }

  // Chunk c of a shard: its first element and its length.
  std::pair<size_t, size_t> range(size_t c) const { return chunkRange(count_, numChunks(), c); }

  const size_t count_;
  const DType dtype_, wire_;
  TwoLevelStaging st_;
};

// all-gather: chunk c goes inter, then intra, and lands in place: the inter all-gather writes
// the J pieces of this rank's intra block straight into `full` (runs {n, 1, count} from
// (i*J)*count + off), then the intra all-gather, in place from there, writes every rank's J
// pieces at (i*J + j)*count + off (runs {n, J, count}; Comm::iallGatherRuns). With a bf16 wire
// the inter phase goes through the wire stages and is converted into the runs when it lands. A
// transport that cannot land runs in place unpacks them from the slot's stages (the default).
class PipelinedAllGather final : public TwoLevelPipeline {
 public:
  PipelinedAllGather(State& h, HostBuffer* slot, const void* shard, void* full, size_t count,
                     DType dtype, DType wire)
      : TwoLevelPipeline(h, slot, count, dtype, wire, kInter),
        shard_(static_cast<const char*>(shard)),
        full_(static_cast<char*>(full)) {
    advance();
  }
  ~PipelinedAllGather() override { waitForDestruction(); }

 private:
  // Where chunk c's J pieces of this rank's intra block start in `full`.
  char* block(size_t off) const {
    return full_ + (static_cast<size_t>(h_.intra_.rank()) * J_ * count_ + off) * dtypeSize(dtype_);
  }

  StatusOr<WorkHandle> issue(size_t c, int stage) override {
    const size_t es = dtypeSize(dtype_), b = slotOf(c);
    auto [off, n] = range(c);
    if (stage == 1)
      return h_.intra_.iallGatherRuns(block(off), full_ + off * es, {n, J_, count_}, dtype_,
                                      st_.full[b]);
    if (wire_ == dtype_)
      return h_.inter_.iallGatherRuns(shard_ + off * es, block(off), {n, 1, count_}, dtype_,
                                      st_.half[b]);
    convert(shard_ + off * es, dtype_, st_.one16[b], wire_, n);
    return h_.inter_.iallGather(st_.one16[b], st_.half16[b], n, wire_);
  }
  void landed(size_t c, int stage) override {
    if (stage != 0 || wire_ == dtype_) return;
    const size_t b = slotOf(c), ws = dtypeSize(wire_), es = dtypeSize(dtype_);
    auto [off, n] = range(c);
    for (size_t j = 0; j < J_; ++j)
      convert(st_.half16[b] + j * n * ws, wire_, block(off) + j * count_ * es, dtype_, n);
  }

  const char* shard_;
  char* full_;
};

// reduce-scatter: chunk c's I*J pieces of the user's buffer are reduced inside the node (-> half,
// J pieces; a transport that cannot read them in place packs them into `full` first), then
// across nodes (half -> the shard's chunk).
class PipelinedReduceScatter final : public TwoLevelPipeline {
 public:
  PipelinedReduceScatter(State& h, HostBuffer* slot, const void* full, void* shard, size_t count,
                         DType dtype, RedOp op, DType wire)
      : TwoLevelPipeline(h, slot, count, dtype, wire, kIntra),
        full_(static_cast<const char*>(full)),
        shard_(static_cast<char*>(shard)),
        op_(op) {
    advance();
  }
  ~PipelinedReduceScatter() override { waitForDestruction(); }

 private:
  StatusOr<WorkHandle> issue(size_t c, int stage) override {
    const size_t es = dtypeSize(dtype_), b = slotOf(c);
    auto [off, n] = range(c);
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
    auto [off, n] = range(c);
    convert(st_.one16[b], wire_, shard_ + off * es, dtype_, n);
  }

  const char* full_;
  char* shard_;
  RedOp op_;
};

// Unpipelined two-phase all-gather (one chunk, one wire type): lands in place, no staging.
class TwoPhaseAllGather final : public PhasedSchedule {
 public:
  TwoPhaseAllGather(State& h, const void* shard, void* full, size_t count, DType dtype)
      : PhasedSchedule(h, nullptr, 2), shard_(shard), full_(full), count_(count), dtype_(dtype) {
    block_ = static_cast<char*>(full) +
             static_cast<size_t>(h.intra_.rank()) * J_ * count * dtypeSize(dtype);
    advance();
  }
  ~TwoPhaseAllGather() override { waitForDestruction(); }

 private:
  StatusOr<WorkHandle> issue(int p) override {
    if (p == 0) return h_.inter_.iallGather(shard_, block_, count_, dtype_);
    return h_.intra_.iallGather(block_, full_, J_ * count_, dtype_);
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
  TwoPhaseReduceScatter(State& h, HostBuffer* slot, const void* full, void* shard, size_t count,
                        DType dtype, RedOp op)
      : PhasedSchedule(h, slot, 2),
        full_(full),
        shard_(shard),
        count_(count),
        dtype_(dtype),
        op_(op) {
    advance();
  }
  ~TwoPhaseReduceScatter() override { waitForDestruction(); }

 private:
  StatusOr<WorkHandle> issue(int p) override {
    if (p == 0) return h_.intra_.ireduceScatter(full_, slot_->data(), J_ * count_, dtype_, op_);
    return h_.inter_.ireduceScatter(slot_->data(), shard_, count_, dtype_, op_);
  }

  const void* full_;
  void* shard_;
  size_t count_;
  DType dtype_;
  RedOp op_;
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
  if (options.chunks < 1)
    return invalidArgument("pipeline chunks ", options.chunks, " must be >= 1");
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

}  // namespace hsdp
