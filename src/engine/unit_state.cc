// The transition tables of a unit's two state machines (unit_state.h draws them) and the one
// function that moves a unit along them.
#include "engine/unit_state.h"

#include <string>

namespace hsdp::engine {

namespace {

using P = ParamState;
using G = GradState;

// Every allowed move, as (from, to); anything else is an engine bug. Kept as tables rather than
// switch statements so that the whole lifecycle reads in one place.
constexpr std::pair<P, P> kParamMoves[] = {
    {P::kSharded, P::kDeferred},        {P::kSharded, P::kGathering},
    {P::kSharded, P::kGathered},        {P::kNodeBlockKept, P::kDeferred},
    {P::kNodeBlockKept, P::kGathering}, {P::kNodeBlockKept, P::kSharded},
    {P::kDeferred, P::kGathering},      {P::kDeferred, P::kSharded},
    {P::kDeferred, P::kNodeBlockKept},  {P::kGathering, P::kGathered},
    {P::kGathering, P::kSharded},       {P::kGathering, P::kNodeBlockKept},
    {P::kGathered, P::kSharded},        {P::kGathered, P::kNodeBlockKept},
};
constexpr std::pair<G, G> kGradMoves[] = {
    {G::kEmpty, G::kAccumulating},    {G::kReduced, G::kAccumulating},
    {G::kAccumulating, G::kReducing}, {G::kReducing, G::kReduced},
    {G::kReduced, G::kEmpty},         {G::kReduced, G::kStepping},
    {G::kStepping, G::kStepped},      {G::kStepped, G::kEmpty},
};

template <class S, size_t N>
bool allowed(const std::pair<S, S> (&moves)[N], S from, S to) {
  for (const auto& [a, b] : moves)
    if (a == from && b == to) return true;
  return false;
}

template <class S>
Status check(std::string_view unit, S state, std::string_view verb,
             std::initializer_list<S> accepted, std::string_view hint) {
  for (S s : accepted)
    if (s == state) return okStatus();
  std::string needs;
  size_t k = 0;
  for (S s : accepted) {
    if (k > 0) needs += k + 1 == accepted.size() ? " or " : ", ";
    needs += stateName(s);
    ++k;
  }
  return failedPrecondition(verb, ": unit '", unit, "' is ", stateName(state), ", ", verb,
                            " needs ", needs, hint.empty() ? "" : "; ", hint);
}

template <class S, size_t N>
Status move(const std::pair<S, S> (&moves)[N], std::string_view unit, S& state, S to,
            std::string_view verb, std::initializer_list<S> from, std::string_view hint) {
  HSDP_RETURN_IF_ERROR(check(unit, state, verb, from, hint));
  if (!allowed(moves, state, to))
    return internalError(verb, ": unit '", unit, "' cannot move from ", stateName(state), " to ",
                         stateName(to), " (an engine bug)");
  state = to;
  return okStatus();
}

}  // namespace

const char* stateName(ParamState s) {
  switch (s) {
    case P::kSharded:
      return "Sharded";
    case P::kNodeBlockKept:
      return "Sharded (hpZ node block kept)";
    case P::kDeferred:
      return "Deferred";
    case P::kGathering:
      return "Gathering";
    case P::kGathered:
      return "Gathered";
  }
  return "?";
}

const char* stateName(GradState s) {
  switch (s) {
    case G::kEmpty:
      return "Empty";
    case G::kAccumulating:
      return "Accumulating";
    case G::kReducing:
      return "Reducing";
    case G::kReduced:
      return "Reduced";
    case G::kStepping:
      return "Stepping";
    case G::kStepped:
      return "Stepped";
  }
  return "?";
}

Status transition(std::string_view unit, ParamState& state, ParamState to, std::string_view verb,
                  std::initializer_list<ParamState> from, std::string_view hint) {
  return move(kParamMoves, unit, state, to, verb, from, hint);
}
Status transition(std::string_view unit, GradState& state, GradState to, std::string_view verb,
                  std::initializer_list<GradState> from, std::string_view hint) {
  return move(kGradMoves, unit, state, to, verb, from, hint);
}
Status require(std::string_view unit, ParamState state, std::string_view verb,
               std::initializer_list<ParamState> allowed, std::string_view hint) {
  return check(unit, state, verb, allowed, hint);
}
Status require(std::string_view unit, GradState state, std::string_view verb,
               std::initializer_list<GradState> allowed, std::string_view hint) {
  return check(unit, state, verb, allowed, hint);
}

Status forgetNodeBlock(std::string_view unit, ParamLifecycle& p, std::string_view verb) {
  if (p.state != ParamState::kNodeBlockKept) {
    p.rest = ParamState::kSharded;
    return okStatus();
  }
  return transition(unit, p.state, ParamState::kSharded, verb, {ParamState::kNodeBlockKept});
}

}  // namespace hsdp::engine
