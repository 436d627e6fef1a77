#include "elastic/local_etcd.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "elastic/etcd_client.h"
#include "hsdp/files.h"

extern char** environ;

namespace hsdp::elastic {
namespace {

// A port the kernel has free now (bound to 0, read back, closed). Another process may take it
// before etcd binds it: start() then fails and tries again with new ports.
StatusOr<int> freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return internalError("socket: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc == 0) rc = ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int err = errno;
  ::close(fd);
  if (rc != 0) return internalError("binding a free port on 127.0.0.1: ", std::strerror(err));
  return static_cast<int>(ntohs(addr.sin_port));
}

// The end of etcd's log (for an error message), read through the file layer.
std::string tail(const std::string& path, size_t bytes) {
  StatusOr<std::string> s = files::readBounded(path, 64ull << 20, "etcd's log");
  if (!s.ok()) return s.status().message();
  return s->size() > bytes ? s->substr(s->size() - bytes) : *s;
}

}  // namespace

StatusOr<std::string> LocalEtcd::findBinary(const std::string& binary) {
  if (binary.find('/') != std::string::npos) {
    if (::access(binary.c_str(), X_OK) == 0) return binary;
    return notFound("etcd binary '", binary, "' is not an executable file");
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + binary;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return notFound("etcd binary '", binary,
                  "' is not in PATH (Debian: apt-get install etcd-server)");
}

StatusOr<std::unique_ptr<LocalEtcd>> LocalEtcd::start(Options options) {
  HSDP_ASSIGN_OR_RETURN(std::string binary, findBinary(options.binary));
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::unique_ptr<LocalEtcd> etcd(new LocalEtcd());
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/hsdp-etcd-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr)
      return internalError("mkdtemp '", templ, "': ", std::strerror(errno));
    etcd->dir_ = buf.data();
    HSDP_ASSIGN_OR_RETURN(int client_port, freePort());
    HSDP_ASSIGN_OR_RETURN(int peer_port, freePort());
    etcd->endpoint_ = strCat("http://127.0.0.1:", client_port);
    std::string peer = strCat("http://127.0.0.1:", peer_port);
    std::string log = etcd->dir_ + "/etcd.log";
    std::vector<std::string> args = {binary,
                                     "--name=hsdp",
                                     "--data-dir=" + etcd->dir_ + "/data",
                                     "--listen-client-urls=" + etcd->endpoint_,
                                     "--advertise-client-urls=" + etcd->endpoint_,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=hsdp=" + peer,
                                     "--log-outputs=stderr"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // fork + exec rather than posix_spawn: the child asks for SIGKILL when its parent dies
    // (PR_SET_PDEATHSIG), so an etcd is never left running by a launcher or test that was
    // itself killed with SIGKILL. Between fork and exec only async-signal-safe calls.
    const pid_t parent = ::getpid();
    const char* log_path = log.c_str();
    const char* bin = binary.c_str();
    pid_t pid = ::fork();
    if (pid < 0) return internalError("starting '", binary, "': fork: ", std::strerror(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
      // A new file in the directory mkdtemp just made (0700, ours): never an existing one.
      int out = ::open(log_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
      int in = ::open("/dev/null", O_RDONLY);
      if (out < 0 || in < 0 || ::dup2(out, 1) < 0 || ::dup2(out, 2) < 0 || ::dup2(in, 0) < 0)
        ::_exit(127);
      ::execv(bin, argv.data());
      ::_exit(127);
    }
    etcd->pid_ = pid;

    EtcdClient::Options copt;
    copt.timeout_ms = 1000;
    HSDP_ASSIGN_OR_RETURN(auto client, EtcdClient::create(etcd->endpoint_, copt));
    auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(options.start_timeout_ms);
    bool exited = false;
    while (std::chrono::steady_clock::now() < deadline) {
      int wstatus = 0;
      if (::waitpid(pid, &wstatus, WNOHANG) == pid) {
        etcd->pid_ = -1;
        exited = true;
        break;
      }
      auto r = client->get("/hsdp-health");  // a linearizable read: etcd serves and has a leader
      if (r.ok()) return etcd;
      last = r.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::string why = exited ? "exited"
                             : strCat("did not answer within ", options.start_timeout_ms, " ms (",
                                      last.message(), ")");
    last = internalError("local etcd '", binary, "' on ", etcd->endpoint_, " ", why,
                         "; its log ends: ", tail(log, 600));
    // etcd's destructor stops it and removes the directory; ports taken: try new ones.
  }
  return last;
}

void LocalEtcd::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  for (int i = 0; i < 100; ++i) {  // 5 s of grace
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

LocalEtcd::~LocalEtcd() {
  stop();
  if (!dir_.empty()) {
    // Only the directory this object made, through the file layer: its tree is removed without
    // following a symbolic link inside it. Best effort in a destructor.
    StatusOr<files::PathParts> parts = files::splitPath(dir_);
    if (parts.ok()) {
      StatusOr<files::Dir> parent = files::Dir::open(parts->dir);
      if (parent.ok()) (void)parent->removeTree(parts->name);
    }
  }
}

}  // namespace hsdp::elastic
