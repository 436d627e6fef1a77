// The step timeline and its accounting (docs/trace.md). UnitCollectives owns one Tracer: every
// collective of a unit is issued and waited for through it, so the gather path (param_group.cc),
// the gradient path (grad_reducer.cc) and the step (step.cc) stamp their events here.
//
// Two things, from the same measurements:
//  - the accounting, always on: the seconds this rank's caller thread spent waiting for each kind
//    of collective and in the optimizer since the last take (ShardedModel::takeStepAccounting);
//  - the trace, with HSDP_TRACE=DIR (EngineConfig::trace_dir): every event in a ring of fixed-size
//    records allocated at finalize (HSDP_TRACE_EVENTS of them), claimed by one atomic increment
//    and written without a lock or an allocation; the oldest are overwritten when it wraps (the
//    file says how many). write() turns it into DIR/trace.rank<N>.json (Chrome trace events).
// Off, recording is one predictable branch on `on()`.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "hsdp/sharded_model.h"
#include "hsdp/status.h"

namespace hsdp::engine {

// What an event is. Its lane (the trace's thread) follows from it: laneOf.
enum class TraceKind : uint8_t {
  kCompute,        // the caller's own work: the gap between its waits (lane compute)
  kWaitGather,     // waitForUnshard (or reshard, step's zero1/2 gathers) blocked on a gather
  kWaitReduce,     // step() blocked on a reduce-scatter
  kWaitReplica,    // step() blocked on a replica all-reduce (or the elastic groups' average)
  kOptimizer,      // step(): the norm, Adam (inline) or the wait for the offloaded steps
  kGather,         // an all-gather, issue -> seen complete (lane gather)
  kReduceScatter,  // a reduce-scatter (lane reduce-scatter)
  kReplica,        // a replica all-reduce (lane replica)
  kSnapshot,       // a checkpoint snapshot (lane copies)
  kStep,           // a step, end of the last one -> end of step() (lane step)
  kSent,           // the bytes this rank sent on one level in the step: zero length, at its end
  kCount
};
enum class TraceLane : uint8_t {
  kCompute,
  kGather,
  kReduceScatter,
  kReplica,
  kCopies,
  kStep,
  kCount
};
// The link an event's bytes crossed.
enum class TraceLevel : uint8_t { kNone, kIntra, kInter, kIntraInter, kReplica };

const char* traceKindName(TraceKind k);
const char* traceLaneName(TraceLane l);
const char* traceLevelName(TraceLevel l);
TraceLane laneOf(TraceKind k);

struct TraceEvent {
  int64_t t0 = 0, t1 = 0;  // steady clock, µs
  int64_t issued = 0;      // collectives: when issued (t0 is later when the lane was busy)
  uint64_t bytes = 0;      // bytes of the whole collective (a gather's full unit)
  int32_t unit = -1;
  int32_t step = 0;
  TraceKind kind = TraceKind::kCompute;
  TraceLevel level = TraceLevel::kNone;
};

static_assert(sizeof(TraceEvent) == 48, "docs/trace.md and HSDP_TRACE_EVENTS say 48 bytes");

class Tracer {
 public:
  static int64_t nowUs() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // HSDP_TRACE (EngineConfig::trace_dir wins), "" when off.
  static std::string directory(const std::string& configured);

  // finalize(): the ring (HSDP_TRACE_EVENTS records) and who this rank is; `clock_offset_us` is
  // this rank's steady clock minus rank 0's. Tracing stays off when `dir` is "".
  [[nodiscard]] Status start(const std::string& dir, int rank, int node, int world,
                             int64_t clock_offset_us);
  bool on() const { return !ring_.empty(); }
  int64_t step() const { return step_; }

  // A wait on the caller's thread from `t0` to now, of kind kWait* or kOptimizer: counted in the
  // accounting, and (on) recorded with the compute gap before it. Returns now.
  // With `t1` >= 0 the wait ended then (a wait split between two kinds).
  int64_t wait(TraceKind kind, int unit, int64_t t0, int64_t t1 = -1);
  // A collective seen complete now (issued at `issued`), on its lane; or at `ended`, when the
  // progress loop saw it (engine/reduce_chain.h).
  void collective(TraceKind kind, TraceLevel level, int unit, uint64_t bytes, int64_t issued,
                  int64_t ended = -1) {
    if (on()) collectiveSlow(kind, level, unit, bytes, issued, ended >= 0 ? ended : nowUs());
  }
  // A snapshot's copy [t0, t1].
  void snapshot(uint64_t bytes, int64_t t0, int64_t t1) {
    if (on()) push({t0, t1, t0, bytes, -1, static_cast<int32_t>(step_), TraceKind::kSnapshot});
  }
  // The end of step(): the step event and the compute gap before it; the next step begins.
  void endStep();
  // After endStep(): the bytes this rank sent on `level` in the step that just ended
  // (UnitCollectives::traceLevelBytes; the shard-group route as kIntraInter).
  void sent(TraceLevel level, uint64_t bytes) {
    if (on())
      push({step_start_, step_start_, step_start_, bytes, -1, static_cast<int32_t>(step_ - 1),
            TraceKind::kSent, level});
  }
  StepAccounting take();

  // DIR/trace.rank<N>.json; the events stay (a later write rewrites the file with more).
  [[nodiscard]] Status write() const;

 private:
  void collectiveSlow(TraceKind kind, TraceLevel level, int unit, uint64_t bytes, int64_t issued,
                      int64_t now);
  void push(const TraceEvent& e);
  void computeGap(int64_t until);

  std::vector<TraceEvent> ring_;  // empty: off
  std::atomic<uint64_t> next_{0};
  int64_t lane_end_[static_cast<int>(TraceLane::kCount)] = {};
  int64_t step_start_ = 0;
  int64_t step_ = 0;
  double seconds_[static_cast<int>(TraceKind::kCount)] = {};
  std::string dir_;
  int rank_ = 0, node_ = 0, world_ = 1;
  int64_t offset_us_ = 0;
  mutable uint64_t written_ = ~uint64_t{0};  // events at the last write
};

}  // namespace hsdp::engine
