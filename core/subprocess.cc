// Starting, watching and stopping a child process (core/subprocess.h).
#include "core/subprocess.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

extern char** environ;

namespace hsdp::proc {
namespace {

Exit fromWaitStatus(int status) {
  if (WIFSIGNALED(status)) return Exit{128 + WTERMSIG(status), WTERMSIG(status)};
  return Exit{WEXITSTATUS(status), 0};
}

// The child's side, between fork and exec: async-signal-safe calls only.
[[noreturn]] void runChild(const Options& o, pid_t parent, char* const* argv, char* const* envp) {
  if (o.group == Options::Group::kSession) ::setsid();
  if (o.group == Options::Group::kProcessGroup) ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, o.death_signal);
  if (::getppid() != parent) ::_exit(127);       // the parent died before prctl
  const int in = ::open("/dev/null", O_RDONLY);  // a background child must not read a tty
  if (in < 0 || ::dup2(in, 0) < 0) ::_exit(127);
  if (!o.output.empty()) {
    const int out = ::open(o.output.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    if (out < 0 || ::dup2(out, 1) < 0 || ::dup2(out, 2) < 0) ::_exit(127);
  }
  ::execve(argv[0], argv, envp);
  if (!o.exec_failure_note.empty() &&
      ::write(2, o.exec_failure_note.data(), o.exec_failure_note.size()) < 0) {
  }
  ::_exit(127);
}

}  // namespace

std::optional<Exit> peekExit(pid_t pid) {
  siginfo_t info{};
  if (pid <= 0 ||
      ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 ||
      info.si_pid != pid)
    return std::nullopt;
  if (info.si_code == CLD_EXITED) return Exit{info.si_status, 0};
  return Exit{128 + info.si_status, info.si_status};
}

StatusOr<Child> Child::start(const Options& o) {
  if (o.argv.empty()) return invalidArgument("starting a child: no program");
  std::vector<std::string> args = o.argv;
  std::vector<std::string> env = o.env.value_or(std::vector<std::string>());
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  char* const* child_env = o.env ? envp.data() : environ;
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return internalError("starting '", o.argv[0], "': fork: ", std::strerror(errno));
  if (pid == 0) runChild(o, parent, argv.data(), child_env);
  // Also here: a signal to the group reaches the child whichever of the two runs first.
  if (o.group == Options::Group::kProcessGroup) (void)::setpgid(pid, pid);
  return Child(pid);
}

Child::~Child() { (void)stop(std::chrono::seconds(5)); }

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    (void)stop(std::chrono::seconds(5));
    pid_ = std::exchange(o.pid_, -1);
  }
  return *this;
}

std::optional<Exit> Child::peek() const { return peekExit(pid_); }

std::optional<Exit> Child::poll() {
  if (pid_ <= 0) return std::nullopt;
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r != pid_) return std::nullopt;
  pid_ = -1;
  return fromWaitStatus(status);
}

Exit Child::wait() {
  if (pid_ <= 0) return Exit{};
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &status, 0);
  } while (r < 0 && errno == EINTR);
  pid_ = -1;
  return r > 0 ? fromWaitStatus(status) : Exit{};
}

bool Child::signal(int sig) const { return pid_ > 0 && ::kill(pid_, sig) == 0; }

std::optional<Exit> Child::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return std::nullopt;
  if (std::optional<Exit> e = poll()) return e;
  (void)signal(SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::optional<Exit> e = poll()) return e;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (void)signal(SIGKILL);
  return wait();
}

}  // namespace hsdp::proc
