#include "elastic_launch.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "core/subprocess.h"
#include "engine/elastic_env.h"

extern char** environ;

namespace hsdp::elastic_launch {
namespace {

using Clock = std::chrono::steady_clock;

// The self-pipe the signal handler writes to (why: poll() wakes on it, so a signal or a child's
// exit ends the wait at once, without a race between checking a flag and sleeping).
int g_pipe[2] = {-1, -1};
volatile sig_atomic_t g_signal = 0;   // the first SIGINT/SIGTERM/SIGHUP
volatile sig_atomic_t g_signals = 0;  // how many of them

void onSignal(int sig) {
  const int saved = errno;
  if (sig != SIGCHLD) {
    if (g_signal == 0) g_signal = sig;
    g_signals = g_signals + 1;
  }
  const char c = 0;
  if (::write(g_pipe[1], &c, 1) < 0) {
  }  // full: a wake-up is pending already
  errno = saved;
}

// Waits until a signal arrives or `ms` pass, then empties the pipe.
void waitEvent(int64_t ms) {
  pollfd p{g_pipe[0], POLLIN, 0};
  ::poll(&p, 1, static_cast<int>(ms));
  char buf[64];
  while (::read(g_pipe[0], buf, sizeof(buf)) > 0) {
  }
}

void note(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char* fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "hsdp-elastic: %s\n", line);
  std::fflush(stderr);
}

const char* signalName(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Sends `sig` (0: none) to every live process of session `sid`, the group's launcher and all it
// started locally (Open MPI puts each rank in a process group of its own, so a process group
// does not reach them; a session does, and the orphans of a dead launcher keep it), and reaps
// those that are our zombies (orphans come to us, the subreaper). Returns how many are alive
// (zombies are not). The leader itself is left for the caller to reap.
int signalSession(pid_t sid, int sig) {
  int alive = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return 0;
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    char path[64], stat[512];
    std::snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const ssize_t n = ::read(fd, stat, sizeof(stat) - 1);
    ::close(fd);
    if (n <= 0) continue;
    stat[n] = '\0';
    const char* rp = std::strrchr(stat, ')');  // the command may hold spaces and parentheses
    char state = 0;
    long ppid = 0, pgrp = 0, session = 0;
    if (rp == nullptr ||
        std::sscanf(rp + 1, " %c %ld %ld %ld", &state, &ppid, &pgrp, &session) != 4)
      continue;
    if (session != sid) continue;
    if (state == 'Z' || state == 'X') {
      if (ppid == ::getpid() && pid != sid) ::waitpid(static_cast<pid_t>(pid), nullptr, WNOHANG);
      continue;
    }
    if (sig != 0) ::kill(static_cast<pid_t>(pid), sig);
    ++alive;
  }
  ::closedir(proc);
  return alive;
}

struct Group {
  int index = 0;
  std::vector<std::string> hosts;
  int restarts = 0;
  proc::Child launcher;  // mpirun or srun, leader of its own session; not started: not running
  Clock::time_point started;
  bool done = false;      // nothing more to run: finished, or ended after another finished
  bool finished = false;  // its program exited 0 (it committed the job's last step)
};

class Watcher {
 public:
  Watcher(const Plan& plan, pid_t coordinator) : plan_(plan), coordinator_(coordinator) {
    groups_.resize(static_cast<size_t>(plan.groups));
    for (int i = 0; i < plan.groups; ++i) {
      groups_[i].index = i;
      if (!plan.group_hosts.empty()) groups_[i].hosts = plan.group_hosts[i];
    }
  }

  int run() {
    for (Group& g : groups_)
      if (!start(g)) return stopAll(3);
    for (;;) {
      if (int sig = pendingSignal()) {
        note("%s received; stopping the job", signalName(sig));
        return stopAll(128 + sig);
      }
      if (coordinator_ > 0 && proc::peekExit(coordinator_)) {
        note("the local etcd (pid %d) exited; stopping the job", static_cast<int>(coordinator_));
        return stopAll(3);
      }
      bool all_done = true;
      for (Group& g : groups_) {
        if (g.launcher.started()) {
          if (std::optional<proc::Exit> e = g.launcher.peek()) {
            const int rc = onEnd(g, *e);
            if (rc >= 0) return rc;
          }
        }
        all_done = all_done && g.done;
      }
      if (all_done) {
        int ran = 0;
        for (const Group& g : groups_) ran += g.finished ? 1 : 0;
        if (ran == plan_.groups)
          note("all %d groups finished", plan_.groups);
        else
          note("the job finished: %d of %d groups ran to its end (the others ended after it)", ran,
               plan_.groups);
        return 0;
      }
      waitEvent(500);
    }
  }

