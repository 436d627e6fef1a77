// UCX communicators built from addresses (UcxComm::createFromAddresses), with no MPI: this
// process is member 0, the others are this binary started again (fork and exec, --member k), and
// the worker addresses go through pipes, the out-of-band exchange that etcd is for elastic groups.
// Checked against closed forms: an all-reduce and a broadcast; a member stopped (SIGSTOP) or
// killed (SIGKILL) mid-run fails the others' collective within the deadline, with a Status that
// names it; abort() from another thread ends a collective that would otherwise wait for its
// deadline, at once, with the abort's reason; bad members are refused by name.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collectives/ucx/ucx_comm.h"
#include "hsdp/transport_registry.h"

namespace hsdp::ucx {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kCount = 50000;  // 200 KB of floats: the ring (small_bytes = 0 below)

bool writeAll(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool readAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool sendFrame(int fd, const std::vector<uint8_t>& b) {
  const uint32_t len = static_cast<uint32_t>(b.size());
  return writeAll(fd, &len, sizeof(len)) && writeAll(fd, b.data(), b.size());
}

bool recvFrame(int fd, std::vector<uint8_t>& b) {
  uint32_t len = 0;
  if (!readAll(fd, &len, sizeof(len)) || len > (1u << 20)) return false;
  b.resize(len);
  return readAll(fd, b.data(), len);
}

UcxMembers members(int self, std::vector<std::vector<uint8_t>> addresses, uint64_t id,
                   int64_t timeout_ms) {
  UcxMembers m;
  m.self = self;
  m.id = id;
  m.timeout_ms = timeout_ms;
  for (size_t k = 0; k < addresses.size(); ++k) m.names.push_back(strCat("group ", k));
  m.addresses = std::move(addresses);
  return m;
}

UcxOptions ringOptions() {
  UcxOptions o;
  o.small_bytes = 0;  // the ring everywhere: member 0 receives from the last member
  return o;
}

// An all-reduce (exact in float) and a broadcast from the last member, against closed forms.
Status sumAndBroadcast(Comm& c) {
  const int n = c.size(), r = c.rank();
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) v[i] = static_cast<float>(r + 1 + static_cast<int>(i % 7));
  HSDP_RETURN_IF_ERROR(c.allReduce(v.data(), kCount, DType::kFloat32, RedOp::kSum));
  for (size_t i = 0; i < kCount; ++i) {
    const float want = static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7));
    if (v[i] != want) return internalError("allReduce[", i, "] = ", v[i], ", expected ", want);
  }
  std::vector<int32_t> b(1000, r == n - 1 ? 7 : -1);
  HSDP_RETURN_IF_ERROR(c.broadcast(b.data(), b.size(), DType::kInt32, n - 1));
  for (int32_t x : b)
    if (x != 7) return internalError("broadcast delivered ", x, ", expected 7");
  return okStatus();
}

// split() of a communicator built from addresses (over its endpoints): members 0 and 1 form a
// part in reverse order (keys), the last member one of its own; the closed forms on each part,
// then on the whole again once the parts are gone (the endpoints they shared stay usable).
Status splitAndSum(Comm& c) {
  const int r = c.rank(), last = c.size() - 1;
  {
    HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> part, c.split(r == last ? 1 : 0, -r));
    const int want_size = r == last ? 1 : c.size() - 1, want_rank = r == last ? 0 : last - 1 - r;
    if (part->size() != want_size || part->rank() != want_rank)
      return internalError("member ", r, ": part rank ", part->rank(), " of ", part->size(),
                           ", expected ", want_rank, " of ", want_size);
    HSDP_RETURN_IF_ERROR(sumAndBroadcast(*part).withContext("on the part"));
  }
  return sumAndBroadcast(c).withContext("after the split");
}

// What a member does after the communicator is built; the same function on every member.
// Returns the second collective's Status (the first must succeed) and how long it took.
struct Outcome {
  Status first, second;
  double seconds = 0;
};
Outcome runScenario(Comm& c, const std::string& scenario) {
  Outcome o;
  o.first = sumAndBroadcast(c);
  if (!o.first.ok()) return o;
  const bool last = c.rank() == c.size() - 1;
  if (scenario == "stop" && last) {  // until member 0 kills it
    raise(SIGSTOP);
    // Continued anyway (ctest runs a test in its own session, where the kernel may continue a
    // stopped process of an orphaned group): it still never answers.
    for (;;) pause();
  }
  if (scenario == "kill" && last) raise(SIGKILL);
  const auto t0 = Clock::now();
  o.second = sumAndBroadcast(c);
  o.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (scenario == "sum" && o.second.ok()) o.second = splitAndSum(c);
  return o;
}

