// Internal to the engine: a unit's gradient reduction on the host as one Work that the progress
// loop drives (core/progress.h): the reduce-scatter over the shard group, and the moment it lands
// the replica all-reduce of the shard, in chunks over the link. Any test or wait of any hsdp
// collective advances it (a rank blocked on the next unit's gather starts the replica reduction
// of the unit whose scatter just landed), and so does the progress thread while the caller
// computes; before, it started at the caller's next engine call.
//
// Order. Every rank issues the replica chunks in the same order on the replica communicator:
// chains take turns in creation order (reduceGrad's, the same on every rank), and a chain issues
// its chunks one after another. By need: while a gather that crosses nodes is in flight on this
// rank (the next unit's parameters, which the caller will wait for), no further chunk is put on
// the link; the chunk in flight finishes. Gathers never wait for a replica chunk, so holding one
// cannot deadlock, and step()'s wait issues whatever is left once the gathers have landed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/progress.h"
#include "hsdp/transport.h"

namespace hsdp::engine {

class UnitCollectives;

class ReduceChain final : public ProgressiveWork {
 public:
  // `scatter` lands in `shard` (`count` fp32 elements), which is then averaged in place over the
  // replicas in chunks of `chunk` elements (0: one piece); `seq` is its turn on the replica
  // communicator (UnitCollectives::replicaTurn). Two chunks are on the link at a time, so it is
  // not idle between them.
  ReduceChain(UnitCollectives& coll, WorkHandle scatter, float* shard, size_t count, size_t chunk,
              float* residual, std::string label, uint64_t seq);
  ~ReduceChain() override;

  // Read under progressLock() (the progress thread writes them): whether the scatter has landed
  // (the full gradient's memory is free) and when, and when the first replica chunk went out.
  bool scatterLanded() const;
  // A Work that waits for and tests this chain without owning it (what reached() may reset
  // while the owner still reads the chain's times).
  WorkHandle view();
  int64_t landedUs() const { return landed_us_; }
  int64_t replicaIssuedUs() const { return replica_issued_us_; }

 protected:
  void advance() override;

 private:
  // The next chunk on the link, if it is this chain's turn and nothing needed is in flight.
  Status issueNext();

  UnitCollectives& coll_;
  WorkHandle scatter_;
  float* shard_;
  size_t count_, chunk_, issued_ = 0;  // elements whose all-reduce went out
  float* residual_;
  std::string label_;  // the unit, for the watchdog's fingerprints
  uint64_t seq_;
  bool landed_ = false;
  int64_t landed_us_ = 0, replica_issued_us_ = 0;
  static constexpr int kWindow = 2;
  WorkHandle inflight_[kWindow];  // the chunks on the link, oldest first
};

}  // namespace hsdp::engine
