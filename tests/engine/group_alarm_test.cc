// The elastic group's alarm (src/engine/group_alarm.h) under mpirun: a raised alarm reaches every
// other rank of the group with its tag, the sender and the reason (at most 1 KiB of it); the
// sender is not told; a rank whose alarm is gone is skipped within the deadline and not counted.
// Oracle: what each rank raised, exchanged over MPI's own all-gather.
#include "engine/group_alarm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "hsdp/mesh.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::world;
using Clock = std::chrono::steady_clock;

// What a rank's alarm received, in order.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<uint64_t, std::string>> got;
  engine::GroupAlarm::Handler handler() {
    return [this](uint64_t tag, const std::string& reason) {
      std::lock_guard<std::mutex> lock(mu);
      got.emplace_back(tag, reason);
      cv.notify_all();
    };
  }
  // Waits until `n` alarms arrived or `ms` passed; what arrived.
  std::vector<std::pair<uint64_t, std::string>> waitFor(size_t n, int ms) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::milliseconds(ms), [&] { return got.size() >= n; });
    return got;
  }
};

// The control plane the alarm is created over: the world as a mesh of replicas.
struct Control {
  std::unique_ptr<Mesh> mesh;
  std::unique_ptr<engine::UnitCollectives> coll;
  void init() {
    StatusOr<NodeLayout> layout = groupRanksIntoNodes(world());
    ASSERT_TRUE(layout.ok()) << layout.status().toString();
    auto m = Mesh::create(world(), *layout, {1, 1});
    ASSERT_TRUE(m.ok()) << m.status().toString();
    mesh = std::move(*m);
    auto c = engine::UnitCollectives::create(*mesh, hostMemorySpace(nullptr).collectives, {});
    ASSERT_TRUE(c.ok()) << c.status().toString();
    coll = std::move(*c);
  }
};

TEST(GroupAlarm, ReachesEveryOtherRankWithTagSenderAndReason) {
  const int n = world().size(), me = world().rank();
  ASSERT_GE(n, 3) << "run under 3 or more ranks (tests/engine/CMakeLists.txt)";
  Control control;
  ASSERT_NO_FATAL_FAILURE(control.init());
  Inbox inbox;
  auto alarm = engine::GroupAlarm::create(*control.coll, "127.0.0.1", inbox.handler());
  ASSERT_TRUE(alarm.ok()) << alarm.status().toString();
  // The last rank raises (tag 7), then rank 0 (tag 9, a reason over the 1 KiB kept).
  const std::string long_reason(3000, 'x');
  for (auto [raiser, tag] : {std::pair{n - 1, uint64_t{7}}, {0, uint64_t{9}}}) {
    if (me == raiser) {
      const std::string why = tag == 7 ? "replica average failed: peer 3" : long_reason;
      EXPECT_EQ((*alarm)->raise(tag, why), n - 1);
    }
    ASSERT_TRUE(world().barrier().ok());
  }
  const size_t expected = (me == n - 1 || me == 0) ? 1 : 2;
  auto got = inbox.waitFor(expected, 5000);
  ASSERT_EQ(got.size(), expected);
  EXPECT_EQ((*alarm)->received(), static_cast<int64_t>(expected));
  size_t k = 0;
  if (me != n - 1) {
    EXPECT_EQ(got[k].first, 7u);
    EXPECT_EQ(got[k].second,
              strCat("rank ", n - 1, " of this group: replica average failed: peer 3"));
    ++k;
  }
  if (me != 0) {
    EXPECT_EQ(got[k].first, 9u);
    EXPECT_EQ(got[k].second, strCat("rank 0 of this group: ", long_reason.substr(0, 1024)));
  }
  ASSERT_TRUE(world().barrier().ok());
}

TEST(GroupAlarm, SkipsARankWhoseAlarmIsGoneWithinTheDeadline) {
  const int n = world().size(), me = world().rank();
  ASSERT_GE(n, 3) << "needs a gone rank beside a live one and the raiser";
  Control control;
  ASSERT_NO_FATAL_FAILURE(control.init());
  Inbox inbox;
  auto alarm = engine::GroupAlarm::create(*control.coll, "127.0.0.1", inbox.handler());
  ASSERT_TRUE(alarm.ok()) << alarm.status().toString();
  if (me == 0) alarm->reset();  // rank 0's listener closes
  ASSERT_TRUE(world().barrier().ok());
  if (me == n - 1) {
    const auto t0 = Clock::now();
    EXPECT_EQ((*alarm)->raise(11, "gone"), n - 2);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    EXPECT_LT(s, 0.5 * (n - 1) + 0.5) << "raise is bounded by 500 ms per sibling";
  }
  ASSERT_TRUE(world().barrier().ok());
  if (me != 0 && me != n - 1) {
    auto got = inbox.waitFor(1, 5000);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].first, 11u);
  }
  if (me == n - 1) EXPECT_EQ((*alarm)->received(), 0);
  ASSERT_TRUE(world().barrier().ok());
}

}  // namespace
}  // namespace hsdp