 private:
  // Group g's launcher ended with e: done, restarted, or given up (returns the exit code after
  // stopping the rest); -1 while the job goes on.
  int onEnd(Group& g, const proc::Exit& e) {
    const double secs = secondsSince(g.started);
    finish(g);
    if (e.code == 0) {
      note("group %d finished (exit 0) after %.1f s", g.index, secs);
      g.done = g.finished = true;
      return -1;
    }
    char how[96];
    if (e.signal != 0)
      std::snprintf(how, sizeof(how), "was killed by signal %d (%s)", e.signal,
                    strsignal(e.signal));
    else
      std::snprintf(how, sizeof(how), "exited with code %d", e.code);
    // A group that finished has committed the job's last step: the job is done, and a group
    // that ends after that could never heal again (its donors have exited). It is not
    // restarted, and the job's result stands (the soak met this: a group killed near the end
    // was restarted until it ran out of restarts, each run failing to find a donor).
    if (const Group* f = finishedGroup()) {
      note("group %d %s after %.1f s, after group %d finished the job; not restarted", g.index, how,
           secs, f->index);
      g.done = true;
      return -1;
    }
    if (g.restarts >= plan_.max_restarts) {
      note("group %d %s after %.1f s", g.index, how, secs);
      note("group %d failed %d time%s; giving up (exit %d)", g.index, g.restarts + 1,
           g.restarts == 0 ? "" : "s", e.code);
      return stopAll(e.code);
    }
    ++g.restarts;
    std::string where;
    if (next_spare_ < plan_.spare_hosts.size()) {
      g.hosts = plan_.spare_hosts[next_spare_++];
      where = " on spare hosts " + join(g.hosts, ",");
    } else if (!plan_.spare_hosts.empty()) {
      where = " on the same hosts (no spare host set left)";
    }
    note("group %d %s after %.1f s; restart %d of %d%s", g.index, how, secs, g.restarts,
         plan_.max_restarts, where.c_str());
    return start(g) ? -1 : stopAll(3);
  }

  const Group* finishedGroup() const {
    for (const Group& g : groups_)
      if (g.done && g.finished) return &g;
    return nullptr;
  }

  // Starts group g's launcher in a session of its own (a kill reaches it and what it starts),
  // with the job's variables in its environment; SIGTERM when hsdp-elastic is killed outright.
  // False (and a message) when it could not be started.
  bool start(Group& g) {
    proc::Options o;
    o.argv = groupCommand(plan_, g.hosts);
    o.env.emplace();
    for (char** e = environ; *e != nullptr; ++e) {
      bool ours = false;
      for (const env::Declared* p : elastic_env::kContract) {
        const size_t n = std::strlen(p->name());
        ours = ours || (std::strncmp(*e, p->name(), n) == 0 && (*e)[n] == '=');
      }
      if (!ours) o.env->emplace_back(*e);
    }
    const auto set = [&](const env::Declared& p, const std::string& v) {
      o.env->push_back(std::string(p.name()) + "=" + v);
    };
    set(elastic_env::kEndpoint, plan_.endpoint);
    set(elastic_env::kJob, plan_.job);
    set(elastic_env::kGroupIndex, std::to_string(g.index));
    set(elastic_env::kGroups, std::to_string(plan_.groups));
    set(elastic_env::kRestarts, std::to_string(g.restarts));
    o.death_signal = SIGTERM;
    o.group = proc::Options::Group::kSession;
    o.exec_failure_note =
        "hsdp-elastic: group " + std::to_string(g.index) + ": cannot run " + o.argv[0] + "\n";
    StatusOr<proc::Child> child = proc::Child::start(o);
    if (!child.ok()) {
      note("group %d: %s; stopping the job", g.index, child.status().message().c_str());
      return false;
    }
    g.launcher = std::move(*child);
    g.started = Clock::now();
    note("group %d started: pid %d%s%s%s", g.index, static_cast<int>(g.launcher.pid()),
         g.restarts ? (", restart " + std::to_string(g.restarts)).c_str() : "",
         g.hosts.empty() ? "" : ", hosts ", join(g.hosts, ",").c_str());
    return true;
  }

