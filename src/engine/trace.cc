// The step timeline and its accounting (trace.h, docs/trace.md).
#include "engine/trace.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "hsdp/env.h"
#include "hsdp/files.h"
#include "hsdp/log.h"

namespace hsdp::engine {

namespace {
const env::StringParam kTrace{
    "HSDP_TRACE", env::StringParam::Kind::kString, "",
    "Directory each rank writes its step timeline to, as DIR/trace.rank<N>.json (Chrome trace "
    "events: Perfetto, chrome://tracing; `hsdp-trace merge|svg DIR`). Unset: no trace. The "
    "examples' --trace DIR sets it (docs/trace.md)."};
const env::IntParam kTraceEvents{
    "HSDP_TRACE_EVENTS", int64_t{1} << 18, 1024, int64_t{1} << 26,
    "Events each rank's trace ring holds (48 bytes each, allocated at finalize when HSDP_TRACE "
    "is set): past that the oldest are overwritten and the file counts them as dropped."};

constexpr const char* kKindNames[] = {"compute",        "wait gather",        "wait reduce-scatter",
                                      "wait replica",   "optimizer",          "gather",
                                      "reduce-scatter", "replica all-reduce", "snapshot",
                                      "step",           "bytes sent"};
constexpr const char* kLaneNames[] = {"compute", "gather", "reduce-scatter",
                                      "replica", "copies", "step"};
constexpr const char* kLevelNames[] = {"", "intra", "inter", "intra+inter", "replica"};
}  // namespace

const char* traceKindName(TraceKind k) { return kKindNames[static_cast<int>(k)]; }
const char* traceLaneName(TraceLane l) { return kLaneNames[static_cast<int>(l)]; }
const char* traceLevelName(TraceLevel l) { return kLevelNames[static_cast<int>(l)]; }

TraceLane laneOf(TraceKind k) {
  switch (k) {
    case TraceKind::kGather:
      return TraceLane::kGather;
    case TraceKind::kReduceScatter:
      return TraceLane::kReduceScatter;
    case TraceKind::kReplica:
      return TraceLane::kReplica;
    case TraceKind::kSnapshot:
      return TraceLane::kCopies;
    case TraceKind::kStep:
    case TraceKind::kSent:
      return TraceLane::kStep;
    default:
      return TraceLane::kCompute;
  }
}

std::string Tracer::directory(const std::string& configured) {
  return configured.empty() ? kTrace.get() : configured;
}

Status Tracer::start(const std::string& dir, int rank, int node, int world,
                     int64_t clock_offset_us) {
  rank_ = rank, node_ = node, world_ = world, offset_us_ = clock_offset_us;
  const int64_t now = nowUs();
  step_start_ = now;
  std::fill(std::begin(lane_end_), std::end(lane_end_), now);
  // Read even when tracing is off: a bad value is an error wherever it is set (bad input).
  HSDP_ASSIGN_OR_RETURN(int64_t n, kTraceEvents.value());
  if (dir.empty()) return okStatus();
  dir_ = dir;
  HSDP_RETURN_IF_ERROR(files::makeDirs(dir_).withContext("trace directory (HSDP_TRACE, --trace)"));
  ring_.assign(static_cast<size_t>(n), TraceEvent{});
  return okStatus();
}

void Tracer::push(const TraceEvent& e) {
  const uint64_t k = next_.fetch_add(1, std::memory_order_relaxed);
  ring_[k % ring_.size()] = e;
}

// The caller's thread did its own work between its last event and `until`.
void Tracer::computeGap(int64_t until) {
  int64_t& end = lane_end_[static_cast<int>(TraceLane::kCompute)];
  if (until > end) push({end, until, end, 0, -1, static_cast<int32_t>(step_), TraceKind::kCompute});
  end = std::max(end, until);
}

int64_t Tracer::wait(TraceKind kind, int unit, int64_t t0, int64_t t1) {
  const int64_t now = t1 >= 0 ? t1 : nowUs();
  seconds_[static_cast<int>(kind)] += static_cast<double>(now - t0) * 1e-6;
  if (on()) {
    computeGap(t0);
    push({t0, now, t0, 0, unit, static_cast<int32_t>(step_), kind});
    lane_end_[static_cast<int>(TraceLane::kCompute)] = now;
  }
  return now;
}

// Collectives on one lane run in issue order (a communicator's queue), so an event starts when
// it was issued or when the one before it ended, whichever is later: the lane shows the link busy.
void Tracer::collectiveSlow(TraceKind kind, TraceLevel level, int unit, uint64_t bytes,
                            int64_t issued, int64_t now) {
  int64_t& end = lane_end_[static_cast<int>(laneOf(kind))];
  const int64_t t0 = std::min(std::max(issued, end), now);
  push({t0, now, issued, bytes, unit, static_cast<int32_t>(step_), kind, level});
  end = std::max(end, now);
}

void Tracer::endStep() {
  const int64_t now = nowUs();
  if (on()) {
    computeGap(now);
    push({step_start_, now, step_start_, 0, -1, static_cast<int32_t>(step_), TraceKind::kStep});
  }
  step_start_ = now;
  ++step_;
}

StepAccounting Tracer::take() {
  StepAccounting a;
  double* s = seconds_;
  a.wait_gather_s = s[static_cast<int>(TraceKind::kWaitGather)];
  a.wait_reduce_s = s[static_cast<int>(TraceKind::kWaitReduce)];
  a.wait_replica_s = s[static_cast<int>(TraceKind::kWaitReplica)];
  a.optimizer_s = s[static_cast<int>(TraceKind::kOptimizer)];
  std::fill(std::begin(seconds_), std::end(seconds_), 0.0);
  return a;
}

Status Tracer::write() const {
  if (!on()) return okStatus();
  const uint64_t n = next_.load(std::memory_order_acquire);
  if (n == written_) return okStatus();  // the destructor after an explicit write
  written_ = n;
  const uint64_t cap = ring_.size(), kept = std::min(n, cap);
  std::string out;
  out.reserve(256 + kept * 200);
  char buf[512];
  std::snprintf(
      buf, sizeof(buf),
      "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"format\":\"hsdp-trace 1\",\"rank\":%d,"
      "\"node\":%d,\"world\":%d,\"clock_offset_us\":%" PRId64 ",\"steps\":%" PRId64
      ",\"events\":%" PRIu64 ",\"dropped\":%" PRIu64 "},\"traceEvents\":[\n",
      rank_, node_, world_, offset_us_, step_, kept, n - kept);
  out += buf;
  std::snprintf(buf, sizeof(buf),
                "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":"
                "\"rank %d (node %d)\"}},\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":"
                "\"process_sort_index\",\"args\":{\"sort_index\":%d}}",
                rank_, rank_, node_, rank_, rank_);
  out += buf;
  for (int l = 0; l < static_cast<int>(TraceLane::kCount); ++l) {
    std::snprintf(buf, sizeof(buf),
                  ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{"
                  "\"name\":\"%s\"}},\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":"
                  "\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
                  rank_, l, kLaneNames[l], rank_, l, l);
    out += buf;
  }
  for (uint64_t k = n - kept; k < n; ++k) {
    const TraceEvent& e = ring_[k % cap];
    std::snprintf(
        buf, sizeof(buf),
        ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"cat\":\"%s\",\"ts\":%" PRId64
        ",\"dur\":%" PRId64 ",\"args\":{\"step\":%d,\"unit\":%d,\"bytes\":%" PRIu64
        ",\"level\":\"%s\",\"issued_us\":%" PRId64 "}}",
        rank_, static_cast<int>(laneOf(e.kind)), traceKindName(e.kind), traceKindName(e.kind), e.t0,
        e.t1 - e.t0, e.step, e.unit, e.bytes, traceLevelName(e.level), e.issued);
    out += buf;
  }
  out += "\n]}\n";
  return files::writeFileAtomically(strCat(dir_, "/trace.rank", rank_, ".json"), out);
}

}  // namespace hsdp::engine
