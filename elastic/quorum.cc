#include "elastic/quorum.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "hsdp/env.h"

namespace hsdp::elastic {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const env::IntParam kLeaseS{"HSDP_ELASTIC_LEASE_S", 10, 1, 3600,
                            "Lease (heartbeat) of an elastic replica group in etcd, seconds: a "
                            "group that stops refreshing it is out of the next quorum."};
const env::IntParam kVoteTimeoutMs{
    "HSDP_ELASTIC_VOTE_TIMEOUT_MS", 60000, 100, 3600000,
    "How long an elastic group waits for the other groups' commit votes of a step (a group "
    "that keeps its lease but does not vote), milliseconds."};

bool validName(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

StatusOr<json> parseValue(const KeyValue& kv) {
  json j = json::parse(kv.value, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return internalError("etcd key '", kv.key, "' holds '", kv.value.substr(0, 100),
                         "', not the JSON object hsdp writes there");
  return j;
}

std::string memberValue(const std::string& fingerprint, const std::string& address,
                        int64_t ready_step) {
  return json{{"fingerprint", fingerprint}, {"address", address}, {"ready_step", ready_step}}
      .dump();
}

std::string voteValue(bool ok, const std::vector<std::string>& suspects) {
  if (ok) return "ok";
  std::string v = "fail";
  for (size_t i = 0; i < suspects.size(); ++i) v += (i ? "," : ": ") + suspects[i];
  return v;
}

int64_t msLeft(Clock::time_point deadline) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
}

}  // namespace

bool StepQuorum::contains(const std::string& group) const {
  return std::any_of(members.begin(), members.end(),
                     [&](const Member& m) { return m.group == group; });
}

std::string StepQuorum::names() const {
  std::string out;
  for (const Member& m : members) out += (out.empty() ? "" : ", ") + m.group;
  return out;
}

StatusOr<std::unique_ptr<Quorum>> Quorum::create(Options options) {
  if (!validName(options.job)) return invalidArgument("elastic job name '", options.job, "'");
  if (!validName(options.group))
    return invalidArgument("elastic group name '", options.group, "' (want [A-Za-z0-9_.-]+)");
  std::unique_ptr<Quorum> q(new Quorum(options));
  q->prefix_ = "/hsdp/" + options.job + "/";
  q->ttl_s_ = options.lease_ttl_s;
  if (q->ttl_s_ <= 0) {
    HSDP_ASSIGN_OR_RETURN(q->ttl_s_, kLeaseS.value());
  }
  q->vote_timeout_ms_ = options.vote_timeout_ms;
  if (q->vote_timeout_ms_ <= 0) {
    HSDP_ASSIGN_OR_RETURN(q->vote_timeout_ms_, kVoteTimeoutMs.value());
  }
  EtcdClient::Options copt;
  copt.timeout_ms = options.request_timeout_ms;
  HSDP_ASSIGN_OR_RETURN(q->client_, EtcdClient::create(options.endpoint, copt));
  HSDP_ASSIGN_OR_RETURN(q->beat_, EtcdClient::create(options.endpoint, copt));
  return q;
}

Quorum::~Quorum() {
  Status s = leave();
  (void)s;
}

Status Quorum::join(const std::string& fingerprint, int64_t ready_step) {
  std::string who = strCat("group '", options_.group, "' of job '", options_.job, "'");
  if (lease_ != 0) return failedPrecondition(who, " has joined already (lease ", lease_, ")");
  // The job's fingerprint: set once by the first group, compared by every later one.
  std::string config_key = prefix_ + "config";
  json config = {{"fingerprint", fingerprint}, {"group", options_.group}};
  HSDP_ASSIGN_OR_RETURN(
      TxnResult c, client_->txn({Compare::absent(config_key)}, {Op::put(config_key, config.dump())},
                                {Op::get(config_key)}));
  if (!c.succeeded && !c.ranges.empty() && !c.ranges[0].kvs.empty()) {
    HSDP_ASSIGN_OR_RETURN(json have, parseValue(c.ranges[0].kvs[0]));
    std::string theirs = have.value("fingerprint", "");
    if (theirs != fingerprint) {
      return invalidArgument(who, " refused: its fingerprint '", fingerprint,
                             "' differs from the job's '", theirs, "' (set by group '",
                             have.value("group", "?"), "'): another model, mesh or precision");
    }
  }
  std::string key = prefix_ + "members/" + options_.group;
  if (options_.replace_stale) {
    // The predecessor is dead: its key (still on its old lease) goes, so that this join gets a
    // new incarnation. Only that key: one created meanwhile by someone else stays.
    HSDP_ASSIGN_OR_RETURN(auto old, client_->get(key));
    if (old.has_value()) {
      HSDP_ASSIGN_OR_RETURN(
          TxnResult d,
          client_->txn({Compare::createdAt(key, old->create_revision)}, {Op::del(key)}, {}));
      (void)d;
    }
  }
  HSDP_ASSIGN_OR_RETURN(int64_t lease, client_->leaseGrant(ttl_s_));
  auto t =
      client_->txn({Compare::absent(key)},
                   {Op::put(key, memberValue(fingerprint, options_.address, ready_step), lease)},
                   {Op::get(key)});
  if (!t.ok() || !t->succeeded) {
    Status s = client_->leaseRevoke(lease);
    (void)s;
    if (!t.ok()) return t.status();
    return failedPrecondition(who, " refused: a live group of that name is a member already");
  }
  lease_ = lease;
  incarnation_ = t->revision;
  fingerprint_ = fingerprint;
  have_current_ = false;
  {
    std::lock_guard<std::mutex> lock(beat_mu_);
    beat_stop_ = false;
    beat_status_ = okStatus();
  }
  if (options_.heartbeat_thread) beat_thread_ = std::thread([this] { beatLoop(); });
  return okStatus();
}

Status Quorum::heartbeat() {
  if (lease_ == 0) return failedPrecondition("group '", options_.group, "' has not joined");
  auto ttl = beat_->leaseKeepAlive(lease_);
  if (!ttl.ok()) {
    return Status(ttl.status().code(),
                  strCat("group '", options_.group, "' heartbeat: ", ttl.status().message()));
  }
  return okStatus();
}

Status Quorum::heartbeatStatus() {
  std::lock_guard<std::mutex> lock(beat_mu_);
  return beat_status_;
}

void Quorum::beatLoop() {
  auto period = std::chrono::milliseconds(std::max<int64_t>(ttl_s_ * 1000 / 3, 100));
  std::unique_lock<std::mutex> lock(beat_mu_);
  while (!beat_cv_.wait_for(lock, period, [this] { return beat_stop_; })) {
    lock.unlock();
    Status s = heartbeat();
    lock.lock();
    if (!s.ok()) beat_status_ = s;
    if (s.code() == StatusCode::kNotFound) return;  // the lease is gone: nothing left to keep
  }
}

void Quorum::stopBeating() {
  {
    std::lock_guard<std::mutex> lock(beat_mu_);
    beat_stop_ = true;
  }
  beat_cv_.notify_all();
  if (beat_thread_.joinable()) beat_thread_.join();
}

Status Quorum::leave() {
  stopBeating();
  if (lease_ == 0) return okStatus();
  int64_t lease = lease_;
  lease_ = 0;
  have_current_ = false;
  return beat_->leaseRevoke(lease);
}

StatusOr<bool> Quorum::evicted() {
  HSDP_ASSIGN_OR_RETURN(auto e, client_->get(prefix_ + "evicted/" + options_.group));
  return e.has_value() && std::strtoll(e->value.c_str(), nullptr, 10) == incarnation_;
}

Status Quorum::rejoin(int64_t ready_step) {
  if (lease_ == 0 && fingerprint_.empty())
    return failedPrecondition("group '", options_.group, "' rejoins without having joined");
  Status left = leave();  // an expired lease cannot be revoked: that is fine here
  (void)left;
  return join(fingerprint_, ready_step);
}

StatusOr<std::vector<Member>> Quorum::members() {
  HSDP_ASSIGN_OR_RETURN(RangeResult r, client_->getPrefix(prefix_ + "members/"));
  std::vector<Member> out;
  for (const KeyValue& kv : r.kvs) {
    HSDP_ASSIGN_OR_RETURN(json j, parseValue(kv));
    out.push_back({kv.key.substr(prefix_.size() + 8), j.value("address", ""),
                   j.value("ready_step", int64_t{0}), kv.create_revision, ""});
  }
  return out;
}

StatusOr<std::vector<Member>> Quorum::waitForMembers(size_t count, int64_t timeout_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    HSDP_ASSIGN_OR_RETURN(RangeResult r, client_->getPrefix(prefix_ + "members/"));
    if (r.kvs.size() >= count) return members();
    if (msLeft(deadline) <= 0) {
      return internalError("job '", options_.job, "': ", r.kvs.size(), " of ", count,
                           " groups joined within ", timeout_ms, " ms");
    }
    HSDP_ASSIGN_OR_RETURN(WatchResult w, client_->waitForChange(prefix_ + "members/",
                                                                r.revision + 1, msLeft(deadline)));
    (void)w;
  }
}

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
    HSDP_ASSIGN_OR_RETURN(TxnResult r,
                          client_->txn({}, {Op::get(a + "quorum"), Op::get(a + "outcome")}, {}));
    if (r.ranges.size() != 2) return internalError("etcd txn: ", r.ranges.size(), " ranges of 2");
    if (!r.ranges[1].kvs.empty() && r.ranges[1].kvs[0].value != "commit") {
      ++attempt;  // aborted: the step is retried in the next attempt
      continue;
    }
    StepQuorum q;
    if (!r.ranges[0].kvs.empty()) {
      HSDP_ASSIGN_OR_RETURN(q, parseQuorum(r.ranges[0].kvs[0], step, attempt, options_.group));
    } else {
      int64_t revision = 0;
      HSDP_ASSIGN_OR_RETURN(std::optional<StepQuorum> made,
                            createQuorum(step, attempt, min_core, &revision));
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
                                                         size_t min_core, int64_t* revision) {
  // The core: the live members that hold the step's state: those that declare it, and those
  // that were in the quorum that committed step - 1 under the same incarnation (they may not
  // have rewritten their key yet). Every other live member heals from a core member first.
  HSDP_ASSIGN_OR_RETURN(RangeResult r, client_->getPrefix(prefix_ + "members/"));
  *revision = r.revision;
  std::vector<Member> live;
  for (const KeyValue& kv : r.kvs) {
    HSDP_ASSIGN_OR_RETURN(json j, parseValue(kv));
    live.push_back({kv.key.substr(prefix_.size() + 8), j.value("address", ""),
                    j.value("ready_step", int64_t{0}), kv.create_revision, ""});
  }
  std::map<std::string, int64_t> committed_prev;  // group -> incarnation
  if (step > 0) {
    auto pq = committedQuorum(step - 1);
    if (pq.ok()) {
      for (const Member& m : pq->members) committed_prev[m.group] = m.incarnation;
    } else if (pq.status().code() != StatusCode::kNotFound) {
      return pq.status();
    }
  }
  // Incarnations a fail vote named gone (evicted/<group> = incarnation).
  std::map<std::string, int64_t> evicted;
  {
    HSDP_ASSIGN_OR_RETURN(RangeResult v, client_->getPrefix(prefix_ + "evicted/"));
    for (const KeyValue& kv : v.kvs)
      evicted[kv.key.substr(prefix_.size() + 8)] = std::strtoll(kv.value.c_str(), nullptr, 10);
  }
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
  std::vector<Op> puts = {Op::put(a + "vote/" + options_.group, voteValue(ok, suspects))};
  for (const std::string& g : suspects)
    for (const Member& m : q.members)
      if (m.group == g && g != options_.group)
        puts.push_back(Op::put(prefix_ + "evicted/" + g, std::to_string(m.incarnation)));
  HSDP_ASSIGN_OR_RETURN(TxnResult t, client_->txn({Compare::absent(a + "outcome"),
                                                   Compare::createdAt(member, incarnation_),
                                                   Compare::absent(a + "vote/" + options_.group)},
                                                  puts, {Op::get(a + "outcome"), Op::get(member)}));
  if (t.succeeded) return okStatus();
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

StatusOr<std::string> Quorum::decide(const StepQuorum& q, int64_t* revision, std::string* waiting) {
  std::string a = attemptKey(q.step, q.attempt);
  HSDP_ASSIGN_OR_RETURN(TxnResult s,
                        client_->txn({},
                                     {Op::get(a + "outcome"), Op::get(a + "vote/", true),
                                      Op::get(prefix_ + "members/", true)},
                                     {}));
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
    (void)w;
  }
  if (decision != "commit") {
    have_current_ = false;  // the next stepQuorum(step) forms a new attempt
    retry_step_ = step;
    retry_attempt_ = q.attempt + 1;
    return false;
  }
  // Ready for the next step (best effort, one request: the committed quorum also carries this
  // group into the next step's core).
  if (lease_ != 0) {
    const std::string key = prefix_ + "members/" + options_.group;
    auto put = client_->txn({Compare::createdAt(key, incarnation_)},
                            {Op::put(key, memberValue(fingerprint_, options_.address, step + 1),
                                     lease_)},
                            {});
    (void)put;
  }
  return true;
}

}  // namespace hsdp::elastic
