// The elastic quorum: three replica groups as threads, each with its own Quorum (its own etcd
// clients and lease), on a private etcd. The truth is etcd's own record (the keys read back
// with a plain client) and the protocol's rules: one quorum per attempt, commit only on every
// member's ok, a group that lost its lease never commits.
#include "elastic/quorum.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "elastic/member_watch.h"
#include "tests/elastic/elastic_test_util.h"

namespace hsdp::elastic {
namespace {

using testing::secondsSince;
using Clock = std::chrono::steady_clock;
constexpr int64_t kTtl = 2;
const char* kPrint = "model=gpt-tiny;mesh=2x3;precision=bf16";

class QuorumTest : public testing::WithEtcd {
 protected:
  std::unique_ptr<Quorum> make(const std::string& group, bool beat_thread = true,
                               int64_t vote_timeout_ms = 20000) {
    Quorum::Options o;
    o.endpoint = etcd_->endpoint();
    o.job = "job1";
    o.group = group;
    o.address = group + ".host:4000";
    o.lease_ttl_s = kTtl;
    o.vote_timeout_ms = vote_timeout_ms;
    o.request_timeout_ms = 1000;
    o.heartbeat_thread = beat_thread;
    auto q = Quorum::create(o);
    EXPECT_TRUE(q.ok()) << q.status().toString();
    return q.ok() ? std::move(*q) : nullptr;
  }
  std::vector<std::unique_ptr<Quorum>> joinThree() {
    std::vector<std::unique_ptr<Quorum>> qs;
    for (int g = 0; g < 3; ++g) {
      qs.push_back(make("g" + std::to_string(g)));
      Status s = qs.back()->join(kPrint);
      EXPECT_TRUE(s.ok()) << s.toString();
    }
    return qs;
  }
  std::string raw(const std::string& key) {
    auto c = EtcdClient::create(etcd_->endpoint());
    auto kv = (*c)->get(key);
    return kv.ok() && kv->has_value() ? (*kv)->value : std::string("<absent>");
  }
};

// Runs f on every group at once (one thread each) and returns the results in group order.
template <typename F>
auto onAll(const std::vector<Quorum*>& qs, F f) {
  std::vector<std::future<decltype(f(*qs[0]))>> fs;
  for (Quorum* q : qs) fs.push_back(std::async(std::launch::async, [q, &f] { return f(*q); }));
  std::vector<decltype(f(*qs[0]))> out;
  for (auto& fu : fs) out.push_back(fu.get());
  return out;
}

std::vector<Quorum*> ptrs(const std::vector<std::unique_ptr<Quorum>>& qs) {
  std::vector<Quorum*> out;
  for (const auto& q : qs) out.push_back(q.get());
  return out;
}

// One step on `qs`: every group reads the quorum, votes `ok[i]`, asks for the decision.
std::vector<StatusOr<bool>> runStep(const std::vector<Quorum*>& qs, int64_t step,
                                    std::vector<bool> ok = {}) {
  if (ok.empty()) ok.assign(qs.size(), true);
  std::vector<std::pair<Quorum*, bool>> pairs;
  for (size_t i = 0; i < qs.size(); ++i) pairs.push_back({qs[i], ok[i]});
  std::vector<std::future<StatusOr<bool>>> fs;
  for (auto [q, v] : pairs) {
    fs.push_back(std::async(std::launch::async, [q = q, v = v, step]() -> StatusOr<bool> {
      HSDP_ASSIGN_OR_RETURN(StepQuorum sq, q->stepQuorum(step));
      (void)sq;
      HSDP_RETURN_IF_ERROR(q->vote(step, v));
      return q->shouldCommit(step);
    }));
  }
  std::vector<StatusOr<bool>> out;
  for (auto& f : fs) out.push_back(f.get());
  return out;
}

TEST_F(QuorumTest, ThreeGroupsJoinAndEveryGroupReadsTheSameQuorum) {
  auto qs = joinThree();
  auto members = qs[0]->waitForMembers(3, 5000);
  ASSERT_TRUE(members.ok()) << members.status().toString();
  ASSERT_EQ(members->size(), 3u);
  EXPECT_EQ((*members)[1].address, "g1.host:4000");
  auto quorums = onAll(ptrs(qs), [](Quorum& q) { return q.stepQuorum(0); });
  for (size_t g = 0; g < 3; ++g) {
    ASSERT_TRUE(quorums[g].ok()) << quorums[g].status().toString();
    EXPECT_EQ(quorums[g]->names(), "g0, g1, g2");
    EXPECT_EQ(quorums[g]->attempt, 0);
    EXPECT_TRUE(quorums[g]->includes_self);
    for (size_t m = 0; m < 3; ++m)
      EXPECT_EQ(quorums[g]->members[m].incarnation, quorums[0]->members[m].incarnation);
  }
  // etcd holds one quorum record for the attempt, naming the three.
  std::string record = raw("/hsdp/job1/step/0/attempt/0/quorum");
  for (const char* g : {"\"g0\"", "\"g1\"", "\"g2\""})
    EXPECT_NE(record.find(g), std::string::npos) << record;
  auto votes = onAll(ptrs(qs), [](Quorum& q) { return q.vote(0, true); });
  for (auto& v : votes) EXPECT_TRUE(v.ok()) << v.toString();
  auto commits = onAll(ptrs(qs), [](Quorum& q) { return q.shouldCommit(0); });
  for (auto& c : commits) {
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_TRUE(*c);
  }
  EXPECT_EQ(raw("/hsdp/job1/step/0/attempt/0/outcome"), "commit");
  // The committed groups carry into step 1 (before or after they rewrite their keys).
  auto step1 = runStep(ptrs(qs), 1);
  for (auto& c : step1) EXPECT_TRUE(c.ok() && *c) << c.status().toString();
  EXPECT_NE(raw("/hsdp/job1/step/1/attempt/0/quorum").find("\"g2\""), std::string::npos);
}

TEST_F(QuorumTest, AStoppedGroupIsDroppedWithinItsLeaseAndNeverCommits) {
  std::vector<std::unique_ptr<Quorum>> qs;
  qs.push_back(make("g0"));
  qs.push_back(make("g1"));
  qs.push_back(make("g2", /*beat_thread=*/false));  // its heartbeat: this test's loop below
  for (auto& q : qs) ASSERT_TRUE(q->join(kPrint).ok());
  std::atomic<bool> beating{true};
  std::thread beat([&] {
    while (beating) {
      Status s = qs[2]->heartbeat();
      EXPECT_TRUE(s.ok()) << s.toString();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  for (auto& c : runStep(ptrs(qs), 0)) ASSERT_TRUE(c.ok() && *c) << c.status().toString();
  // Step 1: all three read the quorum, then g2 stops (as under SIGSTOP: no heartbeat, no vote).
  for (auto& q : onAll(ptrs(qs), [](Quorum& q) { return q.stepQuorum(1); }))
    ASSERT_EQ(q->members.size(), 3u);
  beating = false;
  beat.join();
  auto stopped = Clock::now();
  std::vector<Quorum*> survivors = {qs[0].get(), qs[1].get()};
  auto first = onAll(survivors, [](Quorum& q) -> StatusOr<bool> {
    HSDP_RETURN_IF_ERROR(q.vote(1, true));
    return q.shouldCommit(1);
  });
  for (auto& c : first) {
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_FALSE(*c);  // g2 lost its lease without voting: attempt 0 aborts for everyone
  }
  EXPECT_NE(raw("/hsdp/job1/step/1/attempt/0/outcome").find("g2"), std::string::npos);
  auto retry = runStep(survivors, 1);
  double took = secondsSince(stopped);
  for (auto& c : retry) ASSERT_TRUE(c.ok() && *c) << c.status().toString();
  EXPECT_LT(took, kTtl + 2.0) << "from the stop to the survivors' commit";
  auto q1 = qs[0]->stepQuorum(1);
  ASSERT_TRUE(q1.ok());
  EXPECT_EQ(q1->names(), "g0, g1");
  EXPECT_EQ(q1->attempt, 1);

  // g2 continues: its vote on the attempt it read is refused, it does not commit, and the
  // quorum it reads next does not include it.
  Status late = qs[2]->vote(1, true);
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late.toString();
  EXPECT_NE(late.message().find("g2"), std::string::npos);
  auto decision = qs[2]->shouldCommit(1);
  ASSERT_TRUE(decision.ok()) << decision.status().toString();
  EXPECT_FALSE(*decision);
  auto now = qs[2]->stepQuorum(1);
  ASSERT_TRUE(now.ok());
  EXPECT_FALSE(now->includes_self);
  // Nobody evicted it, but its member key is gone: it is out of the job (it must rejoin), and
  // the survivors are not.
  auto out = qs[2]->outOfJob();
  ASSERT_TRUE(out.ok()) << out.status().toString();
  EXPECT_TRUE(*out);
  EXPECT_EQ(raw("/hsdp/job1/evicted/g2"), "<absent>");
  auto in = qs[0]->outOfJob();
  ASSERT_TRUE(in.ok() && !*in) << in.status().toString();
  auto commit = qs[2]->shouldCommit(1);
  EXPECT_EQ(commit.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(commit.status().message().find("not in the quorum (g0, g1)"), std::string::npos)
      << commit.status().toString();
  EXPECT_EQ(qs[2]->heartbeat().code(), StatusCode::kNotFound);
  EXPECT_EQ(raw("/hsdp/job1/step/1/attempt/1/vote/g2"), "<absent>");

  // It joins again (after a heal, not built yet) ready for step 2: the next quorum has three.
  ASSERT_TRUE(qs[2]->leave().ok());
  ASSERT_TRUE(qs[2]->join(kPrint, /*ready_step=*/2).ok());
  std::thread beat2([&] {
    for (int i = 0; i < 10; ++i) {
      Status s = qs[2]->heartbeat();
      (void)s;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  });
  auto step2 = runStep(ptrs(qs), 2);
  beat2.join();
  for (auto& c : step2) EXPECT_TRUE(c.ok() && *c) << c.status().toString();
  EXPECT_NE(raw("/hsdp/job1/step/2/attempt/0/quorum").find("\"g2\""), std::string::npos);
}

TEST_F(QuorumTest, AFailedVoteAbortsForEveryoneAndTheRetryCommits) {
  auto qs = joinThree();
  ASSERT_TRUE(qs[0]->waitForMembers(3, 5000).ok());
  auto first = runStep(ptrs(qs), 0, {true, false, true});
  for (auto& c : first) {
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_FALSE(*c);
  }
  EXPECT_EQ(raw("/hsdp/job1/step/0/attempt/0/outcome"), "abort: group 'g1' voted fail");
  auto retry = runStep(ptrs(qs), 0);
  for (auto& c : retry) EXPECT_TRUE(c.ok() && *c) << c.status().toString();
  EXPECT_EQ(raw("/hsdp/job1/step/0/attempt/1/outcome"), "commit");
  EXPECT_EQ(raw("/hsdp/job1/step/0/committed"), "{\"attempt\":1}");
}

TEST_F(QuorumTest, AnotherFingerprintOrADuplicateGroupIsRefusedByName) {
  auto g0 = make("g0");
  ASSERT_TRUE(g0->join(kPrint).ok());
  auto g1 = make("g1");
  Status s = g1->join("model=mlp;mesh=2x3;precision=bf16");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const char* part : {"group 'g1'", "model=mlp", kPrint, "group 'g0'"})
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();
  EXPECT_EQ(raw("/hsdp/job1/members/g1"), "<absent>");
  auto twin = make("g0");
  Status d = twin->join(kPrint);
  EXPECT_EQ(d.code(), StatusCode::kFailedPrecondition) << d.toString();
  EXPECT_NE(d.message().find("group 'g0'"), std::string::npos);
}

TEST_F(QuorumTest, AGroupThatKeepsItsLeaseButDoesNotVoteIsNamedAtTheTimeout) {
  auto g0 = make("g0", true, /*vote_timeout_ms=*/1000);
  auto g1 = make("g1");
  ASSERT_TRUE(g0->join(kPrint).ok());
  ASSERT_TRUE(g1->join(kPrint).ok());
  ASSERT_TRUE(g0->stepQuorum(0).ok());
  ASSERT_TRUE(g0->vote(0, true).ok());
  auto t0 = Clock::now();
  auto c = g0->shouldCommit(0);
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no commit vote from g1"), std::string::npos)
      << c.status().toString();
  EXPECT_LT(secondsSince(t0), 2.5);
}

TEST_F(QuorumTest, EtcdStoppedIsANamedErrorWithinTheBound) {
  auto g0 = make("g0");
  auto g1 = make("g1");
  ASSERT_TRUE(g0->join(kPrint).ok());
  ASSERT_TRUE(g1->join(kPrint).ok());
  ASSERT_TRUE(g0->stepQuorum(0).ok());
  ASSERT_TRUE(g0->vote(0, true).ok());
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    etcd_->stop();  // while g0 waits for g1's vote
  });
  auto t0 = Clock::now();
  auto c = g0->shouldCommit(0);
  stopper.join();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(etcd_->endpoint()), std::string::npos)
      << c.status().toString();
  EXPECT_LT(secondsSince(t0), 8.0);
  t0 = Clock::now();
  auto q = g1->stepQuorum(0);
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find(etcd_->endpoint()), std::string::npos);
  EXPECT_LT(secondsSince(t0), 2.0);
}

// The coordination layer's settings, bad: every value is refused naming the variable and the
// value, before any connection (the examples do not read them yet, so bad_input.classes skips
// them and this is their check).
TEST(QuorumSettings, BadEnvironmentValuesAreNamed) {
  for (const char* var :
       {"HSDP_ELASTIC_LEASE_S", "HSDP_ELASTIC_VOTE_TIMEOUT_MS", "HSDP_ETCD_TIMEOUT_MS"}) {
    for (const char* bad : {"12x", "18446744073709551616", "0"}) {
      ASSERT_EQ(setenv(var, bad, 1), 0);
      Quorum::Options o;
      o.endpoint = "http://127.0.0.1:9";  // never reached: the settings are read first
      o.job = "j";
      o.group = "g0";
      StatusOr<std::unique_ptr<Quorum>> q = Quorum::create(o);
      unsetenv(var);
      ASSERT_FALSE(q.ok()) << var << "=" << bad;
      const std::string msg = q.status().toString();
      EXPECT_NE(msg.find(var), std::string::npos) << msg;
      EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    }
  }
}

// The per-step cost report: 3 groups x 40 committed steps with nothing else running. Each group's
// requests per step are counted by its client (the truth: at least the quorum's read, the vote and
// the decision's read or watch); the printed line is the one the end of an elastic run shows.
TEST_F(QuorumTest, StepCostCountsEveryCommittedStepsRequests) {
  auto qs = joinThree();
  auto p = ptrs(qs);
  constexpr int kSteps = 40;
  for (int s = 0; s < kSteps; ++s)
    for (auto& r : runStep(p, s)) ASSERT_TRUE(r.ok() && *r) << r.status().toString();
  for (Quorum* q : p) {
    const Quorum::StepCost c = q->stepCost();
    EXPECT_EQ(c.steps, kSteps - 1);  // the first step (the start barrier) left out
    EXPECT_GE(c.requests, 3.0);
    EXPECT_LE(c.requests, 12.0);
    EXPECT_GT(c.request_ms, 0.0);
    EXPECT_NE(q->stepCostLine().find("elastic: quorum+vote "), std::string::npos);
    std::printf("%s: %s\n", q->group().c_str(), q->stepCostLine().c_str());
  }
}

// The abort watch's eyes (member_watch.h): a lease that ends ends that incarnation, and a rejoin
// (a new incarnation) ends the old one but not itself; a live member is never ended. Truth: the
// incarnations the quorum reads.
TEST_F(QuorumTest, TheMemberWatchSeesALeaseEndAndARejoin) {
  auto g0 = make("g0");
  auto g1 = make("g1", /*beat_thread=*/false);  // nobody refreshes its lease
  ASSERT_TRUE(g0->join(kPrint).ok());
  ASSERT_TRUE(g1->join(kPrint).ok());
  auto watch = MemberWatch::create(etcd_->endpoint(), "job1");
  ASSERT_TRUE(watch.ok()) << watch.status().toString();
  auto before = g0->members();
  ASSERT_TRUE(before.ok() && before->size() == 2u);
  const Member m0 = (*before)[0], m1 = (*before)[1];
  auto endsOf = [&](const Member& m, double seconds) {
    auto t0 = Clock::now();
    while (secondsSince(t0) < seconds) {
      auto ends = (*watch)->next(500);
      if (!ends.ok()) continue;
      for (const MemberEnd& e : *ends) {
        EXPECT_FALSE(e.ends(m0)) << "g0 is alive";
        if (e.ends(m)) return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(endsOf(m1, kTtl + 3.0)) << "g1's lease ended";
  ASSERT_TRUE(g1->rejoin(0).ok());  // its lease is gone: a new incarnation
  auto after = g0->members();
  ASSERT_TRUE(after.ok() && after->size() == 2u);
  const Member m1b = (*after)[1];
  EXPECT_GT(m1b.incarnation, m1.incarnation);
  Member old = m1b;
  old.incarnation = m1.incarnation;
  auto ends = (*watch)->next(2000);  // the join's put
  ASSERT_TRUE(ends.ok() && !ends->empty()) << ends.status().toString();
  EXPECT_TRUE(ends->back().ends(old));
  EXPECT_FALSE(ends->back().ends(m1b));
  ASSERT_TRUE(g1->leave().ok());
}

}  // namespace
}  // namespace hsdp::elastic
