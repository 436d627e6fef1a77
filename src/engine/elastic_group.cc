#include "engine/elastic_group.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>  // std::this_thread::yield

#include "core/socket.h"
#include "engine/transition.h"
#include "hsdp/env.h"
#include "hsdp/log.h"
#include "hsdp/parse.h"

namespace hsdp::engine {
namespace {

using Clock = std::chrono::steady_clock;

const env::StringParam kReplicaTransport{
    "HSDP_REPLICA_TRANSPORT", env::StringParam::Kind::kEnum, "ucx",
    "Elastic groups: the peer transport of the replica level (gradient averages and heals; "
    "hsdp/transport_registry.h): ucx, the only one built (docs/elastic.md). The TCP ring's "
    "values (ring, auto) are gone and refused by name."};
const env::IntParam kReplicaTimeoutMs{
    "HSDP_REPLICA_TIMEOUT_MS", 10000, 10, 3600000,
    "Elastic groups: the replica level's deadline without progress, milliseconds (building the "
    "step's Comm, an average, a heal's piece): a peer that stops is named after it."};

std::vector<std::string> splitList(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    size_t e = s.find(sep, b);
    if (e == std::string::npos) e = s.size();
    out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// The quorum as rank 0 tells it to the group's other ranks: one line per member.
std::string encode(const elastic::StepQuorum& q) {
  std::ostringstream o;
  o << q.step << ' ' << q.attempt << ' ' << q.members.size() << '\n';
  for (const elastic::Member& m : q.members)
    o << m.group << ' ' << m.incarnation << ' ' << m.address << ' '
      << (m.heal_from.empty() ? "-" : m.heal_from) << '\n';
  return o.str();
}

StatusOr<elastic::StepQuorum> decode(const std::string& text, const std::string& self) {
  std::istringstream in(text);
  elastic::StepQuorum q;
  size_t n = 0;
  if (!(in >> q.step >> q.attempt >> n)) return internalError("elastic: bad quorum message");
  for (size_t i = 0; i < n; ++i) {
    elastic::Member m;
    if (!(in >> m.group >> m.incarnation >> m.address >> m.heal_from))
      return internalError("elastic: bad quorum message");
    if (m.heal_from == "-") m.heal_from.clear();
    q.members.push_back(std::move(m));
  }
  q.includes_self = q.contains(self);
  return q;
}

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

using G = GroupState;
// Every move of the group's lifecycle (elastic_group.h draws it), as (from, to).
constexpr std::pair<G, G> kGroupMoves[] = {
    {G::kJoined, G::kInQuorum},    // begin: a quorum with this group
    {G::kInQuorum, G::kInStep},    // begin: the replica Comm is up, the heal done
    {G::kInStep, G::kCommitted},   // commit: the quorum committed
    {G::kInStep, G::kDecided},     // commit aborted, or begin again: the step given up
    {G::kCommitted, G::kDecided},  // applied: the engine applied the step
    {G::kDecided, G::kInQuorum},   // begin: the next step's quorum
};

}  // namespace

int memberIndex(const elastic::StepQuorum& q, const std::string& group) {
  for (size_t i = 0; i < q.members.size(); ++i)
    if (q.members[i].group == group) return static_cast<int>(i);
  return -1;
}

int groupIndexOf(const std::string& name) {  // "g12" -> 12
  return name.size() > 1 ? std::atoi(name.c_str() + 1) : -1;
}

void ElasticGroup::addCulprits(const std::vector<int>& members) {
  for (int c : members)
    if (std::find(culprits_.begin(), culprits_.end(), c) == culprits_.end()) culprits_.push_back(c);
}

const char* stateName(GroupState s) {
  constexpr const char* kNames[] = {"Joined", "InQuorum", "InStep", "Committed",
                                    "Decided"};  // GroupState's
  return kNames[static_cast<int>(s)];
}

Status ElasticGroup::transition(GroupState to, std::string_view verb, std::string_view hint) {
  return moveAlong(kGroupMoves, strCat("elastic group ", name_), state_, to, verb, hint);
}

StatusOr<std::unique_ptr<ElasticGroup>> ElasticGroup::create(const ElasticPolicy& policy,
                                                             UnitCollectives& control,
                                                             const std::string& fingerprint) {
  std::unique_ptr<ElasticGroup> g(new ElasticGroup(control));
  g->policy_ = policy;
  g->name_ = strCat("g", *policy.group_index);
  // Every rank: its address in the peer transport of the replica level, and the host it
  // publishes beside it (the configured one or the local address of the route to etcd; the
  // group's alarm listens there).
  std::string host = *policy.host;
  Status local = [&]() -> Status {
    if (host.empty()) {
      HSDP_ASSIGN_OR_RETURN(host, net::localAddressToward(*policy.endpoint));
    }
    HSDP_ASSIGN_OR_RETURN(g->timeout_ms_, kReplicaTimeoutMs.value());
    g->peer_transport_ = kReplicaTransport.get();
    if (g->peer_transport_ == "ring" || g->peer_transport_ == "auto")
      return invalidArgument("HSDP_REPLICA_TRANSPORT='", g->peer_transport_,
                             "' no longer exists: the TCP ring was removed; the replica level "
                             "runs on a peer transport (ucx) (docs/elastic.md)");
    if (!hasPeerTransport(g->peer_transport_))
      return invalidArgument("HSDP_REPLICA_TRANSPORT='", g->peer_transport_,
                             "' is not a peer transport of this hsdp (",
                             hasPeerTransport("ucx") ? "ucx"
                                                     : "none: elastic mode needs hsdp built with "
                                                       "UCX, HSDP_WITH_UCX",
                             ")");
    HSDP_ASSIGN_OR_RETURN(g->peer_address_, peerTransportAddress(g->peer_transport_));
    return okStatus();
  }();
  HSDP_RETURN_IF_ERROR(control.agree(local));
  // The alarm between this group's ranks (group_alarm.h): what a sibling sends is kept for the
  // replica worker, which aborts the attempt's average when it is the one named.
  HSDP_ASSIGN_OR_RETURN(
      g->alarm_,
      GroupAlarm::create(control, host, [p = g.get()](uint64_t tag, const std::string& why) {
        p->noteAlarm(tag, why);
      }));
  // The group's member address: every rank's entry, in rank order (lengths first, then the
  // entries padded to the longest).
  // One rank's entry: "host/" and its peer-transport address in hex.
  const std::vector<uint8_t>& peer = g->peer_address_.bytes;
  const std::string entry = strCat(host, "/", hexBytes(peer.data(), peer.size()));
  int64_t len = static_cast<int64_t>(entry.size());
  std::vector<int64_t> lens(control.controlSize());
  HSDP_RETURN_IF_ERROR(control.controlAllGather(&len, lens.data(), 1, DType::kInt64));
  const size_t width = static_cast<size_t>(*std::max_element(lens.begin(), lens.end()));
  std::vector<char> mine(width, 0), all(width * control.controlSize());
  std::memcpy(mine.data(), entry.data(), entry.size());
  HSDP_RETURN_IF_ERROR(control.controlAllGather(mine.data(), all.data(), width, DType::kUInt8));
  std::string addresses;
  for (int r = 0; r < control.controlSize(); ++r) {
    if (r > 0) addresses += ',';
    addresses += std::string(&all[r * width], static_cast<size_t>(lens[r]));
  }
  // Rank 0 speaks for the group in etcd.
  Status joined = okStatus();
  if (control.controlRank() == 0) {
    joined = [&]() -> Status {
      elastic::Quorum::Options o;
      o.endpoint = *policy.endpoint;
      o.job = *policy.job;
      o.group = g->name_;
      o.address = addresses;
      o.replace_stale = *policy.restarts > 0;
      HSDP_ASSIGN_OR_RETURN(g->quorum_, elastic::Quorum::create(o));
      return g->quorum_->join(fingerprint, 0);
    }();
  }
  HSDP_RETURN_IF_ERROR(control.agree(joined));
  if (control.controlRank() == 0) {
    // Best effort: without it a gone member is found at the transport's deadline, as before.
    auto watch = elastic::MemberWatch::create(*policy.endpoint, *policy.job);
    if (watch.ok()) {
      g->watch_ = std::move(*watch);
      g->watcher_ = std::thread([p = g.get()] { p->watchLoop(); });
    } else {
      HSDP_WARN(kShard, "elastic: no abort watch: ", watch.status().message());
    }
  }
  g->worker_ = std::thread([p = g.get()] { p->workLoop(); });
  HSDP_INFO(kShard, "elastic: group ", g->name_, " joined job '", *policy.job, "' at ",
            *policy.endpoint, " (replica level on ", g->peer_transport_, ", rank 0 at ", host, ")");
  return g;
}

Status ElasticGroup::fromRoot(const Status& root_status, std::string* text) {
  int64_t head[2] = {0, 0};
  std::string payload;
  if (control_.controlRank() == 0) {
    head[0] = static_cast<int64_t>(root_status.code());
    payload = root_status.ok() ? *text : root_status.message();
    head[1] = static_cast<int64_t>(payload.size());
  }
  HSDP_RETURN_IF_ERROR(control_.controlBroadcast(head, 2, DType::kInt64, 0));
  payload.resize(static_cast<size_t>(head[1]));
  if (head[1] > 0)
    HSDP_RETURN_IF_ERROR(
        control_.controlBroadcast(payload.data(), payload.size(), DType::kUInt8, 0));
  if (head[0] != 0) return Status(static_cast<StatusCode>(head[0]), payload);
  *text = std::move(payload);
  return okStatus();
}

StatusOr<bool> ElasticGroup::voteAndDecide(const Status& local) {
  // Every rank's failure and the members its transport named, summed over the group.
  std::vector<int64_t> flags(1 + q_.members.size(), 0);
  if (!local.ok()) {
    flags[0] = 1;
    for (int c : culprits_) flags[1 + c] = 1;
  }
  HSDP_RETURN_IF_ERROR(control_.controlSum(flags.data(), flags.size()));
  std::string text;
  Status root = okStatus();
  if (control_.controlRank() == 0) {
    root = [&]() -> Status {
      std::vector<std::string> suspects;
      for (size_t i = 0; i < q_.members.size(); ++i)
        if (flags[1 + i] > 0 && static_cast<int>(i) != self_)
          suspects.push_back(q_.members[i].group);
      // Refused as out of the quorum (its lease expired while it was stopped or cut off, or it
      // was evicted): it never commits this step; it comes back as a new incarnation and heals.
      Status voted = quorum_->vote(q_.step, flags[0] == 0, suspects);
      StatusOr<bool> commit = voted.ok() ? quorum_->shouldCommit(q_.step) : StatusOr<bool>(voted);
      if (!commit.ok() && commit.status().code() == StatusCode::kFailedPrecondition) {
        HSDP_WARN(kShard, "elastic: ", commit.status().message());
        text = "abort";
        return quorum_->rejoin(local_step_);
      }
      HSDP_RETURN_IF_ERROR(commit.status());
      text = *commit ? "commit" : "abort";
      return okStatus();
    }();
  }
  HSDP_RETURN_IF_ERROR(fromRoot(root, &text));
  if (!local.ok())
    HSDP_WARN(kShard, "elastic: step ", q_.step, " attempt ", q_.attempt, ": ", local.message());
  return text == "commit";
}

StatusOr<StepStart> ElasticGroup::begin(int64_t local_step, const HealState& state) {
  // A step begun and not committed is given up.
  if (state_ == G::kInStep) {
    disarmWatch();
    HSDP_RETURN_IF_ERROR(transition(G::kDecided, "beginStep"));
  }
  local_step_ = local_step;
  // The replica Comm of the step this group just committed, kept while the next quorum has the
  // same members at the same addresses and nobody heals (every member then decides alike: the
  // commit needed every member's average to succeed).
  PeerComm kept = std::move(replica_);
  const elastic::StepQuorum last = q_;
  bool continuing = kept.comm && committed_.step == local_step - 1;
  while (true) {
    // Rank 0: the step's quorum; "" when this group is not in it (after the attempt is decided
    // without it, the next round finds where the job went).
    std::string text;
    Status root = okStatus();
    if (control_.controlRank() == 0) {
      root = [&]() -> Status {
        // A group that committed the last step knows where the job is; one that (re)starts or
        // was left out asks.
        int64_t next = local_step;
        if (!continuing) {
          HSDP_ASSIGN_OR_RETURN(next, quorum_->nextStep());
        }
        const int64_t s = std::max(local_step, next);
        // The job's first step (nothing committed yet; a job resumed from a checkpoint starts
        // past step 0) waits for every group.
        const size_t min_core =
            (state_ == G::kJoined && next == 0) ? static_cast<size_t>(*policy_.groups) : 1;
        HSDP_ASSIGN_OR_RETURN(q_, quorum_->stepQuorum(s, min_core));
        if (q_.includes_self) {
          text = encode(q_);
          return okStatus();
        }
        HSDP_INFO(kShard, "elastic: ", name_, " is not in step ", s, " attempt ", q_.attempt,
                  "'s quorum (", q_.names(), "); waiting for its outcome");
        HSDP_ASSIGN_OR_RETURN(std::string outcome, quorum_->waitDecided(s, q_.attempt));
        (void)outcome;
        // Evicted (a peer found it gone), or its lease ended while it was stopped (its member
        // key is gone, so no quorum can take it): come back as a new incarnation. Either way,
        // having missed a committed step, it heals in the next quorum.
        HSDP_ASSIGN_OR_RETURN(bool out, quorum_->outOfJob());
        if (out) return quorum_->rejoin(local_step);
        return okStatus();
      }();
    }
    HSDP_RETURN_IF_ERROR(fromRoot(root, &text));
    if (text.empty()) {  // left out: next round asks where the job went, and builds a Comm
      continuing = false;
      continue;
    }
    HSDP_ASSIGN_OR_RETURN(q_, decode(text, name_));
    if (state_ != G::kInQuorum) HSDP_RETURN_IF_ERROR(transition(G::kInQuorum, "beginStep"));
    self_ = memberIndex(q_, name_);
    const elastic::Member& me = q_.members[self_];
    StepStart out;
    culprits_.clear();
    auto same = [&] {
      if (!continuing || q_.attempt != 0 || q_.members.size() != last.members.size()) return false;
      for (size_t k = 0; k < q_.members.size(); ++k)
        if (q_.members[k].group != last.members[k].group ||
            q_.members[k].address != last.members[k].address || !q_.members[k].heal_from.empty())
          return false;
      return true;
    };
    auto t0 = Clock::now();
    Status local = [&]() -> Status {
      if (me.heal_from.empty() && local_step != q_.step)
        return internalError("elastic: group ", name_, " holds step ", local_step,
                             " but the quorum counts it among the groups at step ", q_.step);
      PeerMembers peers;
      peers.self = self_;
      for (const elastic::Member& m : q_.members) {
        // From etcd: checked as any list (an empty element is an error naming the group).
        HSDP_ASSIGN_OR_RETURN(std::vector<std::string> ranks,
                              parseList(m.address, strCat("address of elastic group ", m.group)));
        if (static_cast<int>(ranks.size()) != control_.controlSize())
          return invalidArgument("elastic group ", m.group, " has ", ranks.size(),
                                 " ranks; this group has ", control_.controlSize());
        std::string entry = ranks[control_.controlRank()];
        const size_t slash = entry.find('/');
        const std::string what = strCat(peer_transport_, " address of elastic group ", m.group,
                                        " rank ", control_.controlRank());
        if (slash == std::string::npos)
          return invalidArgument(what, " is missing (published: '", entry,
                                 "'; every group must run the same HSDP_REPLICA_TRANSPORT)");
        HSDP_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes,
                              parseHexBytes(entry.substr(slash + 1), what));
        peers.addresses.push_back(std::move(bytes));
        entry.resize(slash);
        peers.names.push_back(strCat("group ", m.group, " (", entry, ")"));
      }
      if (same()) {
        replica_ = std::move(kept);
      } else {
        kept = PeerComm{};
        heal_comm_ = PeerComm{};  // the last heal's, with the Comm it was kept beside
        peers.id = peerCommId(q_);
        peers.timeout_ms = timeout_ms_;
        HSDP_ASSIGN_OR_RETURN(replica_, createPeerTransport(peer_transport_, peers));
      }
      t0 = Clock::now();  // the heal's own time, from here
      return heal(state, &out);
    }();
    if (!local.ok()) addCulprits(suspects());  // besides what the setup or the heal named
    int64_t failed = local.ok() ? 0 : 1;
    HSDP_RETURN_IF_ERROR(control_.controlSum(&failed, 1));
    if (failed == 0) {
      out.heal_seconds = out.heal_bytes ? secondsSince(t0) : 0.0;
      out.step = q_.step;
      out.attempt = q_.attempt;
      out.group = *policy_.group_index;
      out.present = presentGroups();
      const bool keep = *policy_.data == ElasticData::kKeepSlice;
      out.slot = keep ? out.group : self_;
      out.slots = keep ? *policy_.groups : static_cast<int>(q_.members.size());
      if (out.healed && control_.controlRank() == 0)
        HSDP_INFO(kShard, "elastic: ", name_, " healed to step ", q_.step, " from ", me.heal_from,
                  ": ", out.heal_bytes, " bytes on rank 0 in ", out.heal_seconds, " s");
      HSDP_RETURN_IF_ERROR(transition(G::kInStep, "beginStep"));
      armWatch();
      return out;
    }
    // The replica Comm or a heal failed on some rank: vote fail (naming who is gone), then the next
    // attempt.
    HSDP_ASSIGN_OR_RETURN(bool committed, voteAndDecide(local));
    if (committed)
      return internalError("elastic: step ", q_.step, " committed although group ", name_,
                           " voted fail");
    dropComms();
  }
}

std::vector<int> ElasticGroup::presentGroups() const {
  std::vector<int> out;
  for (const elastic::Member& m : q_.members) out.push_back(groupIndexOf(m.group));
  return out;
}

Status ElasticGroup::readyAt(int64_t step) {
  if (state_ != G::kJoined)
    return failedPrecondition("elastic group ", name_, ": ready at step ", step,
                              " after its first step (state ", stateName(state_), ")");
  Status root = okStatus();
  if (control_.controlRank() == 0) root = quorum_->rejoin(step);
  HSDP_RETURN_IF_ERROR(control_.agree(root));
  local_step_ = step;
  return okStatus();
}

StatusOr<std::vector<std::vector<int>>> ElasticGroup::membership(int64_t steps, int64_t from) {
  std::string text;
  Status root = okStatus();
  if (control_.controlRank() == 0) {
    root = [&]() -> Status {
      for (int64_t s = from; s < steps; ++s) {
        HSDP_ASSIGN_OR_RETURN(elastic::StepQuorum q, quorum_->committedQuorum(s));
        for (size_t i = 0; i < q.members.size(); ++i)
          text += strCat(i ? "," : "", groupIndexOf(q.members[i].group));
        text += ";";
      }
      return okStatus();
    }();
  }
  HSDP_RETURN_IF_ERROR(fromRoot(root, &text));
  std::vector<std::vector<int>> out;
  for (const std::string& step : splitList(text, ';')) {
    if (static_cast<int64_t>(out.size()) == steps - from) break;
    out.emplace_back();
    for (const std::string& g : splitList(step, ',')) out.back().push_back(std::atoi(g.c_str()));
  }
  return out;
}

}  // namespace hsdp::engine
