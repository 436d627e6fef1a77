// Internal to the engine: one outcome for a collective decision.
#pragma once

#include "hsdp/status.h"
#include "hsdp/transport.h"

namespace hsdp::engine {

// Collective over `world`: every rank's `local`; the first failure (lowest rank) on every rank,
// the same message everywhere, preferring a cause over a consequence (`secondary`: this rank
// failed because another did, e.g. rank 0's commit that saw a peer's write fail), so every rank
// names the root cause.
[[nodiscard]] Status agreeOver(Comm& world, const Status& local, bool secondary = false);

}  // namespace hsdp::engine
