// The replica transport between elastic groups (elastic/replica_ring.h, docs/elastic.md): members
// as threads on 127.0.0.1, and a member as a forked process where a real SIGKILL or SIGSTOP is
// the point. Sums are checked against a closed form on exactly representable inputs.
#include "elastic/replica_ring.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

namespace hsdp::elastic {
namespace {

using Clock = std::chrono::steady_clock;
using Ring = std::unique_ptr<ReplicaRing>;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Listeners {
  std::vector<std::unique_ptr<ReplicaListener>> l;
  std::vector<std::string> addresses;
  explicit Listeners(int r) {
    for (int i = 0; i < r; ++i) {
      auto x = ReplicaListener::open("127.0.0.1", 0);
      EXPECT_TRUE(x.ok()) << x.status().toString();
      addresses.push_back((*x)->address());
      l.push_back(std::move(*x));
    }
  }
};

ReplicaRing::Options opts(int64_t attempt, int64_t timeout_ms = 5000) {
  ReplicaRing::Options o;
  o.job = "job1";
  o.step = 7;
  o.attempt = attempt;
  o.timeout_ms = timeout_ms;
  o.chunk_bytes = 64 << 10;
  return o;
}

// Member m's input: exactly representable, so every summation order gives the same float and
// the closed form (m+1) summed over m is the truth.
float input(int m, size_t e) {
  return static_cast<float>(m + 1) * (static_cast<int>(e % 1001) - 500) / 8.0f;
}

// Runs fn(i, ring) on R threads, each building its ring on its own listener.
void runMembers(Listeners& ls, const std::vector<int>& members, int64_t attempt,
                const std::function<void(int, ReplicaRing&)>& fn) {
  std::vector<std::string> addrs;
  for (int m : members) addrs.push_back(ls.addresses[m]);
  std::vector<std::thread> t;
  for (size_t i = 0; i < members.size(); ++i)
    t.emplace_back([&, i] {
      auto ring = ReplicaRing::create(static_cast<int>(i), addrs, *ls.l[members[i]], opts(attempt));
      ASSERT_TRUE(ring.ok()) << ring.status().toString();
      fn(static_cast<int>(i), **ring);
    });
  for (auto& x : t) x.join();
}

TEST(ReplicaRing, AllReduceSumAndAverageMatchTheClosedFormBitwiseOnEveryMember) {
  for (int r : {1, 2, 3, 5}) {
    Listeners ls(r);
    std::vector<int> members(r);
    for (int i = 0; i < r; ++i) members[i] = i;
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, (size_t{1} << 20) + 3}) {
      std::vector<std::vector<float>> sum(r), avg(r);
      runMembers(ls, members, static_cast<int64_t>(n), [&](int i, ReplicaRing& ring) {
        sum[i].resize(n);
        for (size_t e = 0; e < n; ++e) sum[i][e] = input(i, e);
        avg[i] = sum[i];
        Status s = ring.allReduce(sum[i].data(), n, ReplicaRing::Op::kSum);
        ASSERT_TRUE(s.ok()) << s.toString();
        s = ring.allReduce(avg[i].data(), n, ReplicaRing::Op::kAvg);
        ASSERT_TRUE(s.ok()) << s.toString();
      });
      const float k = static_cast<float>(r * (r + 1) / 2);
      size_t bad = 0;
      for (size_t e = 0; e < n; ++e) {
        const float want = k * input(0, e);
        const float want_avg = want / static_cast<float>(r);
        bad += sum[0][e] != want || avg[0][e] != want_avg;
      }
      EXPECT_EQ(bad, 0u) << "R=" << r << " n=" << n;
      for (int i = 1; i < r; ++i) {
        EXPECT_EQ(std::memcmp(sum[i].data(), sum[0].data(), 4 * n), 0) << "R=" << r << " n=" << n;
        EXPECT_EQ(std::memcmp(avg[i].data(), avg[0].data(), 4 * n), 0) << "R=" << r << " n=" << n;
      }
    }
  }
}

