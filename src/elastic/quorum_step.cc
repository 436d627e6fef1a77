// The step protocol of the quorum (docs/elastic.md, "The protocol"): each step's quorum, the
// vote, the commit rule, and what a (re)starting group reads. Membership (join, the lease,
// leave) is quorum.cc's.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "elastic/quorum.h"
#include "elastic/quorum_detail.h"

namespace hsdp::elastic {
using namespace quorum_detail;
namespace {

std::string voteValue(bool ok, const std::vector<std::string>& suspects) {
  if (ok) return "ok";
  std::string v = "fail";
  for (size_t i = 0; i < suspects.size(); ++i) v += (i ? "," : ": ") + suspects[i];
  return v;
}

}  // namespace

std::string Quorum::attemptKey(int64_t step, int64_t attempt) const {
  return strCat(prefix_, "step/", step, "/attempt/", attempt, "/");
}

namespace {
StatusOr<StepQuorum> parseQuorum(const KeyValue& kv, int64_t step, int64_t attempt,
                                 const std::string& self) {
  HSDP_ASSIGN_OR_RETURN(json j, parseValue(kv));
  StepQuorum q;
  q.step = step;
  q.attempt = attempt;
  for (const json& m : j.value("members", json::array())) {
    q.members.push_back({m.value("group", ""), m.value("address", ""),
                         m.value("ready_step", int64_t{0}), m.value("incarnation", int64_t{0}),
                         m.value("heal_from", "")});
  }
  q.includes_self = q.contains(self);
  return q;
}
}  // namespace

StatusOr<StepQuorum> Quorum::stepQuorum(int64_t step, size_t min_core) {
  if (step < 0) return invalidArgument("elastic step ", step);
  int64_t attempt = (have_current_ && current_.step == step) ? current_.attempt : 0;
  if (retry_step_ == step) attempt = std::max(attempt, retry_attempt_);
  auto deadline = Clock::now() + std::chrono::milliseconds(vote_timeout_ms_);
  while (true) {
    std::string a = attemptKey(step, attempt);
    // One read for all a creator needs too (one revision): a group that finds the quorum made
    // reads nothing more, and one that makes it writes once.
    HSDP_ASSIGN_OR_RETURN(
        TxnResult r,
        client_->txn({},
                     {Op::get(a + "quorum"), Op::get(a + "outcome"),
                      Op::get(prefix_ + "members/", true), Op::get(prefix_ + "evicted/", true),
                      Op::get(strCat(prefix_, "step/", step - 1, "/committed"))},
                     {}));
    if (r.ranges.size() != 5) return internalError("etcd txn: ", r.ranges.size(), " ranges of 5");
    if (!r.ranges[1].kvs.empty() && r.ranges[1].kvs[0].value != "commit") {
      ++attempt;  // aborted: the step is retried in the next attempt
      continue;
    }
    StepQuorum q;
    if (!r.ranges[0].kvs.empty()) {
      HSDP_ASSIGN_OR_RETURN(q, parseQuorum(r.ranges[0].kvs[0], step, attempt, options_.group));
    } else {
      const int64_t revision = r.revision;
      HSDP_ASSIGN_OR_RETURN(std::optional<StepQuorum> made,
                            createQuorum(step, attempt, min_core, r));
      if (!made.has_value()) {  // too few groups hold the step's state yet: wait for more
        if (msLeft(deadline) <= 0) {
          HSDP_ASSIGN_OR_RETURN(std::vector<Member> live, members());
          std::string names;
          for (const Member& m : live)
            names += strCat(names.empty() ? "" : ", ", m.group, " (ready for ", m.ready_step, ")");
          return failedPrecondition("job '", options_.job, "': fewer than ", min_core,
                                    " groups ready for step ", step, " within ", vote_timeout_ms_,
                                    " ms; members: ", names.empty() ? "none" : names);
        }
        HSDP_ASSIGN_OR_RETURN(WatchResult w,
                              client_->waitForChange(prefix_, revision + 1, msLeft(deadline)));
        (void)w;
        continue;
      }
      q = std::move(*made);
    }
    // Ours only under this incarnation (a predecessor of the same name is not us).
    q.includes_self = std::any_of(q.members.begin(), q.members.end(), [&](const Member& m) {
      return m.group == options_.group && m.incarnation == incarnation_;
    });
    current_ = q;
    have_current_ = true;
    return q;
  }
}

StatusOr<std::optional<StepQuorum>> Quorum::createQuorum(int64_t step, int64_t attempt,
                                                         size_t min_core, const TxnResult& snap) {
  // The core: the live members that hold the step's state: those that declare it, and those
  // that were in the quorum that committed step - 1 under the same incarnation (they may not
  // have rewritten their key yet). Every other live member heals from a core member first.
  HSDP_ASSIGN_OR_RETURN(std::vector<Member> live, parseMembers(snap.ranges[2]));
  std::map<std::string, int64_t> committed_prev;  // group -> incarnation
  if (step > 0 && !snap.ranges[4].kvs.empty()) {
    HSDP_ASSIGN_OR_RETURN(json cj, parseValue(snap.ranges[4].kvs[0]));
    const int64_t prev_attempt = cj.value("attempt", int64_t{0});
    // The quorum this group committed step - 1 in is that attempt's: no read. Else read it.
    if (have_current_ && current_.step == step - 1 && current_.attempt == prev_attempt) {
      for (const Member& m : current_.members) committed_prev[m.group] = m.incarnation;
    } else {
      HSDP_ASSIGN_OR_RETURN(StepQuorum pq, committedQuorum(step - 1));
      for (const Member& m : pq.members) committed_prev[m.group] = m.incarnation;
    }
  }
  // Incarnations a fail vote named gone (evicted/<group> = incarnation).
  std::map<std::string, int64_t> evicted;
  for (const KeyValue& kv : snap.ranges[3].kvs)
    evicted[kv.key.substr(prefix_.size() + 8)] = std::strtoll(kv.value.c_str(), nullptr, 10);
  std::vector<Member> core, healing;
  auto split = [&](bool drop_evicted) {
    core.clear();
    healing.clear();
    for (const Member& m : live) {
      auto ev = evicted.find(m.group);
      if (drop_evicted && ev != evicted.end() && ev->second == m.incarnation) continue;
      auto it = committed_prev.find(m.group);
      bool carried = it != committed_prev.end() && it->second == m.incarnation;
      (m.ready_step == step || carried ? core : healing).push_back(m);
    }
  };
  split(true);
  if (core.empty() && !evicted.empty()) split(false);  // nobody else holds the state: keep them
  if (core.size() < std::max<size_t>(min_core, 1)) {
    if (core.empty() && !healing.empty() && step > 0) {
      return failedPrecondition("job '", options_.job, "': no live group holds the state of step ",
                                step, " (", healing.size(),
                                " members must heal, and every group they could heal from is "
                                "gone): restart the job from its last checkpoint");
    }
    return std::optional<StepQuorum>();
  }
  json list = json::array();
  size_t h = 0;
  for (const Member& m : live) {
    bool in_core =
        std::any_of(core.begin(), core.end(), [&](const Member& c) { return c.group == m.group; });
    bool heals = std::any_of(healing.begin(), healing.end(),
                             [&](const Member& c) { return c.group == m.group; });
    if (!in_core && !heals) continue;
    json e = {{"group", m.group},
              {"address", m.address},
              {"ready_step", in_core ? step : m.ready_step},
              {"incarnation", m.incarnation}};
    if (heals) e["heal_from"] = core[h++ % core.size()].group;
    list.push_back(e);
  }
  std::string key = attemptKey(step, attempt) + "quorum";
  json value = {{"members", list}, {"created_by", options_.group}};
  HSDP_ASSIGN_OR_RETURN(TxnResult t, client_->txn({Compare::absent(key)},
                                                  {Op::put(key, value.dump())}, {Op::get(key)}));
  if (t.succeeded) {
    KeyValue kv;
    kv.key = key;
    kv.value = value.dump();
    HSDP_ASSIGN_OR_RETURN(StepQuorum q, parseQuorum(kv, step, attempt, options_.group));
    return std::optional<StepQuorum>(std::move(q));
  }
  if (t.ranges.empty() || t.ranges[0].kvs.empty())
    return internalError("etcd: '", key, "' neither created nor read");
  HSDP_ASSIGN_OR_RETURN(StepQuorum q,
                        parseQuorum(t.ranges[0].kvs[0], step, attempt, options_.group));
  return std::optional<StepQuorum>(std::move(q));
}

StatusOr<StepQuorum> Quorum::committedQuorum(int64_t step) {
  HSDP_ASSIGN_OR_RETURN(auto c, client_->get(strCat(prefix_, "step/", step, "/committed")));
  if (!c.has_value()) return notFound("job '", options_.job, "': step ", step, " is not committed");
  HSDP_ASSIGN_OR_RETURN(json cj, parseValue(*c));
  int64_t attempt = cj.value("attempt", int64_t{0});
  std::string qkey = attemptKey(step, attempt) + "quorum";
  HSDP_ASSIGN_OR_RETURN(auto prev, client_->get(qkey));
  if (!prev.has_value())
    return internalError("etcd: step ", step, " committed without '", qkey, "'");
  return parseQuorum(*prev, step, attempt, options_.group);
}

StatusOr<int64_t> Quorum::nextStep() {
  HSDP_ASSIGN_OR_RETURN(auto c, client_->get(prefix_ + "next_step"));
  if (!c.has_value()) return int64_t{0};
  char* end = nullptr;
  long long v = std::strtoll(c->value.c_str(), &end, 10);
  if (c->value.empty() || *end != '\0' || v < 0)
    return internalError("etcd key '", prefix_, "next_step' holds '", c->value, "'");
  return int64_t{v};
}

StatusOr<std::string> Quorum::waitDecided(int64_t step, int64_t attempt) {
  auto deadline = Clock::now() + std::chrono::milliseconds(vote_timeout_ms_);
  std::string key = attemptKey(step, attempt) + "outcome";
  while (true) {
    HSDP_ASSIGN_OR_RETURN(RangeResult r, client_->getPrefix(key));
    if (!r.kvs.empty()) return r.kvs[0].value;
    if (msLeft(deadline) <= 0)
      return internalError("group '", options_.group, "': step ", step, " attempt ", attempt,
                           " undecided after ", vote_timeout_ms_, " ms");
    HSDP_ASSIGN_OR_RETURN(WatchResult w, client_->waitForChange(attemptKey(step, attempt),
                                                                r.revision + 1, msLeft(deadline)));
    (void)w;
  }
}

Status Quorum::vote(int64_t step, bool ok, const std::vector<std::string>& suspects) {
  if (!have_current_ || current_.step != step)
    return failedPrecondition("group '", options_.group, "' votes on step ", step,
                              " without its quorum (call stepQuorum first)");
  const StepQuorum& q = current_;
  std::string where = strCat("group '", options_.group, "' on step ", step, " attempt ", q.attempt);
  auto self = std::find_if(q.members.begin(), q.members.end(),
                           [&](const Member& m) { return m.group == options_.group; });
  if (self == q.members.end() || self->incarnation != incarnation_) {
    return failedPrecondition(where, ": not in the quorum (", q.names(),
                              "): it must join again and heal before it takes part");
  }
  std::string a = attemptKey(step, q.attempt);
  std::string member = prefix_ + "members/" + options_.group;
  vote_snapshot_.reset();
  std::vector<Op> puts = {Op::put(a + "vote/" + options_.group, voteValue(ok, suspects))};
  for (const std::string& g : suspects)
    for (const Member& m : q.members)
      if (m.group == g && g != options_.group)
        puts.push_back(Op::put(prefix_ + "evicted/" + g, std::to_string(m.incarnation)));
  for (Op op : snapshotOps(a)) puts.push_back(std::move(op));
  HSDP_ASSIGN_OR_RETURN(TxnResult t, client_->txn({Compare::absent(a + "outcome"),
                                                   Compare::createdAt(member, incarnation_),
                                                   Compare::absent(a + "vote/" + options_.group)},
                                                  puts, {Op::get(a + "outcome"), Op::get(member)}));
  if (t.succeeded) {
    // The snapshot decide() reads, read in the vote's own transaction (one round trip fewer).
    vote_snapshot_ = std::move(t);
    vote_snapshot_->ranges.erase(vote_snapshot_->ranges.begin(), vote_snapshot_->ranges.end() - 3);
    return okStatus();
  }
  if (t.ranges.size() == 2 &&
      (t.ranges[1].kvs.empty() || t.ranges[1].kvs[0].create_revision != incarnation_))
    return failedPrecondition(where,
                              ": vote refused, its lease expired: out of the quorum; it "
                              "must join again and heal");
  if (t.ranges.size() == 2 && !t.ranges[0].kvs.empty()) {
    // Another member's fail vote (or a lost lease) aborted the attempt before this vote came:
    // the vote is moot, not an error; shouldCommit() reports the abort to this group too. A
    // commit cannot precede a live member's vote (it needs every member's ok).
    const std::string& outcome = t.ranges[0].kvs[0].value;
    if (outcome.rfind("abort", 0) == 0) return okStatus();
    return failedPrecondition(where, ": vote refused, the attempt is decided: ", outcome);
  }
  return failedPrecondition(where, ": voted already");
}

std::vector<Op> Quorum::snapshotOps(const std::string& a) const {
  return {Op::get(a + "outcome"), Op::get(a + "vote/", true), Op::get(prefix_ + "members/", true)};
}

StatusOr<std::string> Quorum::decide(const StepQuorum& q, int64_t* revision, std::string* waiting) {
  std::string a = attemptKey(q.step, q.attempt);
  TxnResult s;
  if (vote_snapshot_.has_value()) {  // read by this group's vote
    s = std::move(*vote_snapshot_);
    vote_snapshot_.reset();
  } else {
    HSDP_ASSIGN_OR_RETURN(s, client_->txn({}, snapshotOps(a), {}));
  }
  *revision = s.revision;
  if (s.ranges.size() != 3) return internalError("etcd txn: ", s.ranges.size(), " ranges of 3");
  if (!s.ranges[0].kvs.empty()) return s.ranges[0].kvs[0].value;
  std::map<std::string, std::string> votes;
  for (const KeyValue& kv : s.ranges[1].kvs) votes[kv.key.substr(a.size() + 5)] = kv.value;
  std::map<std::string, int64_t> live;
  for (const KeyValue& kv : s.ranges[2].kvs)
    live[kv.key.substr(prefix_.size() + 8)] = kv.create_revision;
  std::string decision;
  waiting->clear();
  bool all_ok = true;
  for (const Member& m : q.members) {
    auto v = votes.find(m.group);
    if (v != votes.end()) {
      if (v->second != "ok") decision = "abort: group '" + m.group + "' voted fail";
      continue;
    }
    all_ok = false;
    auto l = live.find(m.group);
    if (l == live.end() || l->second != m.incarnation) {
      // It can never vote now (a vote needs its member key of this incarnation).
      if (decision.empty()) decision = "abort: group '" + m.group + "' lost its lease unvoted";
    } else {
      *waiting += (waiting->empty() ? "" : ", ") + m.group;
    }
  }
  if (decision.empty() && all_ok) decision = "commit";
  if (decision.empty()) return std::string();
  std::vector<Op> ops = {Op::put(a + "outcome", decision)};
  if (decision == "commit") {
    ops.push_back(Op::put(strCat(prefix_, "step/", q.step, "/committed"),
                          json{{"attempt", q.attempt}}.dump()));
    ops.push_back(Op::put(prefix_ + "next_step", std::to_string(q.step + 1)));
  }
  HSDP_ASSIGN_OR_RETURN(
      TxnResult w, client_->txn({Compare::absent(a + "outcome")}, ops, {Op::get(a + "outcome")}));
  if (w.succeeded) return decision;
  if (w.ranges.empty() || w.ranges[0].kvs.empty())
    return internalError("etcd: '", a, "outcome' neither written nor read");
  return w.ranges[0].kvs[0].value;
}

StatusOr<bool> Quorum::shouldCommit(int64_t step) {
  if (!have_current_ || current_.step != step)
    return failedPrecondition("group '", options_.group, "' asks to commit step ", step,
                              " without its quorum (call stepQuorum first)");
  StepQuorum q = current_;
  if (!q.includes_self)
    return failedPrecondition("group '", options_.group, "' on step ", step, " attempt ", q.attempt,
                              ": not in the quorum (", q.names(),
                              "): it must not commit; it must join again and heal");
  auto deadline = Clock::now() + std::chrono::milliseconds(vote_timeout_ms_);
  std::string decision;
  while (true) {
    int64_t revision = 0;
    std::string waiting;
    HSDP_ASSIGN_OR_RETURN(decision, decide(q, &revision, &waiting));
    if (!decision.empty()) break;
    if (msLeft(deadline) <= 0) {
      return internalError("group '", options_.group, "' on step ", step, " attempt ", q.attempt,
                           ": no commit vote from ", waiting, " within ", vote_timeout_ms_,
                           " ms (they keep their leases)");
    }
    HSDP_ASSIGN_OR_RETURN(WatchResult w,
                          client_->waitForChange(prefix_, revision + 1, msLeft(deadline)));
    // The outcome among the changes: decided, no read needed.
    const std::string outcome = attemptKey(q.step, q.attempt) + "outcome";
    for (const WatchEvent& e : w.events)
      if (e.type == WatchEvent::Type::kPut && e.kv.key == outcome) decision = e.kv.value;
    if (!decision.empty()) break;
  }
  if (decision != "commit") {
    have_current_ = false;  // the next stepQuorum(step) forms a new attempt
    retry_step_ = step;
    retry_attempt_ = q.attempt + 1;
    return false;
  }
  // Its member key is not rewritten: the committed quorum carries the group into the next
  // step's core (createQuorum), one etcd write per group and step fewer.
  const EtcdClient::Cost now = client_->cost();
  step_costs_.push_back(
      {now.requests - cost_at_commit_.requests, now.request_s - cost_at_commit_.request_s,
       now.watches - cost_at_commit_.watches, now.watch_s - cost_at_commit_.watch_s});
  cost_at_commit_ = now;
  return true;
}

Quorum::StepCost Quorum::stepCost() const {
  StepCost out;
  std::vector<EtcdClient::Cost> c(step_costs_.begin() + (step_costs_.size() > 1 ? 1 : 0),
                                  step_costs_.end());
  if (c.empty()) return out;
  auto median = [&](auto field) {
    std::vector<double> v;
    for (const EtcdClient::Cost& e : c) v.push_back(field(e));
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  out.steps = static_cast<int64_t>(c.size());
  out.request_ms = 1e3 * median([](const EtcdClient::Cost& e) { return e.request_s; });
  out.wait_ms = 1e3 * median([](const EtcdClient::Cost& e) { return e.watch_s; });
  double n = 0;
  for (const EtcdClient::Cost& e : c) n += static_cast<double>(e.requests + e.watches);
  out.requests = n / static_cast<double>(c.size());
  return out;
}

std::string Quorum::stepCostLine() const {
  const StepCost c = stepCost();
  if (c.steps == 0) return "";
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "elastic: quorum+vote %.2f ms per step (median over %lld steps), %.1f etcd "
                "requests per step, %.2f ms waiting for the other groups",
                c.request_ms, static_cast<long long>(c.steps), c.requests, c.wait_ms);
  return buf;
}

}  // namespace hsdp::elastic
