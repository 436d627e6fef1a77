// Internal to the engine: the one check behind the state machines of the engine's objects (the
// checkpoint saver, checkpoint/saver.h; an elastic group, elastic_group.h). Each keeps its moves
// in one table and changes state only through its transition(), which calls moveAlong: a move
// the table does not list is a FailedPrecondition naming the object and both states. (A unit's
// two machines, unit_state.h, also tell a caller's error from an engine bug; they keep theirs.)
#pragma once

#include <cstddef>
#include <string_view>
#include <utility>

#include "hsdp/status.h"

namespace hsdp::engine {

// `state` becomes `to` when `moves` lists (state, to); otherwise FailedPrecondition
// "<verb>: <object> is <state>, cannot move to <to>" followed by "; <hint>" when given.
// stateName(S) names the states.
template <class S, size_t N>
[[nodiscard]] Status moveAlong(const std::pair<S, S> (&moves)[N], std::string_view object, S& state,
                               S to, std::string_view verb, std::string_view hint) {
  for (const auto& [a, b] : moves) {
    if (a != state || b != to) continue;
    state = to;
    return okStatus();
  }
  return failedPrecondition(verb, ": ", object, " is ", stateName(state), ", cannot move to ",
                            stateName(to), hint.empty() ? "" : "; ", hint);
}

// A call that needs `state` to be `needed` and changes nothing: FailedPrecondition
// "<verb>: <object> is <state>, <verb> needs <needed>" followed by "; <hint>" when given.
template <class S>
[[nodiscard]] Status requireState(std::string_view object, S state, S needed, std::string_view verb,
                                  std::string_view hint) {
  if (state == needed) return okStatus();
  return failedPrecondition(verb, ": ", object, " is ", stateName(state), ", ", verb, " needs ",
                            stateName(needed), hint.empty() ? "" : "; ", hint);
}

}  // namespace hsdp::engine
