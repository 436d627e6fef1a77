// Internal to the engine: this process's part of an elastic replica group (docs/elastic.md;
// elastic_group.cc, and elastic_worker.cc: the averages and the commit). One group is one MPI
// job; its rank 0 speaks for it in etcd (elastic/quorum.h: membership, each step's quorum, the
// commit vote) and tells the other ranks over the group's control plane
// (UnitCollectives' control collectives); every rank i runs the replica level with rank i of the
// other groups on a peer-transport Comm (UCX built from the addresses the groups publish;
// hsdp/transport_registry.h), built from each step's quorum: the gradient averages on the
// quorum's Comm, a heal on a Comm of the donor and the groups it heals (elastic_heal.cc), both
// issued through UnitCollectives.
//
//   begin(step)      the step's quorum (waiting out attempts this group is not in), its Comm,
//                    and the heal: a member that does not hold the step's state receives it from
//                    its donor's same-position ranks (a broadcast), before the step's forward
//   commit(grads)    every gradient shard averaged over the groups present, the vote, the
//                    decision: true = apply the step; false = the step is repeated (abort)
//
// Every call is collective over the group and returns the same outcome on every rank (errors of
// rank 0's etcd requests included).
//
// The group's lifecycle (one table in elastic_group.cc; every change goes through transition()):
//   Joined --begin: a quorum with this group--> InQuorum   (the job's first step no longer waits
//                                                          for every group)
//   InQuorum --begin: the replica Comm is up, the heal done--> InStep
//   InStep --commit: the quorum committed--> Committed
//   InStep --commit: the quorum aborted--> Decided
//   InStep --begin again, without commit: the step is given up--> Decided
//   Committed --applied: the engine applied the step's average--> Decided
//   Decided --begin: the next step's quorum--> InQuorum
// (Committed is a state of its own because gradNorm() commits before step() applies: begin()
// from Committed is refused, and step() after gradNorm() does not vote again.)
// A begin whose replica Comm or heal fails stays InQuorum for its next attempt; one that fails
// outright leaves the state where it was.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "elastic/member_watch.h"
#include "elastic/quorum.h"
#include "engine/group_alarm.h"
#include "engine/unit_collectives.h"
#include "hsdp/config.h"
#include "hsdp/sharded_model.h"
#include "hsdp/transport.h"
#include "hsdp/transport_registry.h"

namespace hsdp::engine {

enum class GroupState : uint8_t { kJoined, kInQuorum, kInStep, kCommitted, kDecided };
const char* stateName(GroupState s);

// The position of `group` in the quorum's members (-1 when absent), and a group name's index
// ("g12" -> 12).
int memberIndex(const elastic::StepQuorum& q, const std::string& group);
int groupIndexOf(const std::string& name);

// The state a heal moves: every buffer of this rank (same order and sizes on every group's
// same-position rank), and what to do once they are written.
struct HealState {
  std::vector<std::span<char>> buffers;
  int64_t* step = nullptr;            // the committed step count travels too
  std::function<Status()> installed;  // refresh what derives from the buffers
};

class ElasticGroup {
 public:
  // Takes this rank's peer-transport address, publishes the group (rank 0 joins the job with
  // `fingerprint`), all ranks agreeing on the outcome.
  static StatusOr<std::unique_ptr<ElasticGroup>> create(const ElasticPolicy& policy,
                                                        UnitCollectives& control,
                                                        const std::string& fingerprint);
  ~ElasticGroup();

  StatusOr<StepStart> begin(int64_t local_step, const HealState& state);
  // After begin(): starts averaging one gradient shard over the quorum's groups on the replica
  // worker (a thread of this group: the all-reduce overlaps the rest of backward), in call
  // order, which is the same on every group (reduceGrad's).
  [[nodiscard]] Status startAverage(std::span<float> grad);
  // Waits for every average started, then the vote and the quorum's decision (true: apply).
  // True: the group is Committed until applied(); false: Decided (aborted).
  StatusOr<bool> commit();
  bool begun() const { return state_ == GroupState::kInStep; }
  // Committed and not yet applied (gradNorm() took the decision; step() applies it).
  bool committedPending() const { return state_ == GroupState::kCommitted; }
  // The engine applied the committed step: Committed -> Decided.
  [[nodiscard]] Status applied();
  // The last step this group committed and the groups of its quorum (what a save names).
  struct Committed {
    int64_t step = -1;
    std::vector<int> present;
  };
  const Committed& committed() const { return committed_; }
  const std::string& job() const { return *policy_.job; }
  int groupIndex() const { return *policy_.group_index; }
  // The group indexes of the quorum that committed each of steps [from, steps).
  StatusOr<std::vector<std::vector<int>>> membership(int64_t steps, int64_t from = 0);
  // Before the first begin(): the group holds the state of `step` (a checkpoint was loaded); rank
  // 0 rejoins with that ready_step, so the job's first quorum has it in its core. Collective.
  [[nodiscard]] Status readyAt(int64_t step);
  bool started() const { return state_ != GroupState::kJoined; }

