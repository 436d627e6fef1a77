// hsdp's one way to run another program, private to the library: the local etcd
// (src/elastic/local_etcd.h) and hsdp-elastic's replica groups (tools/elastic_launch.h).
//
//   proc::Options o;
//   o.argv = {"/usr/bin/etcd", "--name=x"};
//   o.output = dir + "/etcd.log";                 // stdout and stderr; stdin is /dev/null
//   HSDP_ASSIGN_OR_RETURN(proc::Child c, proc::Child::start(o));
//   if (std::optional<proc::Exit> e = c.poll()) ...   // ended (and reaped)
//   c.stop(std::chrono::seconds(5));                  // SIGTERM, SIGKILL after 5 s, reaped
//
// fork + exec rather than posix_spawn: the child asks for a signal when its parent dies
// (PR_SET_PDEATHSIG; strictly, when the thread that started it ends), so a child is never left
// running by a parent killed with SIGKILL. Everything the child needs is built before fork();
// between fork and exec it makes async-signal-safe calls only.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "hsdp/status.h"

namespace hsdp::proc {

struct Options {
  std::vector<std::string> argv;  // argv[0]: the program's path (no PATH lookup)
  // The child's whole environment ("NAME=value"); nullopt: this process's.
  std::optional<std::vector<std::string>> env;
  int death_signal = SIGKILL;  // sent to the child when its parent dies
  // kProcessGroup: a process group of its own (a terminal's signals do not reach it; a signal to
  // -pid reaches what it starts); kSession: a session of its own (setsid); kInherit: this one's.
  enum class Group { kInherit, kProcessGroup, kSession };
  Group group = Group::kProcessGroup;
  // Where stdout and stderr go: "" keeps this process's; otherwise a new file (O_EXCL,
  // O_NOFOLLOW, mode 0600), never an existing one. stdin is /dev/null.
  std::string output;
  // Written to stderr by the child when exec fails (it then exits with 127).
  std::string exec_failure_note;
};

// How a child ended.
struct Exit {
  int code = 0;    // the exit code, or 128 + signal
  int signal = 0;  // killed by this signal; 0: exited
};

// The end of child `pid` if it has ended, read without reaping it (WNOWAIT): while it is a
// zombie its pid (and the process group or session it leads) cannot be reused.
std::optional<Exit> peekExit(pid_t pid);

// One started child; not reaped yet while pid() > 0. The destructor stops it (stop(), 5 s).
class Child {
 public:
  static StatusOr<Child> start(const Options& options);
  Child() = default;
  ~Child();
  Child(Child&& o) noexcept : pid_(std::exchange(o.pid_, -1)) {}
  Child& operator=(Child&& o) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  // Ended? Without reaping (peekExit), or reaping it (then pid() is -1).
  std::optional<Exit> peek() const;
  std::optional<Exit> poll();
  // Waits for the end and reaps it.
  Exit wait();
  // Sends `sig` to the child (false when it has been reaped).
  bool signal(int sig) const;
  // SIGTERM, then SIGKILL when it has not ended within `grace`; reaped. Nothing when not
  // started or reaped already.
  std::optional<Exit> stop(std::chrono::milliseconds grace);

 private:
  explicit Child(pid_t pid) : pid_(pid) {}
  pid_t pid_ = -1;
};

}  // namespace hsdp::proc
