// The etcd client against a real etcd (one per test): every answer is etcd's own, read back.
#include "elastic/etcd_client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <thread>

#include "tests/elastic/elastic_test_util.h"

namespace hsdp::elastic {
namespace {

using testing::secondsSince;
using Clock = std::chrono::steady_clock;

std::unique_ptr<EtcdClient> clientFor(const std::string& endpoint, int64_t timeout_ms = 2000) {
  EtcdClient::Options o;
  o.timeout_ms = timeout_ms;
  auto c = EtcdClient::create(endpoint, o);
  EXPECT_TRUE(c.ok()) << c.status().toString();
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(Base64, Rfc4648Vectors) {
  const char* plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
  const char* coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(base64Encode(plain[i]), coded[i]);
    auto d = base64Decode(coded[i]);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, plain[i]);
  }
  EXPECT_FALSE(base64Decode("Zm9").ok());
  EXPECT_FALSE(base64Decode("Zm!v").ok());
  EXPECT_FALSE(base64Decode("Z=9v").ok());
  EXPECT_EQ(prefixEnd("/a/"), "/a0");
  EXPECT_EQ(prefixEnd(std::string("a\xff", 2)), "b");
}

class EtcdClientTest : public testing::WithEtcd {};

TEST_F(EtcdClientTest, PutGetRangeDeleteRoundTripEveryByte) {
  auto c = clientFor(etcd_->endpoint());
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<char>(b));
  auto r1 = c->put("/p/a", bytes);
  ASSERT_TRUE(r1.ok()) << r1.status().toString();
  ASSERT_TRUE(c->put("/p/b", "2").ok());
  ASSERT_TRUE(c->put("/q", "3").ok());
  auto a = c->get("/p/a");
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ((*a)->value, bytes);
  EXPECT_EQ((*a)->create_revision, *r1);
  EXPECT_EQ((*a)->version, 1);
  auto range = c->getPrefix("/p/");
  ASSERT_TRUE(range.ok());
  ASSERT_EQ(range->kvs.size(), 2u);
  EXPECT_EQ(range->kvs[0].key, "/p/a");
  EXPECT_EQ(range->kvs[1].key, "/p/b");
  EXPECT_EQ(range->revision, *r1 + 2);
  auto none = c->get("/p/none");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(*c->del("/p/a"), 1);
  EXPECT_FALSE(c->get("/p/a")->has_value());
  EXPECT_EQ(*c->del("/p/", true), 1);
  EXPECT_TRUE(c->get("/q")->has_value());
}

TEST_F(EtcdClientTest, CreateIfAbsentHasExactlyOneWinnerAmongConcurrentCreators) {
  constexpr int kN = 8;
  std::barrier sync(kN);
  std::atomic<int> winners{0};
  std::vector<std::string> seen(kN);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      auto c = clientFor(etcd_->endpoint());
      std::string me = "creator" + std::to_string(i);
      sync.arrive_and_wait();
      auto t = c->txn({Compare::absent("/k")}, {Op::put("/k", me)}, {Op::get("/k")});
      ASSERT_TRUE(t.ok()) << t.status().toString();
      if (t->succeeded) {
        ++winners;
        seen[i] = me;
      } else {
        ASSERT_EQ(t->ranges.size(), 1u);
        seen[i] = t->ranges[0].kvs.at(0).value;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
  auto c = clientFor(etcd_->endpoint());
  std::string stored = (*c->get("/k"))->value;
  for (const std::string& s : seen) EXPECT_EQ(s, stored);  // every loser read the winner
}

TEST_F(EtcdClientTest, CompareAndSwapOnValueAndVersion) {
  auto c = clientFor(etcd_->endpoint());
  ASSERT_TRUE(c->put("/cas", "v1").ok());
  auto miss = c->txn({Compare::valueIs("/cas", "v0")}, {Op::put("/cas", "x")}, {});
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->succeeded);
  EXPECT_EQ((*c->get("/cas"))->value, "v1");
  auto hit = c->txn({Compare::valueIs("/cas", "v1")}, {Op::put("/cas", "v2")}, {});
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(hit->succeeded);
  auto kv = *c->get("/cas");
  EXPECT_EQ(kv->value, "v2");
  EXPECT_EQ(kv->version, 2);
  EXPECT_TRUE(c->txn({Compare::versionIs("/cas", 2), Compare::modifiedAt("/cas", kv->mod_revision)},
                     {Op::del("/cas")}, {})
                  ->succeeded);
  EXPECT_FALSE(c->get("/cas")->has_value());
}

