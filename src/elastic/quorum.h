// Membership and step commit of elastic replica groups over etcd (docs/elastic.md is the
// protocol: the keys, the states, the commit rule). Each replica group runs one Quorum; etcd is
// the only thing they share. Transport-agnostic: nothing here moves tensors.
//
//   join(fingerprint)     the group's member key, on its lease (the heartbeat)
//   stepQuorum(step)      the members of this step's current attempt, the same for every group
//   vote(step, ok)        this group's result of the step's replica reduction
//   shouldCommit(step)    true when every member of the quorum voted ok; false (the step is then
//                         retried: the next stepQuorum(step) is a new attempt with a new quorum)
//                         when one voted fail or lost its lease without voting
//   leave()               revokes the lease: out of the next quorum at once
//
// A group whose lease expired (stopped, cut off) is out of every quorum formed after that; its
// votes are refused, and it learns so from vote() and shouldCommit() (FailedPrecondition naming
// it): it must join again and heal from a peer before it takes part (no split brain).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "elastic/etcd_client.h"
#include "hsdp/status.h"

namespace hsdp::elastic {

struct Member {
  std::string group;
  std::string address;      // the group's address for the replica transport (opaque here)
  int64_t ready_step = 0;   // the step it was ready to enter when it last wrote its key
  int64_t incarnation = 0;  // create_revision of its member key: new at each join
  // In a quorum: empty for a member that holds the step's state; for a member that must heal
  // first (it joined late, or missed a committed step), the group it copies the state from.
  std::string heal_from;
};

struct StepQuorum {
  int64_t step = 0;
  int64_t attempt = 0;
  std::vector<Member> members;  // sorted by group
  bool includes_self = false;
  bool contains(const std::string& group) const;
  std::string names() const;  // "g0, g1"
};

class Quorum {
 public:
  struct Options {
    std::string endpoint;            // etcd, "http://host:port"
    std::string job;                 // [A-Za-z0-9_.-]+: keys under /hsdp/<job>/
    std::string group;               // [A-Za-z0-9_.-]+, unique among the job's live groups
    std::string address;             // published in the member key
    int64_t lease_ttl_s = 0;         // <= 0: HSDP_ELASTIC_LEASE_S
    int64_t vote_timeout_ms = 0;     // <= 0: HSDP_ELASTIC_VOTE_TIMEOUT_MS
    int64_t request_timeout_ms = 0;  // <= 0: HSDP_ETCD_TIMEOUT_MS
    // True: a thread refreshes the lease every TTL/3. False: the caller calls heartbeat() at
    // least that often (from its training loop); when it stops, the group drops out.
    bool heartbeat_thread = true;
    // A restarted group (its predecessor of the same name is known dead, e.g. reaped by the
    // launcher): join() replaces a member key of its name that is still on the old lease,
    // instead of being refused as a duplicate.
    bool replace_stale = false;
  };

  static StatusOr<std::unique_ptr<Quorum>> create(Options options);
  // The rule for job and group names: [A-Za-z0-9_.-]+, at most 128 characters.
  static bool validName(const std::string& name);
  ~Quorum();  // leave(), errors ignored
  Quorum(const Quorum&) = delete;
  Quorum& operator=(const Quorum&) = delete;

  const std::string& group() const { return options_.group; }
  const std::string& prefix() const { return prefix_; }
  int64_t leaseTtlS() const { return ttl_s_; }