// A member started by member 0: --member k --scenario s --id i --timeout-ms t --fds in out.
int childMain(int argc, char** argv) {
  if (argc != 12) return 10;
  const int self = std::atoi(argv[2]);
  const std::string scenario = argv[4];
  const uint64_t id = std::strtoull(argv[6], nullptr, 10);
  const int64_t timeout_ms = std::atoll(argv[8]);
  const int in = std::atoi(argv[10]), out = std::atoi(argv[11]);
  auto mine = UcxWorkerAddress::acquire();
  if (!mine.ok() || !sendFrame(out, mine->bytes())) return 11;
  uint32_t n = 0;
  if (!readAll(in, &n, sizeof(n))) return 12;
  std::vector<std::vector<uint8_t>> all(n);
  for (auto& a : all)
    if (!recvFrame(in, a)) return 12;
  auto comm = UcxComm::createFromAddresses(members(self, all, id, timeout_ms), ringOptions());
  if (!comm.ok()) {
    std::fprintf(stderr, "member %d: %s\n", self, comm.status().toString().c_str());
    return 13;
  }
  // Every member stays until member 0 closes its pipe: one that left early would be blamed too.
  auto stay = [in] {
    char byte;
    while (::read(in, &byte, 1) > 0) {
    }
  };
  if (scenario == "abort") {
    stay();
    return 0;
  }
  Outcome o = runScenario(**comm, scenario);
  stay();
  if (!o.first.ok()) return 14;
  const bool want_ok = scenario == "sum";
  if (o.second.ok() != want_ok) {
    std::fprintf(stderr, "member %d: second collective: %s\n", self, o.second.toString().c_str());
    return 15;
  }
  return 0;
}