TEST_F(EtcdClientTest, LeaseExpiryRemovesTheKeyWithinTtlPlusOneSecond) {
  auto c = clientFor(etcd_->endpoint());
  auto lease = c->leaseGrant(2);
  ASSERT_TRUE(lease.ok()) << lease.status().toString();
  ASSERT_TRUE(c->put("/leased", "x", *lease).ok());
  EXPECT_EQ((*c->get("/leased"))->lease, *lease);
  auto t0 = Clock::now();
  while (c->get("/leased")->has_value() && secondsSince(t0) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  double gone = secondsSince(t0);
  EXPECT_FALSE(c->get("/leased")->has_value());
  EXPECT_GT(gone, 1.0);
  EXPECT_LT(gone, 3.0);
  auto ka = c->leaseKeepAlive(*lease);
  EXPECT_EQ(ka.status().code(), StatusCode::kNotFound) << ka.status().toString();
}

TEST_F(EtcdClientTest, KeepAliveKeepsTheKeyAndRevokeDeletesIt) {
  auto c = clientFor(etcd_->endpoint());
  int64_t lease = *c->leaseGrant(2);
  ASSERT_TRUE(c->put("/kept", "x", lease).ok());
  auto t0 = Clock::now();
  while (secondsSince(t0) < 4) {
    auto ttl = c->leaseKeepAlive(lease);
    ASSERT_TRUE(ttl.ok()) << ttl.status().toString();
    EXPECT_EQ(*ttl, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  EXPECT_TRUE(c->get("/kept")->has_value());  // twice its TTL later
  EXPECT_TRUE(c->leaseRevoke(lease).ok());
  EXPECT_FALSE(c->get("/kept")->has_value());
  EXPECT_TRUE(c->leaseRevoke(lease).ok());  // gone already: not an error
}

TEST_F(EtcdClientTest, WatchSeesPutAndDeleteAndTimesOutQuietly) {
  auto c = clientFor(etcd_->endpoint());
  int64_t rev = *c->put("/w/base", "0");
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto w = clientFor(etcd_->endpoint());
    ASSERT_TRUE(w->put("/w/x", "hello").ok());
  });
  auto t0 = Clock::now();
  auto seen = c->waitForChange("/w/", rev + 1, 5000);
  writer.join();
  ASSERT_TRUE(seen.ok()) << seen.status().toString();
  ASSERT_EQ(seen->events.size(), 1u);
  EXPECT_EQ(seen->events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(seen->events[0].kv.key, "/w/x");
  EXPECT_EQ(seen->events[0].kv.value, "hello");
  EXPECT_EQ(seen->next_revision, rev + 2);
  EXPECT_LT(secondsSince(t0), 2.0);
  ASSERT_TRUE(c->del("/w/x").ok());
  auto del = c->waitForChange("/w/", seen->next_revision, 2000);
  ASSERT_TRUE(del.ok());
  ASSERT_EQ(del->events.size(), 1u);
  EXPECT_EQ(del->events[0].type, WatchEvent::Type::kDelete);
  t0 = Clock::now();
  auto quiet = c->waitForChange("/w/", del->next_revision, 400);
  ASSERT_TRUE(quiet.ok()) << quiet.status().toString();
  EXPECT_TRUE(quiet->timed_out);
  EXPECT_TRUE(quiet->events.empty());
  EXPECT_GT(secondsSince(t0), 0.35);
  EXPECT_LT(secondsSince(t0), 1.5);
}

TEST(EtcdClientErrors, RefusedAndSilentEndpointsAreNamedWithinTheBound) {
  // A socket that listens but never answers: the kernel accepts the connection, etcd never
  // replies, so only the request bound ends the call.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::string silent = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto c = clientFor(silent, 500);
  auto t0 = Clock::now();
  auto r = c->put("/some/key", "v");
  double took = secondsSince(t0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(silent), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("put '/some/key'"), std::string::npos);
  EXPECT_GT(took, 0.4);
  EXPECT_LT(took, 2.0);
  ::close(fd);  // now refused: immediate
  t0 = Clock::now();
  auto g = c->get("/other");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find(silent), std::string::npos);
  EXPECT_NE(g.status().message().find("get '/other'"), std::string::npos);
  EXPECT_LT(secondsSince(t0), 1.0);
  EXPECT_FALSE(EtcdClient::create("127.0.0.1:2379").ok());  // no scheme
}

TEST_F(EtcdClientTest, EtcdStoppedMidUseIsAnErrorNotAHang) {
  auto c = clientFor(etcd_->endpoint(), 1000);
  int64_t rev = *c->put("/m/a", "1");
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    etcd_->stop();
  });
  auto t0 = Clock::now();
  auto w = c->waitForChange("/m/", rev + 1, 10000);  // etcd dies while this waits
  stopper.join();
  EXPECT_FALSE(w.ok() && !w->timed_out && !w->events.empty());
  EXPECT_LT(secondsSince(t0), 7.0);  // etcd's SIGTERM grace plus the bound, far below 10 s
  if (!w.ok()) EXPECT_NE(w.status().message().find("watch '/m/'"), std::string::npos);
  t0 = Clock::now();
  auto p = c->put("/m/b", "2");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find(etcd_->endpoint()), std::string::npos);
  EXPECT_LT(secondsSince(t0), 2.0);
}

