// Membership of the quorum (docs/elastic.md): create, join (the fingerprint, the member key on
// its lease), the heartbeat, leave and rejoin, the members. The step protocol is quorum_step.cc.
#include "elastic/quorum.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "elastic/quorum_detail.h"
#include "hsdp/env.h"
#include "hsdp/log.h"

namespace hsdp::elastic {
using namespace quorum_detail;
namespace {

const env::IntParam kLeaseS{"HSDP_ELASTIC_LEASE_S", 10, 1, 3600,
                            "Lease (heartbeat) of an elastic replica group in etcd, seconds: a "
                            "group that stops refreshing it is out of the next quorum."};
const env::IntParam kVoteTimeoutMs{
    "HSDP_ELASTIC_VOTE_TIMEOUT_MS", 60000, 100, 3600000,
    "How long an elastic group waits for the other groups' commit votes of a step (a group "
    "that keeps its lease but does not vote), milliseconds."};

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

bool Quorum::validName(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
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
  // The heartbeat's bound per member: at most a third of the lease, so that a keepalive sent to a
  // member cut off from the others fails over to the next one while the lease still runs. With
  // the requests' bound (HSDP_ETCD_TIMEOUT_MS, 5 s) a group whose heartbeat went to the cut
  // member lost its 2 s lease though two members were up (elastic.etcd3.node-cut).
  copt.timeout_ms = std::min(q->client_->timeoutMs(), std::max<int64_t>(q->ttl_s_ * 1000 / 3, 100));
  HSDP_ASSIGN_OR_RETURN(q->beat_, EtcdClient::create(options.endpoint, copt));
  return q;
}

Quorum::~Quorum() {
  // The run's coordination cost, where users see it (the log's own line, at any HSDP_DEBUG).
  if (std::string line = stepCostLine(); !line.empty())
    log::write(log::Level::kInfo, log::kShard, line);
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

StatusOr<bool> Quorum::outOfJob() {
  // One read of both keys: the eviction record and this group's member key.
  HSDP_ASSIGN_OR_RETURN(TxnResult t, client_->txn({},
                                                  {Op::get(prefix_ + "evicted/" + options_.group),
                                                   Op::get(prefix_ + "members/" + options_.group)},
                                                  {}));
  if (t.ranges.size() != 2) return internalError("etcd txn: ", t.ranges.size(), " ranges of 2");
  const std::vector<KeyValue>& ev = t.ranges[0].kvs;
  const std::vector<KeyValue>& me = t.ranges[1].kvs;
  if (!ev.empty() && std::strtoll(ev[0].value.c_str(), nullptr, 10) == incarnation_) return true;
  // Its lease ended while it was stopped or cut off (nobody named it: no eviction record).
  return me.empty() || me[0].create_revision != incarnation_;
}

Status Quorum::rejoin(int64_t ready_step) {
  if (lease_ == 0 && fingerprint_.empty())
    return failedPrecondition("group '", options_.group, "' rejoins without having joined");
  Status left = leave();  // an expired lease cannot be revoked: that is fine here
  (void)left;
  return join(fingerprint_, ready_step);
}

StatusOr<std::vector<Member>> Quorum::members(int64_t* revision) {
  HSDP_ASSIGN_OR_RETURN(RangeResult r, client_->getPrefix(prefix_ + "members/"));
  if (revision != nullptr) *revision = r.revision;
  return parseMembers(r);
}

StatusOr<std::vector<Member>> Quorum::parseMembers(const RangeResult& r) const {
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

}  // namespace hsdp::elastic
