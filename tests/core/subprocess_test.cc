// core/subprocess.h with real children: exit codes, the environment and output file, process
// groups and sessions, the death signal when the parent dies, and a bounded stop of a child that
// ignores SIGTERM.
#include "core/subprocess.h"

#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "hsdp/files.h"

namespace hsdp::proc {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t msSince(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count();
}

// A fresh directory under $TMPDIR for a test's files.
std::string tempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/hsdp-proc-XXXXXX";
  EXPECT_NE(::mkdtemp(templ.data()), nullptr);
  return templ;
}

// The file's content ("" while it does not exist), through the library's file layer.
std::string readFile(const std::string& path) {
  StatusOr<std::string> s = files::readBounded(path, 1 << 20, "a child's output");
  return s.ok() ? *s : std::string();
}

Options shell(const std::string& script) {
  Options o;
  o.argv = {"/bin/sh", "-c", script};
  return o;
}

// Polls until the child ends (reaped), at most `ms`.
std::optional<Exit> waitUpTo(Child& c, int ms) {
  const auto t0 = Clock::now();
  while (msSince(t0) < ms) {
    if (std::optional<Exit> e = c.poll()) return e;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return std::nullopt;
}

TEST(Subprocess, ExitCodesAndExecFailure) {
  StatusOr<Child> c = Child::start(shell("exit 3"));
  ASSERT_TRUE(c.ok()) << c.status().toString();
  std::optional<Exit> e = waitUpTo(*c, 5000);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, 3);
  EXPECT_EQ(e->signal, 0);
  EXPECT_FALSE(c->started());  // reaped
  const std::string dir = tempDir();
  Options o;
  o.argv = {dir + "/no-such-program"};
  o.output = dir + "/out";
  o.exec_failure_note = "cannot run it\n";
  c = Child::start(o);
  ASSERT_TRUE(c.ok()) << c.status().toString();
  e = waitUpTo(*c, 5000);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, 127);
  EXPECT_EQ(readFile(dir + "/out"), "cannot run it\n");
  // The output file is new or nothing: an existing one is never written.
  c = Child::start(o);
  ASSERT_TRUE(c.ok());
  e = waitUpTo(*c, 5000);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code, 127);
  EXPECT_EQ(readFile(dir + "/out"), "cannot run it\n");
  EXPECT_FALSE(Child::start(Options{}).ok());
}

TEST(Subprocess, EnvironmentOutputAndPeek) {
  const std::string dir = tempDir();
  Options o = shell("echo \"[$HSDP_PROC_TEST][$HOME]\"; read x; echo \"stdin:$x\" 1>&2");
  o.env = std::vector<std::string>{"HSDP_PROC_TEST=yes", "PATH=/usr/bin:/bin"};
  o.output = dir + "/out";
  StatusOr<Child> c = Child::start(o);
  ASSERT_TRUE(c.ok()) << c.status().toString();
  const pid_t pid = c->pid();
  // Ended, seen without reaping: the pid stays ours (a zombie) until poll() or wait().
  const auto t0 = Clock::now();
  while (!c->peek() && msSince(t0) < 5000) std::this_thread::sleep_for(milliseconds(5));
  ASSERT_TRUE(c->peek().has_value());
  EXPECT_TRUE(peekExit(pid).has_value());
  EXPECT_EQ(c->pid(), pid);
  EXPECT_EQ(c->wait().code, 0);
  EXPECT_FALSE(c->started());
  EXPECT_EQ(readFile(dir + "/out"), "[yes][]\nstdin:\n");  // only the given environment
}

TEST(Subprocess, ProcessGroupAndSession) {
  Options o;
  o.argv = {"/bin/sleep", "30"};
  StatusOr<Child> g = Child::start(o);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(::getpgid(g->pid()), g->pid());  // the default: a process group of its own
  o.group = Options::Group::kSession;
  StatusOr<Child> s = Child::start(o);
  ASSERT_TRUE(s.ok());
  const auto t0 = Clock::now();  // setsid() runs in the child: wait for it
  while (::getsid(s->pid()) != s->pid() && msSince(t0) < 5000)
    std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(::getsid(s->pid()), s->pid());
  o.group = Options::Group::kInherit;
  StatusOr<Child> i = Child::start(o);
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(::getpgid(i->pid()), ::getpgrp());
  for (Child* c : {&*g, &*s, &*i}) {
    std::optional<Exit> e = c->stop(milliseconds(2000));
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->signal, SIGTERM);
    EXPECT_EQ(e->code, 128 + SIGTERM);
  }
  EXPECT_FALSE(g->stop(milliseconds(10)).has_value());  // stopped already: nothing to do
}

// A parent killed outright takes its child with it: the child gets the death signal.
TEST(Subprocess, ChildGetsTheDeathSignalWhenItsParentDies) {
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);  // the orphan comes to us: we can reap it
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {  // the parent to be killed: starts the child, says its pid, waits
    Options o;
    o.argv = {"/bin/sleep", "60"};
    o.death_signal = SIGKILL;
    StatusOr<Child> c = Child::start(o);
    const pid_t pid = c.ok() ? c->pid() : -1;
    if (::write(fds[1], &pid, sizeof(pid)) != sizeof(pid)) ::_exit(1);
    while (true) ::pause();
  }
  pid_t child = -1;
  ASSERT_EQ(::read(fds[0], &child, sizeof(child)), static_cast<ssize_t>(sizeof(child)));
  ::close(fds[0]);
  ::close(fds[1]);
  ASSERT_GT(child, 0);
  // Once the child runs sleep, it is past its prctl().
  const std::string exe = "/proc/" + std::to_string(child) + "/exe";
  char target[256] = {};
  auto t0 = Clock::now();
  while (msSince(t0) < 5000 && (::readlink(exe.c_str(), target, sizeof(target) - 1) <= 0 ||
                                std::string(target).find("sleep") == std::string::npos))
    std::this_thread::sleep_for(milliseconds(5));
  ASSERT_EQ(::kill(parent, SIGKILL), 0);
  ASSERT_EQ(::waitpid(parent, nullptr, 0), parent);
  int status = 0;
  pid_t r = 0;
  t0 = Clock::now();
  while ((r = ::waitpid(child, &status, WNOHANG)) == 0 && msSince(t0) < 5000)
    std::this_thread::sleep_for(milliseconds(10));
  if (r == 0) ::kill(child, SIGKILL), ::waitpid(child, nullptr, 0);
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  ASSERT_EQ(r, child) << "the child outlived its parent";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

TEST(Subprocess, StopIsBoundedForAChildThatIgnoresSigterm) {
  const std::string dir = tempDir();
  // SIGTERM stays ignored across exec; "ready" says the trap is set.
  Options o = shell("trap '' TERM; echo ready; exec sleep 60");
  o.output = dir + "/out";
  StatusOr<Child> c = Child::start(o);
  ASSERT_TRUE(c.ok()) << c.status().toString();
  auto t0 = Clock::now();
  while (readFile(dir + "/out").find("ready") == std::string::npos && msSince(t0) < 5000)
    std::this_thread::sleep_for(milliseconds(5));
  t0 = Clock::now();
  std::optional<Exit> e = c->stop(milliseconds(300));
  ASSERT_TRUE(e.has_value());
  EXPECT_GE(msSince(t0), 280);
  EXPECT_LT(msSince(t0), 3000);
  EXPECT_EQ(e->signal, SIGKILL);
  EXPECT_EQ(e->code, 128 + SIGKILL);
  EXPECT_FALSE(c->started());
}

}  // namespace
}  // namespace hsdp::proc