// A 3-member cluster (LocalEtcdCluster) behind one client with the three endpoints.
class EtcdClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = testing::missingEtcd(); !why.empty()) GTEST_SKIP() << why;
    auto c = LocalEtcdCluster::start(3);
    ASSERT_TRUE(c.ok()) << c.status().toString();
    cluster_ = std::move(*c);
  }
  std::unique_ptr<LocalEtcdCluster> cluster_;
};

TEST_F(EtcdClusterTest, AMemberKilledBetweenRequestsIsFailedOverLeaseAndWatchIncluded) {
  auto c = clientFor(cluster_->endpoint(), 1500);
  ASSERT_EQ(c->endpoints().size(), 3u);
  auto lease = c->leaseGrant(30);
  ASSERT_TRUE(lease.ok()) << lease.status().toString();
  auto rev = c->put("/f/a", "1", *lease);
  ASSERT_TRUE(rev.ok()) << rev.status().toString();
  // The client speaks to member 0 first: kill -9 it between two requests.
  cluster_->member(0).kill();
  auto t0 = Clock::now();
  auto a = c->get("/f/a");
  ASSERT_TRUE(a.ok()) << a.status().toString();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->value, "1");
  EXPECT_EQ((*a)->mod_revision, *rev);
  // Refused at once; when it was the leader, the others elect one first (1-2 s): within the
  // budget of one bound per member.
  EXPECT_LT(secondsSince(t0), 3 * 1.5);
  auto ttl = c->leaseKeepAlive(*lease);  // the lease lives on through the members left
  ASSERT_TRUE(ttl.ok()) << ttl.status().toString();
  EXPECT_GT(*ttl, 0);
  // A watch on the survivors sees a write made through another client of the cluster.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto w = clientFor(cluster_->endpoint(), 2000);
    EXPECT_TRUE(w->put("/f/b", "2").ok());
  });
  auto seen = c->waitForChange("/f/", *rev + 1, 10000);
  writer.join();
  ASSERT_TRUE(seen.ok()) << seen.status().toString();
  ASSERT_FALSE(seen->timed_out);
  ASSERT_EQ(seen->events.size(), 1u);
  EXPECT_EQ(seen->events[0].kv.key, "/f/b");
  // A transaction's comparison holds on the survivors as on the member that died.
  auto t = c->txn({Compare::modifiedAt("/f/a", *rev)}, {Op::put("/f/a", "3")}, {});
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_TRUE(t->succeeded);
  // A client that knows only the dead member: its own error, naming it.
  auto lone = clientFor(cluster_->member(0).endpoint(), 500);
  auto e = lone->get("/f/a");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("etcd " + cluster_->member(0).endpoint()), std::string::npos)
      << e.status().message();
}

TEST_F(EtcdClusterTest, TheMajorityLostIsABoundedErrorNamingEveryMember) {
  auto c = clientFor(cluster_->endpoint(), 1000);
  ASSERT_TRUE(c->put("/g/a", "1").ok());
  cluster_->member(1).kill();
  cluster_->member(2).kill();
  auto t0 = Clock::now();
  auto g = c->get("/g/a");  // linearizable: the one member left cannot serve it
  const double took = secondsSince(t0);
  ASSERT_FALSE(g.ok()) << "a read served without a majority";
  const std::string m = g.status().message();  // a copy: status() returns by value
  EXPECT_NE(m.find("lost its quorum"), std::string::npos) << m;
  EXPECT_NE(m.find("get '/g/a'"), std::string::npos) << m;
  for (int i = 0; i < 3; ++i)
    EXPECT_NE(m.find("etcd " + cluster_->member(i).endpoint()), std::string::npos) << m;
  EXPECT_GT(took, 0.9);            // the member left was asked until the budget was spent
  EXPECT_LT(took, 3 * 1.0 + 1.0);  // one bound per member
  auto p = c->put("/g/b", "2");
  EXPECT_FALSE(p.ok());
}

TEST(EtcdClientList, EveryEndpointOfAListIsChecked) {
  EXPECT_TRUE(EtcdClient::create("http://127.0.0.1:1,http://127.0.0.1:2").ok());
  auto bad = EtcdClient::create("http://127.0.0.1:1,127.0.0.1:2");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'127.0.0.1:2'"), std::string::npos);
  EXPECT_FALSE(EtcdClient::create("http://127.0.0.1:1,").ok());
  EXPECT_FALSE(EtcdClient::create("http://127.0.0.1:1,http://127.0.0.1:1").ok());
}

}  // namespace
}  // namespace hsdp::elastic
