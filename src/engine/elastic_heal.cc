// ElasticGroup's heal on the peer transport (docs/elastic.md, "The heal"): the groups that do
// not hold the step's state receive it from their donor over a Comm of the donor and the groups
// it heals, split from the step's replica Comm, through UnitCollectives' broadcast.
#include <algorithm>

#include "engine/elastic_group.h"

namespace hsdp::engine {
namespace {

// The heal moves the state in broadcasts of at most this many bytes: the transport's deadline
// without progress then bounds one piece, and a donor of several groups serves them in turn.
constexpr size_t kHealPieceBytes = size_t{4} << 20;

}  // namespace

Status ElasticGroup::heal(const HealState& state, StepStart* out) {
  // No member heals: nothing to split (every member reads the same quorum, so all skip alike).
  if (std::none_of(q_.members.begin(), q_.members.end(),
                   [](const elastic::Member& m) { return !m.heal_from.empty(); }))
    return okStatus();
  const elastic::Member& me = q_.members[self_];
  const std::string& donor = me.heal_from.empty() ? name_ : me.heal_from;
  // The heal's members: the donor (its root), then the groups it heals, in quorum order.
  std::vector<int> members{memberIndex(q_, donor)};
  if (members[0] < 0)
    return internalError("elastic: group ", name_, " heals from ", donor,
                         ", which is not in the quorum of step ", q_.step);
  for (size_t k = 0; k < q_.members.size(); ++k)
    if (q_.members[k].heal_from == donor) members.push_back(static_cast<int>(k));
  // The heal's Comm is a split of the step's replica Comm (collective over every member: a
  // member that neither donates nor heals is a part of its own): it moves data over the
  // replica Comm's endpoints. A second Comm built from the same addresses would connect a
  // second set of endpoints between the same workers, which UCX's wire-up can pair crosswise
  // with the first (docs/elastic.md, "The heal": the first average after a heal failed
  // "Request canceled").
  const int n = static_cast<int>(q_.members.size());
  const bool alone = members.size() == 1;
  const int color = alone ? n + self_ : members[0];
  const int key = self_ == members[0] ? -1 : self_;
  const std::string what =
      strCat("the heal of step ", q_.step, " attempt ", q_.attempt, " from group ", donor);
  heal_comm_ = PeerComm{};
  StatusOr<PeerComm> made = replica_.split(color, key);
  if (!made.ok()) {
    addCulprits(replica_.suspects());
    return made.status().withContext(what);
  }
  heal_comm_ = std::move(*made);  // dropped before replica_ (elastic_group.h)
  if (alone) return okStatus();   // it heals nobody (or is no donor)
  PeerComm* comm = &heal_comm_;
  const int self_in_heal = comm->comm->rank();
  int64_t count = *state.step;  // the donor's committed step count travels last
  Status moved = [&]() -> Status {
    HSDP_ASSIGN_OR_RETURN(size_t bytes,
                          control_.peerBroadcast(*comm->comm, state.buffers, 0, kHealPieceBytes));
    std::span<char> step{reinterpret_cast<char*>(&count), sizeof(count)};
    HSDP_RETURN_IF_ERROR(
        control_.peerBroadcast(*comm->comm, {&step, 1}, 0, sizeof(count)).status());
    // The donor sends its state to each group it heals (bytes per rank).
    out->heal_bytes += self_in_heal == 0 ? bytes * (members.size() - 1) : bytes;
    return okStatus();
  }();
  if (!moved.ok()) {
    std::vector<int> gone;  // the heal Comm's ranks, as quorum members
    for (int s : comm->suspects()) gone.push_back(members[s]);
    addCulprits(gone);
    return moved.withContext(what);
  }
  if (self_in_heal == 0) return okStatus();
  if (count != q_.step)
    return internalError("elastic: group ", donor, " sent the state of step ", count, " for step ",
                         q_.step);
  *state.step = count;
  HSDP_RETURN_IF_ERROR(state.installed());
  out->healed = true;
  out->healed_from = groupIndexOf(donor);
  return okStatus();
}

}  // namespace hsdp::engine