// Inputs whose sum depends on the order: the members still agree to the bit, and the result is
// within float rounding of the sum computed in double.
TEST(ReplicaRing, RoundedSumsAreBitwiseEqualAcrossMembers) {
  const int r = 5;
  const size_t n = 100003;
  Listeners ls(r);
  std::vector<std::vector<float>> in(r), out(r);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int i = 0; i < r; ++i)
    for (size_t e = 0; e < n; ++e) in[i].push_back(u(rng) * std::pow(10.f, float(e % 7) - 3));
  runMembers(ls, {0, 1, 2, 3, 4}, 0, [&](int i, ReplicaRing& ring) {
    out[i] = in[i];
    Status s = ring.allReduce(out[i].data(), n, ReplicaRing::Op::kSum);
    ASSERT_TRUE(s.ok()) << s.toString();
  });
  for (int i = 1; i < r; ++i) EXPECT_EQ(std::memcmp(out[i].data(), out[0].data(), 4 * n), 0);
  for (size_t e = 0; e < n; ++e) {
    double want = 0, mag = 0;
    for (int i = 0; i < r; ++i) want += in[i][e], mag += std::fabs(in[i][e]);
    ASSERT_NEAR(out[0][e], want, 4 * mag * 6e-8) << e;
  }
}

// A member in another process: builds its ring and all-reduces until it fails (or is killed).
pid_t forkMember(Listeners& ls, int self, size_t n, int64_t timeout_ms) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  auto ring = ReplicaRing::create(self, ls.addresses, *ls.l[self], opts(0, timeout_ms));
  if (!ring.ok()) _exit(3);
  std::vector<float> v(n);
  while (true) {
    for (size_t e = 0; e < n; ++e) v[e] = input(self, e);
    if (!(*ring)->allReduce(v.data(), n, ReplicaRing::Op::kSum).ok()) _exit(4);
  }
}

// Members 0 and 1 are threads, member 2 a child process; `act` is done to the child after the
// threads completed a few all-reduces; returns each thread's error and seconds after `act`.
struct Outcome {
  std::string error[2];
  double after[2] = {0, 0};
};
Outcome loseTheChild(Listeners& ls, int sig, int64_t timeout_ms, size_t n) {
  const pid_t child = forkMember(ls, 2, n, timeout_ms);
  ls.l[2].reset();  // the child holds member 2's listener
  std::atomic<int> done_rounds{0};
  std::atomic<bool> signalled{false};
  Clock::time_point t_sig;
  Outcome out;
  std::vector<std::thread> t;
  for (int i = 0; i < 2; ++i)
    t.emplace_back([&, i] {
      auto ring = ReplicaRing::create(i, ls.addresses, *ls.l[i], opts(0, timeout_ms));
      ASSERT_TRUE(ring.ok()) << ring.status().toString();
      std::vector<float> v(n);
      for (int round = 0; round < 100000; ++round) {
        for (size_t e = 0; e < n; ++e) v[e] = input(i, e);
        Status s = (*ring)->allReduce(v.data(), n, ReplicaRing::Op::kSum);
        if (!s.ok()) {
          out.after[i] = signalled ? since(t_sig) : -1;
          out.error[i] = s.message();
          return;
        }
        EXPECT_EQ(v[n - 1], 6 * input(0, n - 1));
        ++done_rounds;
      }
    });
  while (done_rounds < 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  t_sig = Clock::now();
  signalled = true;
  ::kill(child, sig);
  for (auto& x : t) x.join();
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  return out;
}

TEST(ReplicaRingFailure, KilledMemberIsNamedWithinTheDeadlineAndTheSurvivorsRebuild) {
  Listeners ls(3);
  const int64_t timeout_ms = 2000;
  Outcome o = loseTheChild(ls, SIGKILL, timeout_ms, size_t{1} << 20);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(o.error[i].find("member 2 (" + ls.addresses[2] + ")"), std::string::npos)
        << o.error[i];
    EXPECT_NE(o.error[i].find("all-reduce #"), std::string::npos) << o.error[i];
    EXPECT_GE(o.after[i], 0) << o.error[i];
    EXPECT_LE(o.after[i], timeout_ms / 1000.0 + 1.0) << o.error[i];
    std::printf("member %d after %.3f s: %s\n", i, o.after[i], o.error[i].c_str());
  }
  // The survivors build a ring of two (the next attempt) on the same listeners: right sums.
  std::vector<std::vector<float>> v(2);
  const size_t n = 1000;
  runMembers(ls, {0, 1}, 1, [&](int i, ReplicaRing& ring) {
    for (size_t e = 0; e < n; ++e) v[i].push_back(input(i, e));
    Status s = ring.allReduce(v[i].data(), n, ReplicaRing::Op::kSum);
    ASSERT_TRUE(s.ok()) << s.toString();
  });
  for (int i = 0; i < 2; ++i)
    for (size_t e = 0; e < n; ++e) ASSERT_EQ(v[i][e], 3 * input(0, e)) << i << " " << e;
}

