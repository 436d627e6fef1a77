// A unit's lifecycle as two explicit state machines, one for its parameters and one for its
// gradient, each with the payload its states own; every change of state goes through
// transition(), which checks it against the table in unit_state.cc and names the unit and both
// states when a call comes at the wrong time.
//
// Parameters (param_group.cc; step.cc and checkpoint/load.cc forget kept node blocks):
//   Sharded | NodeBlockKept --unshard--> Deferred   (rate limited: the gather waits for a slot)
//                                    --> Gathering  (the all-gather is in flight)
//                                    --> Gathered   (nothing to gather: mode none, zero1/zero2)
//   Deferred --slot frees / waitForUnshard--> Gathering --waitForUnshard--> Gathered
//   Deferred | Gathering | Gathered --reshard--> Sharded | NodeBlockKept (hpZ keeps the node's
//                                               block of the gathered parameters until step())
//   NodeBlockKept --step / load--> Sharded
// Gradient (grad_reducer.cc, step.cc):
//   Empty | Reduced --grad / copyInGrads--> Accumulating --reduceGrad--> Reducing
//   Reducing --reductions land--> Reduced --step()--> Empty
//   Reduced --offload launches the unit's step--> Stepping --its job lands--> Stepped
//   Stepped --step()--> Empty
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "hsdp/status.h"
#include "hsdp/transport.h"  // WorkHandle

namespace hsdp::engine {

enum class ParamState : uint8_t { kSharded, kNodeBlockKept, kDeferred, kGathering, kGathered };
enum class GradState : uint8_t { kEmpty, kAccumulating, kReducing, kReduced, kStepping, kStepped };

const char* stateName(ParamState s);
const char* stateName(GradState s);

// The parameter state and what it holds.
struct ParamLifecycle {
  ParamState state = ParamState::kSharded;
  // Deferred/Gathering/Gathered: the sharded state reshard() returns to (the state unshard()
  // left; step() and load turn a kept node block into kSharded, its block being stale).
  ParamState rest = ParamState::kSharded;
  float* full = nullptr;    // Gathering/Gathered: the full parameters (pool block, or the shard)
  void* block16 = nullptr;  // Gathering with bf16 parameters: the pool block the gather fills
  WorkHandle work;          // Gathering: the all-gather in flight
  int64_t issued_us = 0;    // Gathering: when the all-gather was issued (the trace's)
  uint64_t wire_bytes = 0;  // Gathering: the bytes it gathers (the trace's)
};

// The gradient state and what it holds.
struct GradLifecycle {
  GradState state = GradState::kEmpty;
  float* full = nullptr;    // Accumulating, and Reducing until the scatter lands: full gradient
  void* block16 = nullptr;  // Reducing with a bf16 reduce: the wire copy of the full gradient
  int64_t ticket = 0;       // Stepping: the StepQueue ticket of the unit's offloaded step
};

// The one place a unit changes state. `from` lists the states `verb` accepts (the caller's
// contract); a state outside it is FailedPrecondition "<verb>: unit '<unit>' is <state>, <verb>
// needs <from>" followed by `hint` when given. A move the table does not allow is an Internal
// error (an engine bug, never a caller's). On success `state` is `to`.
[[nodiscard]] Status transition(std::string_view unit, ParamState& state, ParamState to,
                                std::string_view verb, std::initializer_list<ParamState> from,
                                std::string_view hint = {});
[[nodiscard]] Status transition(std::string_view unit, GradState& state, GradState to,
                                std::string_view verb, std::initializer_list<GradState> from,
                                std::string_view hint = {});
// A verb that needs the unit in one of `allowed` and changes nothing (param(), copy-out).
[[nodiscard]] Status require(std::string_view unit, ParamState state, std::string_view verb,
                             std::initializer_list<ParamState> allowed, std::string_view hint = {});
[[nodiscard]] Status require(std::string_view unit, GradState state, std::string_view verb,
                             std::initializer_list<GradState> allowed, std::string_view hint = {});

// The parameters changed (step, load): a kept hpZ node block is stale. NodeBlockKept ->
// Sharded; a unit still unsharded returns to Sharded at reshard (and keeps a fresh block then).
[[nodiscard]] Status forgetNodeBlock(std::string_view unit, ParamLifecycle& p,
                                     std::string_view verb);

}  // namespace hsdp::engine