 private:
  explicit ElasticGroup(UnitCollectives& control) : control_(control) {}
  void workLoop();
  // Rank 0's status (and the string it filled) on every rank.
  Status fromRoot(const Status& root_status, std::string* text);
  // Every rank's ok flag and suspects summed; rank 0 votes. Returns the quorum's decision.
  StatusOr<bool> voteAndDecide(const Status& local);
  // The one place the group changes state: a move the table does not list is a
  // FailedPrecondition naming the group and both states ("; <hint>" after it when given).
  [[nodiscard]] Status transition(GroupState to, std::string_view verb, std::string_view hint = {});

  UnitCollectives& control_;  // the control plane: agreement, broadcast, sums
  ElasticPolicy policy_;
  std::string name_;        // "g<index>"
  int64_t timeout_ms_ = 0;  // HSDP_REPLICA_TIMEOUT_MS: the replica level's deadline
  std::unique_ptr<elastic::Quorum> quorum_;  // rank 0 only
  // The replica level's peer transport (HSDP_REPLICA_TRANSPORT), this process's address in it
  // (published in the group's member key), and the step's Comm (rebuilt when the quorum changes).
  std::string peer_transport_;
  PeerAddress peer_address_;
  PeerComm replica_;
  // The last heal's Comm (the donor and the groups it healed: a split of replica_, over its
  // endpoints), kept as long as replica_ and dropped first, when no collective is in flight.
  PeerComm heal_comm_;
  void dropComms() {
    heal_comm_ = PeerComm{};
    replica_ = PeerComm{};
  }
  elastic::StepQuorum q_;      // the step's quorum, as rank 0 read it
  int self_ = -1;              // this group's index in q_.members
  std::vector<int> culprits_;  // members this rank found gone in its last failed call
  void addCulprits(const std::vector<int>& members);  // those not named yet
  GroupState state_ = GroupState::kJoined;
  int64_t local_step_ = 0;
  Committed committed_;

  // The heal on the peer transport (elastic_heal.cc): when some member of the step heals, a
  // split of replica_ (collective over every member: the donor and the groups it heals form a
  // part, every other member one of its own), and the state broadcast from the donor through
  // UnitCollectives. Fills `out`'s heal fields; on failure the members it found failed go into
  // culprits_.
  [[nodiscard]] Status heal(const HealState& state, StepStart* out);
  // The id of the step's replica Comm: equal on every member, unlike any earlier one of these
  // processes ((step, attempt) only grow; ids recycle after 512 steps); id + 1 is its split's
  // (the heal's).
  static uint64_t peerCommId(const elastic::StepQuorum& q) {
    return static_cast<uint64_t>(q.step) * 64 + 2 * static_cast<uint64_t>(q.attempt % 32);
  }

  // Averages `g` over the quorum's groups on replica_; ends at once when a sibling rank raised
  // the alarm for the same attempt.
  [[nodiscard]] Status average(std::span<float> g);
  // The step's attempt as the alarm names it (never 0).
  uint64_t attemptTag() const {
    return ((static_cast<uint64_t>(q_.step) + 1) << 16) |
           (static_cast<uint64_t>(q_.attempt) & 0xffff);
  }
  // The group's alarm (group_alarm.h): raised by the worker when an average fails; what it
  // received, for the worker: the attempt's tag (0: none) and the sender's reason.
  std::unique_ptr<GroupAlarm> alarm_;
  std::atomic<uint64_t> alarm_tag_{0};
  std::mutex alarm_mu_;  // guards alarm_reason_
  std::string alarm_reason_;
  // What the alarm's handler does with an alarm, and the watch with what it saw (any thread).
  void noteAlarm(uint64_t tag, const std::string& why);
  std::vector<int> suspects() const;

  // The coordinator's abort watch (elastic_watch.cc; rank 0). A thread on elastic::MemberWatch;
  // while the step's averages may run (armed by begin(), disarmed by commit() once they are done),
  // a member of the step's quorum whose incarnation ended in etcd (its lease ran out, it left, a
  // restart replaced it) raises the alarm for the attempt, on this rank and on the group's others.
  void watchLoop();
  void armWatch();
  void disarmWatch();
  // Under watch_mu_: the armed attempt's tag and the reason when a member of its quorum ended
  // (then disarmed: one alarm per attempt), else 0.
  uint64_t endedLocked(std::string* why);
  std::unique_ptr<elastic::MemberWatch> watch_;
  std::mutex watch_mu_;  // guards what follows
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  uint64_t watch_tag_ = 0;                      // the armed attempt (0: none)
  std::vector<elastic::Member> watch_members_;  // its quorum's other members
  std::deque<elastic::MemberEnd> ended_;        // the latest ends seen (bounded)
  std::thread watcher_;
  // The group indexes of the step's quorum (q_), in its order.
  std::vector<int> presentGroups() const;

  // The replica worker: the averages of a step, one after the other, on replica_ (which the main
  // thread changes only while the worker is idle: in begin() and after commit()'s wait).
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::span<float>> queue_;
  bool busy_ = false, stop_ = false;
  Status work_status_;              // the first failure of the step's averages
  std::vector<int> work_culprits_;  // and the members it named
  std::thread worker_;              // declared last: joined first
};

}  // namespace hsdp::engine
