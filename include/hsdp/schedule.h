// The unit loop every training program writes: walk the units forward, then backward, with the
// next units' gathers in flight while the current one computes (prefetch), FSDP-style.
//
//   const std::vector<int> order = {embed, h0, h1, ..., ln_f, embed};   // a unit may repeat
//   HSDP_RETURN_IF_ERROR(hsdp::forwardUnits(model, order, [&](int unit) -> hsdp::Status {
//     ... model.param(unit, "w") ...   // the unit's full parameters
//     return hsdp::okStatus();
//   }));
//   HSDP_RETURN_IF_ERROR(hsdp::backwardUnits(model, order, [&](int unit) -> hsdp::Status {
//     ... write model.grad(unit, "w") ...
//     return hsdp::okStatus();
//   }, /*reduce_grads=*/last_micro_step));
//   HSDP_RETURN_IF_ERROR(model.step());
//
// forwardUnits: for each position of `order`: waitForUnshard, issue the gathers of the next
// `prefetch` positions, fn(unit), reshard. backwardUnits does the same over `order` reversed
// and, with reduce_grads, calls reduceGrad(unit) right after fn at the unit's last use in
// backward (its first position in `order`), so a unit used twice (a tied embedding and LM head)
// accumulates both gradients before it is reduced once. Frozen units are never reduced.
//
// The gathers are issued in position order, so every rank issues the same sequence. A unit is
// not prefetched while an earlier position still holds it unsharded; its gather is issued when
// that position reshards it. prefetch = 0 gathers each unit only when its turn comes (no overlap:
// what FSDP calls no prefetch; useful to measure what prefetching hides).
#pragma once

#include <functional>
#include <span>

#include "hsdp/sharded_model.h"
#include "hsdp/status.h"

namespace hsdp {

struct ScheduleOptions {
  int prefetch = 1;  // positions gathered ahead of the current one; >= 0
};

using UnitFn = std::function<Status(int unit)>;

// Errors: a negative prefetch or an empty order (InvalidArgument), a unit index out of range
// (OutOfRange, from the model), the first error of fn or of the model's calls, with the unit and
// position named. After an error the walk stops where it is; the model may be left with units
// unsharded (a failed step ends the job).
[[nodiscard]] Status forwardUnits(ShardedModel& model, std::span<const int> order, const UnitFn& fn,
                                  ScheduleOptions options = {});
[[nodiscard]] Status backwardUnits(ShardedModel& model, std::span<const int> order,
                                   const UnitFn& fn, bool reduce_grads,
                                   ScheduleOptions options = {});

}  // namespace hsdp
