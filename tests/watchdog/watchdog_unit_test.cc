// The watchdog's parts in one process, against what each must produce by construction:
//  - settings: HSDP_TIMEOUT_S / HSDP_NCCL_TIMEOUT_S / HSDP_WATCHDOG / HSDP_CHECK_COLLECTIVES
//    parsed and rejected with the variable named, and EngineConfig::failure.timeout_s over the env;
//  - the table: a segment created, attached by name, unlinked (gone from /dev/shm), read back,
//    serialized and parsed to the same records; a stopped / dead process seen as such;
//  - the out-of-band channel: a request answered by a server, the first of several targets, and
//    an unreachable target costing only the deadline;
//  - the report line for a scene built by hand: who is behind, stopped, unreachable;
//  - fingerprint descriptions and the comparison of what members must agree on.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/watchdog/watch_oob.h"
#include "core/watchdog/watch_table.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/config.h"

namespace hsdp::watchdog {
namespace {

struct EnvGuard {
  explicit EnvGuard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) {
      names.push_back(k);
      if (v)
        setenv(k, v, 1);
      else
        unsetenv(k);
    }
  }
  ~EnvGuard() {
    for (const char* k : names) unsetenv(k);
  }
  std::vector<const char*> names;
};

TEST(WatchdogConfig, DefaultsAndEnvironment) {
  {
    EnvGuard g({{"HSDP_TIMEOUT_S", nullptr}, {"HSDP_NCCL_TIMEOUT_S", nullptr}});
    auto c = resolveConfig({});
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_EQ(*c->timeout_s, 600);
    EXPECT_TRUE(*c->enabled);
    EXPECT_FALSE(*c->check_collectives);
  }
  {
    EnvGuard g(
        {{"HSDP_TIMEOUT_S", "2.5"}, {"HSDP_WATCHDOG", "0"}, {"HSDP_CHECK_COLLECTIVES", "1"}});
    auto c = resolveConfig({});
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_EQ(*c->timeout_s, 2.5);
    EXPECT_FALSE(*c->enabled);
    EXPECT_TRUE(*c->check_collectives);
    Config given;
    given.timeout_s = 7;  // a field that is set wins over the environment
    EXPECT_EQ(*resolveConfig(given)->timeout_s, 7);
  }
  for (const char* bad : {"0", "-3", "ten", "1e999", "nan", "5s", ""}) {
    if (*bad == '\0') continue;  // empty is unset
    EnvGuard g({{"HSDP_TIMEOUT_S", bad}});
    auto c = resolveConfig({});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(std::string("HSDP_TIMEOUT_S='") + bad + "'"),
              std::string::npos)
        << c.status().message();
  }
}

TEST(WatchdogConfig, OldNcclNameIsAnAlias) {
  {
    EnvGuard g({{"HSDP_TIMEOUT_S", nullptr}, {"HSDP_NCCL_TIMEOUT_S", "42"}});
    EXPECT_EQ(*resolveConfig({})->timeout_s, 42);
  }
  {
    EnvGuard g({{"HSDP_TIMEOUT_S", nullptr}, {"HSDP_NCCL_TIMEOUT_S", "0"}});  // 0: no timeout
    EXPECT_TRUE(std::isinf(*resolveConfig({})->timeout_s));
  }
  {
    EnvGuard g({{"HSDP_TIMEOUT_S", "9"}, {"HSDP_NCCL_TIMEOUT_S", "42"}});  // the new name wins
    EXPECT_EQ(*resolveConfig({})->timeout_s, 9);
  }
  {
    EnvGuard g({{"HSDP_TIMEOUT_S", nullptr}, {"HSDP_NCCL_TIMEOUT_S", "x"}});
    EXPECT_FALSE(resolveConfig({}).ok());
  }
}

TEST(WatchdogConfig, EngineConfigField) {
  {
    EnvGuard g({{"HSDP_TIMEOUT_S", "30"}});
    auto c = resolveEngineConfig({});
    ASSERT_TRUE(c.ok()) << c.status().toString();
    EXPECT_EQ(*c->failure.timeout_s, 30);
    EngineConfig set;
    set.failure.timeout_s = 5;
    EXPECT_EQ(*resolveEngineConfig(set)->failure.timeout_s, 5);
    set.failure.timeout_s = 0;
    auto bad = resolveEngineConfig(set);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("EngineConfig::failure.timeout_s=0"), std::string::npos);
  }
  EnvGuard g({{"HSDP_TIMEOUT_S", "-1"}});
  auto bad = resolveEngineConfig({});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("HSDP_TIMEOUT_S='-1'"), std::string::npos);
}

Fingerprint fp(uint64_t seq, OpKind kind, uint64_t count, DType t, const char* unit) {
  Fingerprint f;
  f.seq = seq;
  f.comm_id = 7;
  f.count = count;
  f.kind = static_cast<uint8_t>(kind);
  f.dtype = static_cast<uint8_t>(t);
  std::snprintf(f.unit, sizeof f.unit, "%s", unit);
  return f;
}

