// hsdp/stop.h in one process: a real signal sets the flag through the installed handler, the
// first signal is the one remembered, uncatchable signals are refused.
#include "hsdp/stop.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace hsdp {
namespace {

TEST(Stop, SignalSetsTheFlag) {
  clearStopRequest();
  ASSERT_TRUE(installStopSignals({SIGTERM, SIGUSR1}).ok());
  EXPECT_FALSE(stopRequested());
  EXPECT_EQ(stopSignal(), 0);
  ASSERT_EQ(raise(SIGUSR1), 0);  // the process survives: the handler only sets the flag
  EXPECT_TRUE(stopRequested());
  EXPECT_EQ(stopSignal(), SIGUSR1);
  ASSERT_EQ(raise(SIGTERM), 0);
  EXPECT_EQ(stopSignal(), SIGUSR1);  // the first one is kept
  clearStopRequest();
  EXPECT_FALSE(stopRequested());
  ASSERT_EQ(raise(SIGTERM), 0);
  EXPECT_EQ(stopSignal(), SIGTERM);
  clearStopRequest();
}

TEST(Stop, UncatchableRefused) {
  for (int s : {SIGKILL, SIGSTOP, 0, 65}) {
    Status st = installStopSignals({SIGTERM, s});
    ASSERT_FALSE(st.ok()) << s;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("signal " + std::to_string(s)), std::string::npos) << st.toString();
  }
}

TEST(Stop, Names) {
  EXPECT_EQ(signalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(signalName(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(signalName(40), "signal 40");
}

}  // namespace
}  // namespace hsdp
