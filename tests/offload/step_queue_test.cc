// StepQueue: jobs run on one worker thread in submission order, tickets complete in order, the
// first error is what every later wait returns, and the destructor runs what is queued.
#include "offload/step_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace hsdp {
namespace {

TEST(StepQueue, RunsJobsInOrderOffTheCallersThread) {
  std::vector<int> ran;
  std::thread::id worker;
  {
    StepQueue q;
    int64_t last = 0;
    for (int i = 0; i < 50; ++i) {
      last = q.submit([&ran, &worker, i]() -> Status {
        ran.push_back(i);  // only the worker touches `ran` until waitAll
        worker = std::this_thread::get_id();
        return okStatus();
      });
      EXPECT_EQ(last, i + 1);
    }
    ASSERT_TRUE(q.waitFor(last).ok());
    EXPECT_TRUE(q.done(last));
    EXPECT_FALSE(q.done(last + 1));
  }
  ASSERT_EQ(ran.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(ran[i], i);
  EXPECT_NE(worker, std::this_thread::get_id());
}

TEST(StepQueue, FirstErrorIsKeptAndLaterJobsStillRun) {
  StepQueue q;
  std::atomic<int> count{0};
  q.submit([&] {
    ++count;
    return okStatus();
  });
  const int64_t bad = q.submit([&] {
    ++count;
    return invalidArgument("first");
  });
  q.submit([&] {
    ++count;
    return internalError("second");
  });
  Status s = q.waitAll();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "first");
  EXPECT_EQ(count.load(), 3);
  EXPECT_EQ(q.waitFor(bad).message(), "first");
}

TEST(StepQueue, CountsBusyAndBlockedSeconds) {
  StepQueue q;
  const int64_t t = q.submit([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    return okStatus();
  });
  ASSERT_TRUE(q.waitFor(t).ok());
  double busy = 0, blocked = 0;
  q.takeSeconds(&busy, &blocked);
  EXPECT_GE(busy, 0.025);
  EXPECT_GE(blocked, 0.0);
  EXPECT_LE(blocked, busy + 1.0);
  q.takeSeconds(&busy, &blocked);  // taken: reset
  EXPECT_EQ(busy, 0.0);
  EXPECT_EQ(blocked, 0.0);
}

TEST(StepQueue, DestructorFinishesQueuedJobs) {
  std::atomic<int> count{0};
  {
    StepQueue q;
    for (int i = 0; i < 20; ++i)
      q.submit([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ++count;
        return okStatus();
      });
  }
  EXPECT_EQ(count.load(), 20);
}

}  // namespace
}  // namespace hsdp