TEST(Fingerprint, DescribeAndCompare) {
  const Fingerprint a = fp(3, OpKind::kAllGather, 1000, DType::kFloat32, "fc1");
  EXPECT_EQ(describe(a), "all-gather of unit \"fc1\" (1000 floats)");
  Fingerprint rs = fp(3, OpKind::kReduceScatter, 1, DType::kBFloat16, "");
  rs.redop = static_cast<uint8_t>(RedOp::kAvg);
  EXPECT_EQ(describe(rs), "reduce-scatter (1 bf16, avg)");
  EXPECT_EQ(describe(fp(1, OpKind::kBarrier, 0, DType::kUInt8, "")), "barrier");
  EXPECT_TRUE(sameCollective(a, a));
  for (auto f : {fp(4, OpKind::kAllGather, 1000, DType::kFloat32, "fc1"),
                 fp(3, OpKind::kAllReduce, 1000, DType::kFloat32, "fc1"),
                 fp(3, OpKind::kAllGather, 333, DType::kFloat32, "fc1"),
                 fp(3, OpKind::kAllGather, 1000, DType::kBFloat16, "fc1"),
                 fp(3, OpKind::kAllGather, 1000, DType::kFloat32, "fc2")})
    EXPECT_FALSE(sameCollective(a, f)) << describe(f);
}

TEST(GroupTable, SharedSegmentIsUnlinkedAndReadBack) {
  const std::string name = "/hsdp-wd-unittest-" + std::to_string(getpid());
  std::string err;
  std::unique_ptr<GroupTable> a(GroupTable::create(name, 99, 2, &err));
  ASSERT_NE(a, nullptr) << err;
  std::unique_ptr<GroupTable> wrong(GroupTable::attach(name, 98, 2, &err));
  EXPECT_EQ(wrong, nullptr) << "another job's nonce must not attach";
  std::unique_ptr<GroupTable> b(GroupTable::attach(name, 99, 2, &err));
  ASSERT_NE(b, nullptr) << err;
  GroupTable::unlink(name);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name));
  // Writes through one mapping are seen through the other.
  RankSlot& s = a->slot(1);
  s.world_rank = 5;
  s.pid = getpid();
  s.heartbeat_ns.store(monotonicNs());
  CommSlot& c = s.comms[0];
  c.id.store(7);
  c.ring[2 % kRing] = fp(2, OpKind::kAllGather, 1000, DType::kFloat32, "fc1");
  c.entered.store(2);
  std::vector<RankView> v = readGroup(*b, 3000);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[1].world_rank, 5);
  EXPECT_EQ(v[1].state, 'R');
  ASSERT_EQ(v[1].comms.size(), 1u);
  EXPECT_EQ(v[1].comms[0].entered, 2u);
  ASSERT_NE(v[1].comms[0].find(2), nullptr);
  EXPECT_EQ(describe(*v[1].comms[0].find(2)), "all-gather of unit \"fc1\" (1000 floats)");
  EXPECT_EQ(v[1].comms[0].find(1), nullptr);
  // The wire form parses back to the same records.
  std::vector<RankView> back;
  ASSERT_TRUE(parseGroup(serializeGroup(v), &back));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].world_rank, 5);
  EXPECT_TRUE(sameCollective(*back[1].comms[0].find(2), *v[1].comms[0].find(2)));
  EXPECT_FALSE(parseGroup(serializeGroup(v).substr(0, 10), &back));
  // A failure notice is posted once.
  EXPECT_TRUE(a->postAbort(5, "timeout after 3 s"));
  EXPECT_FALSE(b->postAbort(6, "later"));
  int from = -1;
  std::string reason;
  ASSERT_TRUE(b->abortNotice(&from, &reason));
  EXPECT_EQ(from, 5);
  EXPECT_EQ(reason, "timeout after 3 s");
}

TEST(GroupTable, StoppedStaleAndGoneProcesses) {
  std::string err;
  std::unique_ptr<GroupTable> t(GroupTable::create("", 1, 3, &err));
  ASSERT_NE(t, nullptr) << err;
  const pid_t child = fork();
  if (child == 0) {
    for (;;) pause();
  }
  kill(child, SIGSTOP);
  int status = 0;
  waitpid(child, &status, WUNTRACED);
  const pid_t gone = fork();
  if (gone == 0) _exit(0);
  waitpid(gone, &status, 0);
  const int64_t now = monotonicNs();
  for (int i = 0; i < 3; ++i) t->slot(i).world_rank = i;
  t->slot(0).pid = child;
  t->slot(0).heartbeat_ns.store(now);
  t->slot(1).pid = gone;
  t->slot(1).heartbeat_ns.store(now);
  t->slot(2).pid = getpid();
  t->slot(2).heartbeat_ns.store(now - 10'000'000'000);  // alive, but no heartbeat for 10 s
  std::vector<RankView> v = readGroup(*t, 3000);
  EXPECT_EQ(v[0].state, 'T');
  EXPECT_EQ(v[1].state, 'X');
  EXPECT_EQ(v[2].state, 'T');
  EXPECT_GE(v[2].heartbeat_age_ms, 9900);
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
}

TEST(Oob, RequestAnswerFirstOfMany) {
  std::string err;
  std::unique_ptr<oob::Server> server = oob::Server::listen(&err);
  ASSERT_NE(server, nullptr) << err;
  server->start([](char type, const std::string& body) { return std::string(1, type) + body; });
  // A listening socket that never answers (the kernel accepts, nobody reads: a stopped rank).
  std::unique_ptr<oob::Server> mute = oob::Server::listen(&err);
  ASSERT_NE(mute, nullptr);
  const uint32_t lo = htonl(INADDR_LOOPBACK);
  std::string reply;
  ASSERT_TRUE(
      oob::requestAny({{lo, mute->port()}, {lo, server->port()}}, 'Q', "abc", 2000, &reply));
  EXPECT_EQ(reply, "Qabc");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(oob::requestAny({{lo, mute->port()}}, 'Q', "", 300, &reply));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 1.5);
  EXPECT_FALSE(oob::localAddresses(4).empty());
}

