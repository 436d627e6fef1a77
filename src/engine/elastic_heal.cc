// ElasticGroup's heal on the peer transport (docs/elastic.md, "The heal"): the groups that do
// not hold the step's state receive it from their donor over a Comm of the donor and the groups
// it heals, built from the addresses of the step's quorum, through UnitCollectives' broadcast.
#include <algorithm>
#include <cstdlib>

#include "engine/elastic_group.h"

namespace hsdp::engine {
namespace {

// The heal moves the state in broadcasts of at most this many bytes: the transport's deadline
// without progress then bounds one piece, and a donor of several groups serves them in turn.
constexpr size_t kHealPieceBytes = size_t{4} << 20;

int memberOf(const elastic::StepQuorum& q, const std::string& group) {
  for (size_t i = 0; i < q.members.size(); ++i)
    if (q.members[i].group == group) return static_cast<int>(i);
  return -1;
}

}  // namespace

Status ElasticGroup::heal(const PeerMembers& all, const HealState& state, StepStart* out) {
  const elastic::Member& me = q_.members[self_];
  const std::string& donor = me.heal_from.empty() ? name_ : me.heal_from;
  // The heal's members: the donor (its root), then the groups it heals, in quorum order.
  std::vector<int> members{memberOf(q_, donor)};
  if (members[0] < 0)
    return internalError("elastic: group ", name_, " heals from ", donor,
                         ", which is not in the quorum of step ", q_.step);
  for (size_t k = 0; k < q_.members.size(); ++k)
    if (q_.members[k].heal_from == donor) members.push_back(static_cast<int>(k));
  if (members.size() == 1) return okStatus();  // it heals nobody (or is no donor)
  PeerMembers p;
  p.id = peerCommId(q_, /*heal=*/true);
  p.timeout_ms = timeout_ms_;
  for (int k : members) {
    if (k == self_) p.self = static_cast<int>(p.addresses.size());
    p.addresses.push_back(all.addresses[k]);
    p.names.push_back(all.names[k]);
  }
  const std::string what =
      strCat("the heal of step ", q_.step, " attempt ", q_.attempt, " from group ", donor);
  heal_comm_ = PeerComm{};
  StatusOr<PeerComm> made = createPeerTransport(peer_transport_, p);
  if (!made.ok()) return made.status().withContext(what);
  heal_comm_ = std::move(*made);  // kept beside replica_ (elastic_group.h)
  PeerComm* comm = &heal_comm_;
  int64_t count = *state.step;  // the donor's committed step count travels last
  Status moved = [&]() -> Status {
    HSDP_ASSIGN_OR_RETURN(size_t bytes,
                          control_.peerBroadcast(*comm->comm, state.buffers, 0, kHealPieceBytes));
    std::span<char> step{reinterpret_cast<char*>(&count), sizeof(count)};
    HSDP_RETURN_IF_ERROR(
        control_.peerBroadcast(*comm->comm, {&step, 1}, 0, sizeof(count)).status());
    // The donor sends its state to each group it heals (bytes per rank).
    out->heal_bytes += p.self == 0 ? bytes * (members.size() - 1) : bytes;
    return okStatus();
  }();
  if (!moved.ok()) {
    for (int s : comm->suspects())
      if (std::find(culprits_.begin(), culprits_.end(), members[s]) == culprits_.end())
        culprits_.push_back(members[s]);
    return moved.withContext(what);
  }
  if (p.self == 0) return okStatus();
  if (count != q_.step)
    return internalError("elastic: group ", donor, " sent the state of step ", count, " for step ",
                         q_.step);
  *state.step = count;
  HSDP_RETURN_IF_ERROR(state.installed());
  out->healed = true;
  out->healed_from = std::atoi(donor.c_str() + 1);  // "g<index>"
  return okStatus();
}

}  // namespace hsdp::engine
