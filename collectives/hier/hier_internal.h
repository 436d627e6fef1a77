// Private to collectives/hier/: what the schedules of one HierarchicalCollectives share (the
// levels, the options, staging and the issue order) and the machinery they are built from: a
// ScheduleWork advanced by the progress loop, the ChunkPipeline every pipelined schedule is, and
// the PhasedSchedule of the unpipelined forms. hier_collectives.cc holds the fp32/bf16 schedules
// and the public class, hier_allreduce.cc the all-reduce, hier_quantized.cc the block-quantized
// wire's schedules.
#pragma once

#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

#include "core/progress.h"
#include "core/scratch_pool.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/quantize.h"

namespace hsdp::hier_detail {

// Chunk c of `count` elements cut into `chunks` nearly equal parts (the first count % chunks
// parts are one longer), so any chunk count works with any size.
inline std::pair<size_t, size_t> chunkRange(size_t count, size_t chunks, size_t c) {
  const size_t base = count / chunks, extra = count % chunks;
  const size_t off = c * base + std::min(c, extra);
  return {off, base + (c < extra ? 1 : 0)};
}

// Everything the schedules of one HierarchicalCollectives share: the two levels, the options,
// the staging slots and the issue order. The public class is a handle to it (pImpl), so the
// schedule classes need no friendship.
struct State {
  State(Comm& intra, Comm& inter, HierOptions options)
      : intra_(intra), inter_(inter), options_(options), pool_(std::make_unique<ScratchPool>()) {}

  int groupSize() const { return intra_.size() * inter_.size(); }
  size_t chunkCount(size_t count, DType dtype) const;
  // The inter wires in effect: gather_wire / reduce_wire, or bf16 where inter_dtype is bf16
  // and the wire is left at fp32.
  WireFormat gatherWire() const { return effective(options_.gather_wire); }
  WireFormat reduceWire() const { return effective(options_.reduce_wire); }
  // An all-reduce of `dtype` data over the encoded all-reduce wire (any non-fp32 wire).
  bool encodesAllReduce(DType dtype) const {
    return options_.allreduce_wire.wire != Wire::kFp32 && dtype == DType::kFloat32 &&
           inter_.size() > 1;
  }
  WireFormat effective(WireFormat w) const {
    if (w.wire == Wire::kFp32 && options_.inter_dtype == DType::kBFloat16) w.wire = Wire::kBf16;
    return w;
  }
  // Whether `wire` quantizes an operation on `dtype` data: int8/int4 of float32 data across more
  // than one node (otherwise nothing crosses nodes, or the data is not float32).
  bool quantizes(const WireFormat& wire, DType dtype) const {
    return wireQuantized(wire.wire) && dtype == DType::kFloat32 && inter_.size() > 1;
  }
  // The element type crossing nodes in the fp32/bf16 schedules: bf16 for float32 data on a bf16
  // wire, else the data's own.
  static DType wire16(const WireFormat& wire, DType dtype) {
    return wire.wire == Wire::kBf16 && dtype == DType::kFloat32 ? DType::kBFloat16 : dtype;
  }
  bool pipelined(size_t count, DType dtype, DType wire) const;
  size_t stagingBytes(size_t count, DType dtype, DType wire) const;
  size_t allReduceBytes(size_t count, DType dtype) const;
  // The one level to hand a small all-reduce to (null: run the schedule).
  Comm* singleLevelAllReduce(size_t count, DType dtype);
  bool mayIssue(const void* w) const { return !issuing_.empty() && issuing_.front() == w; }
  void doneIssuing(const void* w);

  // `encoded` (quantized wires only): the shard already encoded with `wire` (the engine's
  // cached master shard); null: encoded chunk by chunk from `shard`.
  StatusOr<WorkHandle> iallGather(const void* shard, void* full, size_t count, DType dtype,
                                  const WireFormat& wire, const void* encoded);
  StatusOr<WorkHandle> ireduceScatter(const void* full, void* shard, size_t count, DType dtype,
                                      RedOp op, float* residual);
  StatusOr<WorkHandle> iallReduce(void* buf, size_t count, DType dtype, RedOp op, float* residual);

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
  ScheduleWork(State& h, HostBuffer* slot)
      : h_(h),
        slot_(slot),
        label_(watchdog::currentLabel()),
        I_(h.intra_.size()),
        J_(h.inter_.size()) {
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
  // The shape every schedule is laid out by: I ranks on the intra level, J on the inter level
  // (I*J pieces of a chunk, J of them in an intra block).
  const size_t I_, J_;
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

  ChunkPipeline(State& h, HostBuffer* slot, size_t chunks, std::vector<Level> stage_levels,
                size_t max_in_flight)
      : ScheduleWork(h, slot),
        C_(chunks),
        slots_(slotsFor(chunks)),
        levels_(std::move(stage_levels)),
        max_in_flight_(max_in_flight),
        stage_(chunks, 0),
        busy_(chunks, false),
        works_(chunks) {}

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
  std::vector<int> stage_;  // per chunk: stages completed
  std::vector<bool> busy_;  // per chunk: a stage in flight
  std::vector<WorkHandle> works_;
  std::vector<Op> order_[2];
  size_t next_[2] = {0, 0}, in_flight_[2] = {0, 0}, done_chunks_ = 0;
};

// A schedule of phases that run one after another, each one sub-operation (the unpipelined
// two-phase forms and the all-reduce). A phase is issued only in this object's turn (start
// order), and the work completes when the last phase has.
class PhasedSchedule : public ScheduleWork {
 public:
  PhasedSchedule(State& h, HostBuffer* slot, int phases) : ScheduleWork(h, slot), phases_(phases) {}

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

// The block-quantized schedules (hier_quantized.cc). Chunks of a quantized operation start at
// multiples of the block size within the shard, so chunk c's encoding is one contiguous byte
// range of the whole shard's (encodedOffset).
size_t quantChunkCount(const State& h, size_t count, const WireFormat& wire);
// Staging bytes of one quantized all-gather / reduce-scatter of `count` elements per shard.
size_t quantGatherBytes(const State& h, size_t count, const WireFormat& wire);
size_t quantReduceBytes(const State& h, size_t count, const WireFormat& wire);
StatusOr<WorkHandle> startQuantAllGather(State& h, HostBuffer* slot, const float* shard,
                                         const void* encoded, float* full, size_t count,
                                         const WireFormat& wire);
StatusOr<WorkHandle> startQuantReduceScatter(State& h, HostBuffer* slot, const float* full,
                                             float* shard, size_t count, RedOp op,
                                             const WireFormat& wire, float* residual);
// The all-reduce over the encoded all-reduce wire (HierOptions::allreduce_wire): staging bytes,
// residual floats, and the schedule.
size_t encodedAllReduceBytes(const State& h, size_t count);
size_t encodedAllReduceResidual(const State& h, size_t count);
StatusOr<WorkHandle> startEncodedAllReduce(State& h, HostBuffer* slot, float* buf, size_t count,
                                           RedOp op, float* residual);

}  // namespace hsdp::hier_detail