// Starts members 1..n-1 and exchanges the addresses; member 0 is this process.
class Members {
 public:
  Members(int n, const std::string& scenario, uint64_t id, int64_t timeout_ms) : id_(id) {
    auto mine = UcxWorkerAddress::acquire();
    EXPECT_TRUE(mine.ok()) << mine.status().toString();
    if (!mine.ok()) return;
    worker_ = std::move(*mine);
    addresses_.push_back(worker_.bytes());
    timeout_ms_ = timeout_ms;
    for (int k = 1; k < n; ++k) {
      int to[2], from[2];
      // Close-on-exec: a member must not hold another's pipe open (it would never see EOF).
      EXPECT_EQ(::pipe2(to, O_CLOEXEC), 0);
      EXPECT_EQ(::pipe2(from, O_CLOEXEC), 0);
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::fcntl(to[0], F_SETFD, 0);
        ::fcntl(from[1], F_SETFD, 0);
        const std::string ks = std::to_string(k), is = std::to_string(id),
                          ts = std::to_string(timeout_ms), in = std::to_string(to[0]),
                          out = std::to_string(from[1]);
        ::execl("/proc/self/exe", "ucx_addressed_test", "--member", ks.c_str(), "--scenario",
                scenario.c_str(), "--id", is.c_str(), "--timeout-ms", ts.c_str(), "--fds",
                in.c_str(), out.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      ::close(to[0]);
      ::close(from[1]);
      children_.push_back({pid, to[1], from[0]});
      std::vector<uint8_t> a;
      EXPECT_TRUE(recvFrame(from[0], a)) << "member " << k << " sent no address";
      addresses_.push_back(a);
    }
    const uint32_t count = static_cast<uint32_t>(n);
    for (const Child& c : children_) {
      EXPECT_TRUE(writeAll(c.to, &count, sizeof(count)));
      for (const auto& a : addresses_) EXPECT_TRUE(sendFrame(c.to, a));
    }
  }
  StatusOr<std::unique_ptr<UcxComm>> create() {
    return UcxComm::createFromAddresses(members(0, addresses_, id_, timeout_ms_), ringOptions());
  }
  // The same through the registry, as the engine builds it (PeerTransport "ucx").
  StatusOr<PeerComm> createViaRegistry() {
    PeerMembers p;
    UcxMembers m = members(0, addresses_, id_, timeout_ms_);
    p.self = m.self;
    p.addresses = m.addresses;
    p.id = m.id;
    p.names = m.names;
    p.timeout_ms = m.timeout_ms;
    return createPeerTransport("ucx", p);
  }
  // Ends member k now (a stopped one does not exit by itself).
  void kill(int k) { ::kill(children_[k - 1].pid, SIGKILL); }
  // Closes the pipes and returns each member's exit code (-signal when killed).
  std::vector<int> finish() {
    std::vector<int> codes;
    for (Child& c : children_) {
      ::close(c.to);
      ::close(c.from);
      int st = 0;
      ::waitpid(c.pid, &st, 0);
      codes.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
    }
    children_.clear();
    return codes;
  }
  ~Members() {
    for (Child& c : children_) ::kill(c.pid, SIGKILL);
    finish();
  }

 private:
  struct Child {
    pid_t pid;
    int to, from;
  };
  uint64_t id_;
  int64_t timeout_ms_ = 0;
  UcxWorkerAddress worker_;
  std::vector<std::vector<uint8_t>> addresses_;
  std::vector<Child> children_;
};

TEST(UcxAddressed, ThreeMembersAllReduceAndBroadcastMatchClosedForms) {
  Members m(3, "sum", 1001, 20000);
  auto c = m.create();
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_STREQ((*c)->transportName(), "ucx");
  EXPECT_EQ((*c)->size(), 3);
  Outcome o = runScenario(**c, "sum");
  EXPECT_TRUE(o.first.ok()) << o.first.toString();
  EXPECT_TRUE(o.second.ok()) << o.second.toString();
  EXPECT_EQ(m.finish(), (std::vector<int>{0, 0}));
}

// The stopped member never answers; the deadline (no progress for timeout_ms) names it.
TEST(UcxAddressed, StoppedMemberIsNamedWithinTheDeadline) {
  constexpr int64_t kTimeoutMs = 1500;
  Members m(3, "stop", 1002, kTimeoutMs);
  auto c = m.create();
  ASSERT_TRUE(c.ok()) << c.status().toString();
  Outcome o = runScenario(**c, "stop");
  ASSERT_TRUE(o.first.ok()) << o.first.toString();
  ASSERT_FALSE(o.second.ok());
  EXPECT_NE(o.second.message().find("group 2"), std::string::npos) << o.second.toString();
  EXPECT_NE(o.second.message().find("HSDP_REPLICA_TIMEOUT_MS"), std::string::npos);
  EXPECT_GE(o.seconds, 0.9 * kTimeoutMs / 1000.0);
  EXPECT_LE(o.seconds, kTimeoutMs / 1000.0 + 3.0);
  std::printf("failed after %.3f s: %s\n", o.seconds, o.second.toString().c_str());
  // Member 1 fails too (its ring neighbour stopped forwarding); then the stopped one is killed.
  m.kill(2);
  EXPECT_EQ(m.finish(), (std::vector<int>{0, -SIGKILL}));
}

// A killed member: its peers' collective fails (a UCX error on the endpoint, or the deadline)
// naming it, within the deadline.
TEST(UcxAddressed, KilledMemberIsNamedWithinTheDeadline) {
  constexpr int64_t kTimeoutMs = 3000;
  Members m(3, "kill", 1003, kTimeoutMs);
  auto c = m.create();
  ASSERT_TRUE(c.ok()) << c.status().toString();
  Outcome o = runScenario(**c, "kill");
  ASSERT_TRUE(o.first.ok()) << o.first.toString();
  ASSERT_FALSE(o.second.ok());
  EXPECT_NE(o.second.message().find("group 2"), std::string::npos) << o.second.toString();
  EXPECT_LE(o.seconds, kTimeoutMs / 1000.0 + 3.0);
  std::printf("failed after %.3f s: %s\n", o.seconds, o.second.toString().c_str());
  EXPECT_EQ((*c)->suspects(), (std::vector<int>{2}));
  EXPECT_EQ(m.finish(), (std::vector<int>{0, -SIGKILL}));
}

// abort() from another thread ends the wait at once (the deadline is far), with its reason; a
// later collective fails the same way without starting. Built and aborted through the registry.
TEST(UcxAddressed, AbortFromAnotherThreadEndsTheCollectiveAtOnce) {
  Members m(2, "abort", 1004, 60000);
  auto address = peerTransportAddress("ucx");
  ASSERT_TRUE(address.ok()) << address.status().toString();
  auto c = m.createViaRegistry();
  ASSERT_TRUE(c.ok()) << c.status().toString();
  Comm& comm = *c->comm;
  EXPECT_STREQ(comm.transportName(), "ucx");
  std::thread aborter([abort = c->abort] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    abort("the lease of group 1 ended");
  });
  std::vector<float> v(kCount, 1.0f);
  const auto t0 = Clock::now();
  Status s = comm.allReduce(v.data(), kCount, DType::kFloat32, RedOp::kSum);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  aborter.join();
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.toString();
  EXPECT_NE(s.message().find("the lease of group 1 ended"), std::string::npos) << s.toString();
  EXPECT_LT(seconds, 2.0);
  std::printf("aborted 0.3 s in, returned after %.3f s: %s\n", seconds, s.toString().c_str());
  Status again = comm.barrier();
  EXPECT_EQ(again.code(), StatusCode::kAborted) << again.toString();
  EXPECT_EQ(m.finish(), (std::vector<int>{0}));
}

TEST(UcxAddressed, BadMembersAreRefusedByName) {
  EXPECT_EQ(peerTransportAddress("no-such").status().code(), StatusCode::kNotFound);
  auto mine = UcxWorkerAddress::acquire();
  ASSERT_TRUE(mine.ok()) << mine.status().toString();
  std::vector<uint8_t> other = mine->bytes();
  other[other.size() / 2] ^= 0xff;
  auto bad_self = UcxComm::createFromAddresses(members(5, {mine->bytes(), other}, 1, 100), {});
  EXPECT_EQ(bad_self.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_self.status().message().find("self 5"), std::string::npos);
  auto not_mine = UcxComm::createFromAddresses(members(0, {other, mine->bytes()}, 1, 100), {});
  EXPECT_EQ(not_mine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(not_mine.status().message().find("not this process's UCX worker"), std::string::npos);
  auto empty = UcxComm::createFromAddresses(members(0, {mine->bytes(), {}}, 1, 100), {});
  EXPECT_NE(empty.status().message().find("member 1 has an empty address"), std::string::npos);
}

}  // namespace
}  // namespace hsdp::ucx

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--member") == 0) return hsdp::ucx::childMain(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