TEST(ReplicaRingFailure, StoppedMemberIsNamedAtTheDeadline) {
  Listeners ls(3);
  const int64_t timeout_ms = 1000;
  Outcome o = loseTheChild(ls, SIGSTOP, timeout_ms, size_t{1} << 20);
  for (int i = 0; i < 2; ++i) {
    EXPECT_NE(o.error[i].find("member 2 (" + ls.addresses[2] + ")"), std::string::npos)
        << o.error[i];
    EXPECT_EQ(o.error[i].find("member 0 (127.0.0.1:" + ls.addresses[0].substr(10) + ") made"),
              std::string::npos)
        << o.error[i];
    EXPECT_GE(o.after[i], timeout_ms / 1000.0 * 0.9) << o.error[i];
    EXPECT_LE(o.after[i], timeout_ms / 1000.0 + 1.0) << o.error[i];
    std::printf("member %d after %.3f s: %s\n", i, o.after[i], o.error[i].c_str());
  }
  // A thread that stops taking part: member 1 of 2 never calls allReduce.
  Listeners l2(2);
  std::string err;
  double took = 0;
  runMembers(l2, {0, 1}, 0, [&](int i, ReplicaRing& ring) {
    if (i == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(6500));
      return;
    }
    std::vector<float> v(1 << 20, 1.f);
    const auto t0 = Clock::now();
    Status s = ring.allReduce(v.data(), v.size(), ReplicaRing::Op::kSum);
    took = since(t0);
    err = s.message();
  });
  EXPECT_NE(err.find("member 1 (" + l2.addresses[1] + ") made no progress"), std::string::npos)
      << err;
  EXPECT_LE(took, 5.0 + 1.0) << err;
}

TEST(ReplicaRingSetup, ConnectionFromAnotherAttemptIsRefusedByName) {
  Listeners ls(2);
  std::string stale_error;
  Status good;
  std::thread member0([&] {
    auto ring = ReplicaRing::create(0, ls.addresses, *ls.l[0], opts(1, 4000));
    good = ring.status();
  });
  // A member 1 left over from attempt 0 connects first: refused, and told that its attempt is
  // over (member 0 is in a later one), at once rather than at the deadline.
  auto t0 = std::chrono::steady_clock::now();
  auto stale = ReplicaRing::create(1, ls.addresses, *ls.l[1], opts(0, 4000));
  ASSERT_FALSE(stale.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2000));
  stale_error = stale.status().message();
  EXPECT_NE(stale_error.find("superseded: member 0 (" + ls.addresses[0] + ") is in step 7"),
            std::string::npos)
      << stale_error;
  EXPECT_NE(stale_error.find("attempt 0"), std::string::npos) << stale_error;
  EXPECT_NE(stale_error.find("attempt 1"), std::string::npos) << stale_error;
  // The member of attempt 1 then joins: member 0's ring is built.
  auto fresh = ReplicaRing::create(1, ls.addresses, *ls.l[1], opts(1, 4000));
  member0.join();
  EXPECT_TRUE(fresh.ok()) << fresh.status().toString();
  EXPECT_TRUE(good.ok()) << good.toString();
  // Alone, member 0 names the missing member and the refused one at its deadline.
  Listeners l3(2);
  auto alone = ReplicaRing::create(0, l3.addresses, *l3.l[0], opts(3, 300));
  ASSERT_FALSE(alone.ok());
  EXPECT_NE(alone.status().message().find("member 1 (" + l3.addresses[1] + ") did not connect"),
            std::string::npos)
      << alone.status().toString();
}

