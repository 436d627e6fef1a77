#include "common/step_split.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace examples {

hsdp::StatusOr<StepSplit> gatherStepSplit(hsdp::Comm& world, double ms,
                                          const hsdp::StepAccounting& acc) {
  constexpr int kN = 9;
  // Byte counts as doubles: exact below 2^53 bytes a step.
  const double mine[kN] = {ms,
                           acc.wait_gather_s * 1e3,
                           acc.wait_reduce_s * 1e3,
                           acc.wait_replica_s * 1e3,
                           acc.optimizer_s * 1e3,
                           static_cast<double>(acc.bytes_intra),
                           static_cast<double>(acc.bytes_inter),
                           static_cast<double>(acc.bytes_replica),
                           static_cast<double>(acc.bytes_shard)};
  const int n = world.size();
  std::vector<double> all(static_cast<size_t>(kN) * n);
  // Doubles as raw bytes: every rank has the same representation.
  HSDP_RETURN_IF_ERROR(world.allGather(mine, all.data(), kN * sizeof(double), hsdp::DType::kUInt8));
  auto at = [&](int r) { return &all[static_cast<size_t>(kN) * r]; };
  auto busy = [&](int r) { return at(r)[0] - at(r)[1] - at(r)[2] - at(r)[3]; };
  StepSplit s;
  double busy_sum = 0;
  for (int r = 0; r < n; ++r) {
    busy_sum += busy(r);
    s.bytes_intra += static_cast<uint64_t>(at(r)[5]);
    s.bytes_inter += static_cast<uint64_t>(at(r)[6]);
    s.bytes_replica += static_cast<uint64_t>(at(r)[7]);
    s.bytes_shard += static_cast<uint64_t>(at(r)[8]);
    if (at(r)[0] > at(s.rank)[0]) s.rank = r;
    if (busy(r) > busy(s.slowest)) s.slowest = r;
  }
  const double* m = at(s.rank);
  const double* q = at(s.slowest);
  s.ms = m[0];
  s.gather_ms = std::min(m[1], q[1]);
  s.reduce_ms = std::min(m[2], q[2]);
  s.replica_ms = std::min(m[3], q[3]);
  s.slowest_wait_ms = m[1] + m[2] + m[3] - s.exposed_ms();
  s.optimizer_ms = m[4];
  s.compute_ms = m[0] - m[1] - m[2] - m[3] - m[4];
  s.slowest_busy_over_mean_ms = busy(s.slowest) - busy_sum / n;
  return s;
}

void printStepSplit(const hsdp::Comm& world, const StepSplit& s) {
  if (world.rank() != 0) return;
  std::printf(
      "  split: compute %.1f + exposed gather %.1f reduce-scatter %.1f replica %.1f + optimizer "
      "%.1f + waiting for the slowest %.1f = %.1f ms (rank %d; slowest rank %d, busy +%.1f ms "
      "over the mean)\n",
      s.compute_ms, s.gather_ms, s.reduce_ms, s.replica_ms, s.optimizer_ms, s.slowest_wait_ms, s.ms,
      s.rank, s.slowest, s.slowest_busy_over_mean_ms);
  std::printf(
      "  bytes: intra %llu inter %llu replica %llu shard %llu (sent by all ranks this step)\n",
      static_cast<unsigned long long>(s.bytes_intra),
      static_cast<unsigned long long>(s.bytes_inter),
      static_cast<unsigned long long>(s.bytes_replica),
      static_cast<unsigned long long>(s.bytes_shard));
  std::fflush(stdout);
}

}  // namespace examples