  // g's launcher has ended (not reaped yet): kill what is left of its session, then reap it.
  void finish(Group& g) {
    for (int i = 0; i < 100 && signalSession(g.launcher.pid(), SIGKILL) > 0; ++i)  // up to ~2 s
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    (void)g.launcher.wait();
  }

  // Stops every running group (SIGTERM, then SIGKILL after the grace, or at once on a second
  // signal) and returns rc.
  int stopAll(int rc) {
    int running = 0;
    for (Group& g : groups_) running += g.launcher.started();
    if (running == 0) return rc;
    note("stopping %d group%s: SIGTERM, SIGKILL after %.0f s", running, running == 1 ? "" : "s",
         plan_.grace_s);
    for (Group& g : groups_) {
      if (!g.launcher.started()) continue;
      g.launcher.signal(SIGTERM);  // also before its setsid(), when the session has no members yet
      signalSession(g.launcher.pid(), SIGTERM);
    }
    const Clock::time_point deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(plan_.grace_s * 1000));
    const int signals = g_signals;
    while (running > 0 && Clock::now() < deadline && g_signals == signals) {
      for (Group& g : groups_) {
        if (g.launcher.started() && g.launcher.peek()) {
          finish(g);
          --running;
        }
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (running > 0 && left > 0) waitEvent(std::min<int64_t>(left, 200));
    }
    if (g_signals != signals) note("another signal: SIGKILL now");
    for (Group& g : groups_) {
      if (!g.launcher.started()) continue;
      if (g_signals == signals) note("group %d did not stop within the grace; SIGKILL", g.index);
      g.launcher.signal(SIGKILL);
      signalSession(g.launcher.pid(), SIGKILL);
      siginfo_t info{};
      ::waitid(P_PID, static_cast<id_t>(g.launcher.pid()), &info, WEXITED | WNOWAIT);  // dies now
      finish(g);
    }
    return rc;
  }

  const Plan& plan_;
  const pid_t coordinator_;
  std::vector<Group> groups_;
  size_t next_spare_ = 0;
};

}  // namespace

std::vector<std::string> groupCommand(const Plan& plan, const std::vector<std::string>& hosts) {
  std::vector<std::string> cmd = {plan.launcher_path};
  const bool mpirun = plan.kind == LauncherKind::kMpirun;
  cmd.push_back(mpirun ? "-np" : "--ntasks");
  cmd.push_back(std::to_string(plan.np));
  cmd.insert(cmd.end(), plan.launcher_args.begin(), plan.launcher_args.end());
  if (mpirun) {
    // The contract's variables and every other HSDP_* setting of this environment go to every
    // rank, also on other hosts (beyond its own host mpirun passes only what -x names).
    std::vector<std::string> names;
    for (const env::Declared* p : elastic_env::kContract) names.emplace_back(p->name());
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string name(*e, std::strcspn(*e, "="));
      if (name.rfind("HSDP_", 0) == 0 && std::find(names.begin(), names.end(), name) == names.end())
        names.push_back(name);
    }
    for (const std::string& name : names) {
      cmd.push_back("-x");
      cmd.push_back(name);
    }
  }
  if (!hosts.empty()) {
    cmd.push_back(mpirun ? "--host" : "--nodelist");
    cmd.push_back(join(hosts, ","));
  }
  cmd.insert(cmd.end(), plan.program.begin(), plan.program.end());
  return cmd;
}

bool installSignalHandlers() {
  if (::pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGINT, SIGTERM, SIGHUP})
    if (::sigaction(sig, &sa, nullptr) != 0) return false;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  if (::sigaction(SIGCHLD, &sa, nullptr) != 0) return false;
  return ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
}

int pendingSignal() { return g_signal; }

int superviseGroups(const Plan& plan, pid_t coordinator) {
  return Watcher(plan, coordinator).run();
}

}  // namespace hsdp::elastic_launch
