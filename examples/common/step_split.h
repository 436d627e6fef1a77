// The step split both examples print under each step row (docs/trace.md, "Accounting"): where
// the printed step time went, in parts that add up to it, from the engine's waits
// (ShardedModel::takeStepAccounting: the same waits the trace records).
//
// Every rank sends its step time and its waits. The slowest rank is the one that was busy
// longest (step time minus its waits: compute and optimizer); what it waited for is the
// communication nobody could hide. The printed rank is the one with the longest step (the
// step row's time_ms): its waits up to the slowest rank's, kind by kind, are exposed
// communication; the rest of its waiting is waiting for the slowest rank.
#pragma once

#include <cstdint>

#include "hsdp/sharded_model.h"
#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace examples {

struct StepSplit {
  double ms = 0;  // the longest step of any rank (time_ms)
  double compute_ms = 0, gather_ms = 0, reduce_ms = 0, replica_ms = 0, optimizer_ms = 0;
  double slowest_wait_ms = 0;  // waiting for the slowest rank
  int rank = 0;                // the rank with the longest step, whose time is split
  int slowest = 0;             // the rank busy longest
  double slowest_busy_over_mean_ms = 0;
  // Bytes every rank sent this step on each level, summed over the ranks (StepAccounting's
  // bytes_*): what hsdp-plan's "per level" predicts.
  uint64_t bytes_intra = 0, bytes_inter = 0, bytes_replica = 0, bytes_shard = 0;
  double exposed_ms() const { return gather_ms + reduce_ms + replica_ms; }
};

// Collective over `world`: every rank's `ms` and `acc` (this step's).
hsdp::StatusOr<StepSplit> gatherStepSplit(hsdp::Comm& world, double ms,
                                          const hsdp::StepAccounting& acc);
// Rank 0:   split: compute C + exposed gather G reduce-scatter R replica P + optimizer O +
//           waiting for the slowest W = T ms (rank r; slowest rank s, busy +X ms over the mean)
//           bytes: intra I inter E replica P shard S (sent by all ranks this step)
void printStepSplit(const hsdp::Comm& world, const StepSplit& s);

}  // namespace examples
