#include "hsdp/schedule.h"

#include <algorithm>
#include <vector>

namespace hsdp {
namespace {

// One walk over `seq` (the order, or the order reversed). `reduce_at[i]`: call reduceGrad after
// fn at position i.
Status walk(ShardedModel& model, const std::vector<int>& seq, const std::vector<char>& reduce_at,
            const UnitFn& fn, int prefetch, const char* direction) {
  const size_t n = seq.size();
  const int units = model.numUnits();
  for (size_t i = 0; i < n; ++i)
    if (seq[i] < 0 || seq[i] >= units)
      return outOfRange(direction, ": position ", i, " names unit ", seq[i], " outside [0, ", units,
                        ")");
  std::vector<char> held(static_cast<size_t>(units), 0);  // unsharded by an issued position
  size_t issued = 0;  // positions [0, issued) have had their unshard() issued
  auto issueUpTo = [&](size_t limit) -> Status {
    limit = std::min(limit, n);
    while (issued < limit) {
      const int u = seq[issued];
      if (held[u]) break;  // an earlier position still holds it: issued after its reshard
      HSDP_RETURN_IF_ERROR(model.unshard(u).withContext(strCat(
          direction, ": unshard of unit '", model.unitName(u), "' (position ", issued, ")")));
      held[u] = 1;
      ++issued;
    }
    return okStatus();
  };
  for (size_t i = 0; i < n; ++i) {
    const int u = seq[i];
    HSDP_RETURN_IF_ERROR(issueUpTo(i + 1));
    auto where = [&] {
      return strCat(direction, ": unit '", model.unitName(u), "' (position ", i, ")");
    };
    HSDP_RETURN_IF_ERROR(model.waitForUnshard(u).withContext(where()));
    HSDP_RETURN_IF_ERROR(issueUpTo(i + 1 + static_cast<size_t>(prefetch)));
    HSDP_RETURN_IF_ERROR(fn(u).withContext(where()));
    if (reduce_at[i]) HSDP_RETURN_IF_ERROR(model.reduceGrad(u).withContext(where()));
    HSDP_RETURN_IF_ERROR(model.reshard(u).withContext(where()));
    held[u] = 0;
  }
  return okStatus();
}

Status checkArgs(std::span<const int> order, const ScheduleOptions& options) {
  if (order.empty()) return invalidArgument("unit schedule: the order is empty");
  if (options.prefetch < 0)
    return invalidArgument("unit schedule: prefetch=", options.prefetch, " must be >= 0");
  return okStatus();
}

}  // namespace

Status forwardUnits(ShardedModel& model, std::span<const int> order, const UnitFn& fn,
                    ScheduleOptions options) {
  HSDP_RETURN_IF_ERROR(checkArgs(order, options));
  std::vector<int> seq(order.begin(), order.end());
  return walk(model, seq, std::vector<char>(seq.size(), 0), fn, options.prefetch, "forward");
}

Status backwardUnits(ShardedModel& model, std::span<const int> order, const UnitFn& fn,
                     bool reduce_grads, ScheduleOptions options) {
  HSDP_RETURN_IF_ERROR(checkArgs(order, options));
  std::vector<int> seq(order.rbegin(), order.rend());
  std::vector<char> reduce_at(seq.size(), 0);
  if (reduce_grads) {
    // A unit's last use in backward is its last position in the reversed order.
    std::vector<char> seen(static_cast<size_t>(std::max(model.numUnits(), 0)), 0);
    for (size_t i = seq.size(); i-- > 0;) {
      const int u = seq[i];
      if (u < 0 || u >= model.numUnits() || seen[u]) continue;
      seen[u] = 1;
      reduce_at[i] = !model.frozen(u);
    }
  }
  return walk(model, seq, reduce_at, fn, options.prefetch, "backward");
}

}  // namespace hsdp