  // Joins the job as a group ready to enter `ready_step`. The first group to join sets the
  // job's fingerprint (model, mesh, precision: the caller's string); a group with another one is
  // refused (InvalidArgument naming both groups and fingerprints), as is a second live group of
  // the same name (FailedPrecondition).
  Status join(const std::string& fingerprint, int64_t ready_step = 0);
  // Waits until at least `count` groups are members (a launcher's start barrier).
  StatusOr<std::vector<Member>> waitForMembers(size_t count, int64_t timeout_ms);
  // The live members; `revision` (when given) the etcd revision they were read at.
  StatusOr<std::vector<Member>> members(int64_t* revision = nullptr);
  // The quorum of the step's current attempt: read, or created from the live members when no
  // group has created it yet. Members that hold the step's state are its core; other live
  // members join it as healing members, each named a donor from the core. Creating waits (up to
  // the vote timeout) until the core has at least `min_core` groups (a job's start: all of them).
  // Evicted incarnations are left out.
  StatusOr<StepQuorum> stepQuorum(int64_t step, size_t min_core = 1);
  // This group's vote on the attempt stepQuorum(step) returned. Refused (FailedPrecondition)
  // when the group is not in that quorum, its lease expired, or the attempt is decided already
  // (except a decided abort: then the vote is moot, OK, and shouldCommit returns false). A fail
  // vote may name the groups this group found gone: they are evicted (no quorum takes that
  // incarnation again; a group that is alive after all must join again and heal).
  Status vote(int64_t step, bool ok, const std::vector<std::string>& suspects = {});
  // The step the job is at: the first step no quorum has committed yet (0 for a new job).
  StatusOr<int64_t> nextStep();
  // Waits (up to the vote timeout) until the attempt is decided and returns its outcome
  // ("commit" or "abort: ..."): how a group left out of a quorum learns where the job went.
  StatusOr<std::string> waitDecided(int64_t step, int64_t attempt);
  // The members of the quorum that committed `step`; NotFound when it is not committed.
  StatusOr<StepQuorum> committedQuorum(int64_t step);
  // Waits for the attempt's decision (at most the vote timeout; then an error naming the groups
  // that did not vote) and returns it: true = commit.
  StatusOr<bool> shouldCommit(int64_t step);
  // Refreshes the lease once. NotFound when it expired: the group is out and must join again.
  Status heartbeat();
  // The heartbeat thread's last error (OK while it keeps the lease).
  Status heartbeatStatus();
  Status leave();
  // Whether this incarnation is out of the job: a fail vote evicted it, or its member key is
  // gone (its lease ended while it was stopped or cut off). It is in no quorum again: rejoin().
  StatusOr<bool> outOfJob();
  // What coordination cost this group per committed step: rank 0's wall time in etcd requests
  // (this client's, the heartbeat's apart) from one commit to the next, the watches' waits for
  // the other groups apart. Medians over the committed steps (the first, which waits for every
  // group to start, left out when there are others).
  struct StepCost {
    int64_t steps = 0;
    double request_ms = 0;  // median per step
    double requests = 0;    // mean requests per step
    double wait_ms = 0;     // median per step, waiting in watches
  };
  StepCost stepCost() const;
  // "elastic: quorum+vote <x> ms per step (median over <n> steps), <k> etcd requests per step,
  // <w> ms waiting for the other groups"; empty before the first commit. The destructor writes
  // it to the log (stderr, whatever HSDP_DEBUG says): the end of every elastic run shows it.
  std::string stepCostLine() const;
  // leave() then join() with the same fingerprint: a new incarnation, ready for `ready_step`
  // (how a group left out of a quorum comes back: it then heals if it missed a step).
  Status rejoin(int64_t ready_step);

 private:
  explicit Quorum(Options options) : options_(std::move(options)) {}
  std::string attemptKey(int64_t step, int64_t attempt) const;
  // Creates the attempt's quorum from `snap` (stepQuorum's one read: the attempt's quorum and
  // outcome, the members, the evicted, step - 1's commit); nullopt while its core is smaller
  // than min_core.
  StatusOr<std::optional<StepQuorum>> createQuorum(int64_t step, int64_t attempt, size_t min_core,
                                                   const TxnResult& snap);
  StatusOr<std::vector<Member>> parseMembers(const RangeResult& r) const;
  // The decision of the attempt from one snapshot, or "" when it is still open.
  StatusOr<std::string> decide(const StepQuorum& q, int64_t* revision, std::string* waiting);
  // The reads of that snapshot for attempt prefix `a`: outcome, votes, members.
  std::vector<Op> snapshotOps(const std::string& a) const;
  void beatLoop();
  void stopBeating();

  Options options_;
  std::string prefix_;  // "/hsdp/<job>/"
  int64_t ttl_s_ = 10;
  int64_t vote_timeout_ms_ = 60000;
  std::unique_ptr<EtcdClient> client_;  // the protocol's requests
  std::unique_ptr<EtcdClient> beat_;    // the heartbeat's, never behind a watch
  int64_t lease_ = 0;
  std::string fingerprint_;
  int64_t incarnation_ = 0;
  StepQuorum current_;  // the last stepQuorum()
  bool have_current_ = false;
  EtcdClient::Cost cost_at_commit_;           // client_'s at the last commit
  std::vector<EtcdClient::Cost> step_costs_;  // one per committed step
  std::optional<TxnResult> vote_snapshot_;    // decide()'s snapshot, read by the last vote
  int64_t retry_step_ = -1;  // after an abort: the step and attempt stepQuorum resumes at
  int64_t retry_attempt_ = 0;

  std::mutex beat_mu_;
  std::condition_variable beat_cv_;
  bool beat_stop_ = false;
  Status beat_status_;
  std::thread beat_thread_;
};

}  // namespace hsdp::elastic
