// The elastic membership a reference replays (mlp/reference.h, gpt/reference.h) and a checkpoint
// records (common/checkpointing.h). Plain data: no Eigen, no MPI.
#pragma once

#include <vector>

namespace examples {

// Elastic groups that keep their slice (hsdp::ElasticData::kKeepSlice): each step's gradient is
// the mean over the groups present at that step (`present[step]`, group indexes) of each group's
// mean gradient over its own slice (slice g of slices(step) equal parts of the global batch).
// A job resumed from an elastic checkpoint may have another number of groups than the job that
// saved it: `step_groups[step]` is the group count of the job that ran that step (`groups` past
// its end).
struct Membership {
  int groups = 1;
  std::vector<int> step_groups;
  std::vector<std::vector<int>> present;
  bool empty() const { return present.empty(); }
  int slices(int step) const {
    return step < static_cast<int>(step_groups.size()) ? step_groups[step] : groups;
  }
};

}  // namespace examples