TEST(ReplicaRingSetup, AMemberStillInAnEarlierRingIsWaitedForAndAGoneOneNamedAtOnce) {
  // Member 0 is still in attempt 0 (waiting for a member 1 that never comes) when the member 1
  // of attempt 1 dials it: member 0's ring ends "superseded", member 1 dials again, and the
  // ring of attempt 1 is built once member 0 gets there.
  Listeners ls(2);
  Status old0, new0;
  std::thread member0([&] {
    auto old_ring = ReplicaRing::create(0, ls.addresses, *ls.l[0], opts(0, 4000));
    old0 = old_ring.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    new0 = ReplicaRing::create(0, ls.addresses, *ls.l[0], opts(1, 4000)).status();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto member1 = ReplicaRing::create(1, ls.addresses, *ls.l[1], opts(1, 4000));
  member0.join();
  EXPECT_TRUE(member1.ok()) << member1.status().toString();
  EXPECT_TRUE(new0.ok()) << new0.toString();
  ASSERT_FALSE(old0.ok());
  EXPECT_NE(old0.message().find("superseded"), std::string::npos) << old0.toString();
  // With refused_is_dead, a member whose listener is closed is named gone at once.
  std::vector<std::string> addrs = {"", ""};
  Listeners live(1);
  {
    Listeners gone(1);
    addrs[0] = gone.addresses[0];
  }
  addrs[1] = live.addresses[0];
  ReplicaRing::Options o = opts(2, 4000);
  o.refused_is_dead = true;
  std::vector<int> culprits;
  auto t0 = std::chrono::steady_clock::now();
  auto lone = ReplicaRing::create(1, addrs, *live.l[0], o, &culprits);
  ASSERT_FALSE(lone.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
  EXPECT_NE(lone.status().message().find("the process is gone"), std::string::npos)
      << lone.status().toString();
  EXPECT_EQ(culprits, std::vector<int>{0});
}

TEST(ReplicaRing, LargeSendRecvReportsItsBytes) {
  Listeners ls(3);
  const size_t bytes = size_t{64} << 20;
  std::vector<char> src(bytes), dst(bytes, 0);
  for (size_t i = 0; i < bytes; ++i) src[i] = static_cast<char>(i * 2654435761u >> 13);
  ReplicaRing::Transfer sent, got;
  runMembers(ls, {0, 1, 2}, 0, [&](int i, ReplicaRing& ring) {
    if (i == 2) {
      auto t = ring.send(0, src.data(), bytes);
      ASSERT_TRUE(t.ok()) << t.status().toString();
      sent = *t;
    } else if (i == 0) {
      auto t = ring.recv(2, dst.data(), bytes);
      ASSERT_TRUE(t.ok()) << t.status().toString();
      got = *t;
    }
  });
  EXPECT_EQ(sent.bytes, bytes);
  EXPECT_EQ(got.bytes, bytes);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), bytes), 0);
  std::printf("64 MiB member 2 -> member 0: %.3f s, %.0f MB/s\n", got.seconds,
              bytes / 1e6 / got.seconds);
}

// HSDP_REPLICA_TIMEOUT_MS, bad: refused naming the variable and the value, before any connection
// (no example reads it yet, so bad_input.classes skips it and this is its check).
TEST(ReplicaRingSettings, BadEnvironmentValuesAreNamed) {
  Listeners ls(1);
  const char* var = "HSDP_REPLICA_TIMEOUT_MS";
  for (const char* bad : {"12x", "18446744073709551616", "0", "-5"}) {
    ASSERT_EQ(setenv(var, bad, 1), 0);
    ReplicaRing::Options o = opts(0);
    o.timeout_ms = 0;  // from the environment
    auto r = ReplicaRing::create(0, ls.addresses, *ls.l[0], o);
    unsetenv(var);
    ASSERT_FALSE(r.ok()) << var << "=" << bad;
    const std::string msg = r.status().toString();
    EXPECT_NE(msg.find(var), std::string::npos) << msg;
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace hsdp::elastic