// A scene: rank 0 (this one) waits on communicator 7 {0, 1, 2, 3} at seq 5; rank 1 entered only
// 4 and is stopped; rank 2 entered 5; rank 3's node did not answer; rank 4 (not a member) is gone.
TEST(Report, NamesWhoDidNotArrive) {
  TraceInfo t;
  t.id = 7;
  t.name = "inter level";
  t.members = {0, 1, 2, 3};
  t.entered = 5;
  Fingerprint f = fp(5, OpKind::kReduceScatter, 250, DType::kFloat32, "fc2");
  std::snprintf(f.group, sizeof f.group, "shard group");
  t.ring[5 % kRing] = f;
  JobView job;
  job.ranks.resize(5);
  job.hosts = {"node0", "node0", "node0", "node1", "node1"};
  for (int r = 0; r < 5; ++r) {
    job.ranks[r].world_rank = r;
    job.ranks[r].pid = 100 + r;
    job.ranks[r].state = 'R';
    CommView c;
    c.id = 7;
    c.entered = r == 1 ? 4 : 5;
    job.ranks[r].comms.push_back(c);
  }
  job.ranks[1].state = 'T';
  job.ranks[1].heartbeat_age_ms = 20300;
  job.ranks[3].state = 'U';
  job.ranks[3].comms.clear();
  job.ranks[4].state = 'X';
  job.ranks[4].comms.clear();
  WaitInfo w;
  w.waiting = true;
  w.seconds = 20.2;
  w.what = "waitForUnshard";
  w.detail = "fc2";
  w.comm_id = 7;
  w.seq = 5;
  const std::string line = timeoutLine(0, w, {t}, job, 20, "");
  EXPECT_EQ(line,
            "hsdp [rank 0]: timeout: reduce-scatter of unit \"fc2\" (shard group, inter level, "
            "seq 5) not complete after 20 s (in waitForUnshard \"fc2\"); not arrived: rank 1 "
            "(node0, stopped, no heartbeat for 20 s), rank 3 (node1, unreachable); elsewhere: "
            "rank 4 (node1, gone) (HSDP_TIMEOUT_S=20)")
      << line;
}

// A node cut off: this rank (0, node0) waits on communicator 9 {0, 2} (rank 2 on node1); node1
// (ranks 2-3) answers nobody. Every communicator shows only unreachable members, so the one this
// rank entered a collective on last is named, and the node once.
TEST(Report, NamesANodeCutOff) {
  TraceInfo a, b;
  a.id = 9;
  a.name = "inter level";
  a.members = {0, 2};
  a.entered = 3;
  a.last_enter = 20;
  a.ring[3 % kRing] = fp(3, OpKind::kAllGather, 64, DType::kFloat32, "fc0");
  b = a;
  b.id = 10;
  b.name = "inter level/reduce";
  b.last_enter = 21;
  b.ring[3 % kRing] = fp(3, OpKind::kReduceScatter, 64, DType::kFloat32, "fc1");
  JobView job;
  job.ranks.resize(4);
  job.hosts = {"node0", "node0", "node1", "node1"};
  for (int r = 0; r < 4; ++r) {
    job.ranks[r].world_rank = r;
    job.ranks[r].state = r < 2 ? 'R' : 'U';
    job.ranks[r].pid = r < 2 ? 100 + r : 0;
  }
  WaitInfo w;
  w.waiting = true;
  w.seconds = 21;
  w.what = "step";
  const std::string line = timeoutLine(0, w, {a, b}, job, 20, "rank 1: timeout after 20 s");
  EXPECT_EQ(line,
            "hsdp [rank 0]: timeout: reduce-scatter of unit \"fc1\" (inter level/reduce, seq 3) "
            "not complete after 21 s (in step); not arrived: rank 2 (node1, unreachable); "
            "unreachable: node1 (ranks 2-3); job ended by rank 1: timeout after 20 s")
      << line;
}

}  // namespace
}  // namespace hsdp::watchdog
