#include "elastic/local_etcd.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "core/socket.h"
#include "elastic/etcd_client.h"
#include "hsdp/env.h"
#include "hsdp/files.h"

namespace hsdp::elastic {
namespace {

// A port the kernel has free now (bound to 0, read back, closed). Another process may take it
// before etcd binds it: start() then fails and tries again with new ports.
StatusOr<int> freePort() {
  StatusOr<net::Listening> l = net::listenOn(net::ipv4(htonl(INADDR_LOOPBACK), 0), 1);
  if (!l.ok()) return l.status().withContext("a free port on 127.0.0.1");
  return l->port;
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

namespace {
const env::StringParam kEtcdDir{
    "HSDP_ETCD_DIR", env::StringParam::Kind::kString, "",
    "Directory under which a job-local etcd (hsdp-elastic without --endpoint, and the tests') "
    "makes its private data directory. Unset: /dev/shm when it is a writable directory (tmpfs: "
    "etcd syncs its log on every write, and a job-local etcd's data never outlives its job), "
    "else $TMPDIR, else /tmp."};

// Where prepare() makes its directory (kEtcdDir's doc says why tmpfs first).
std::string etcdBase() {
  const std::string set = kEtcdDir.get();
  if (!set.empty()) return set;
  if (::access("/dev/shm", W_OK | X_OK) == 0) return "/dev/shm";
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp ? tmp : "/tmp";
}

}  // namespace

StatusOr<std::unique_ptr<LocalEtcd>> LocalEtcd::prepare() {
  std::unique_ptr<LocalEtcd> etcd(new LocalEtcd());
  std::string templ = etcdBase() + "/hsdp-etcd-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) {
    const std::string why = std::strerror(errno);
    if (!kEtcdDir.get().empty())  // the user's choice: named as such
      return invalidArgument("HSDP_ETCD_DIR='", kEtcdDir.get(),
                             "': no private directory for the local etcd there (", why, ")");
    return internalError("mkdtemp '", templ, "': ", why);
  }
  etcd->dir_ = buf.data();
  HSDP_ASSIGN_OR_RETURN(int client_port, freePort());
  etcd->endpoint_ = strCat("http://127.0.0.1:", client_port);
  return etcd;
}

Status LocalEtcd::spawn(const std::string& binary, const std::string& name, const std::string& peer,
                        const std::string& initial_cluster) {
  // --pre-vote: a member back from a cut asks before it campaigns, so it does not depose a
  // leader the others still follow (etcd 3.4's default is off).
  std::vector<std::string> args = {binary,
                                   "--name=" + name,
                                   "--data-dir=" + dir_ + "/data",
                                   "--listen-client-urls=" + endpoint_,
                                   "--advertise-client-urls=" + endpoint_,
                                   "--listen-peer-urls=" + peer,
                                   "--initial-advertise-peer-urls=" + peer,
                                   "--initial-cluster=" + initial_cluster,
                                   "--initial-cluster-state=new",
                                   "--pre-vote=true",
                                   "--log-outputs=stderr"};
  // etcd gets SIGKILL when its parent dies, so it is never left running by a launcher or test
  // that was itself killed with SIGKILL. It stays in this process's group: a terminal's
  // signals reach it as they reach its parent.
  proc::Options popt;
  popt.argv = std::move(args);
  popt.death_signal = SIGKILL;
  popt.group = proc::Options::Group::kInherit;
  popt.output = dir_ + "/etcd.log";  // a new file in the directory mkdtemp just made (0700, ours)
  HSDP_ASSIGN_OR_RETURN(child_, proc::Child::start(popt));
  return okStatus();
}

Status LocalEtcd::waitReady(const std::string& binary, int64_t timeout_ms) {
  EtcdClient::Options copt;
  copt.timeout_ms = 1000;
  HSDP_ASSIGN_OR_RETURN(auto client, EtcdClient::create(endpoint_, copt));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool exited = false;
  Status last;
  while (std::chrono::steady_clock::now() < deadline) {
    if (child_.poll()) {
      exited = true;
      break;
    }
    auto r = client->get("/hsdp-health");  // a linearizable read: etcd serves and has a leader
    if (r.ok()) return okStatus();
    last = r.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string why =
      exited ? "exited"
             : strCat("did not answer within ", timeout_ms, " ms (", last.message(), ")");
  return internalError("local etcd '", binary, "' on ", endpoint_, " ", why,
                       "; its log ends: ", tail(dir_ + "/etcd.log", 600));
}

StatusOr<std::unique_ptr<LocalEtcd>> LocalEtcd::start(Options options) {
  HSDP_ASSIGN_OR_RETURN(std::string binary, findBinary(options.binary));
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    HSDP_ASSIGN_OR_RETURN(std::unique_ptr<LocalEtcd> etcd, prepare());
    HSDP_ASSIGN_OR_RETURN(int peer_port, freePort());
    std::string peer = strCat("http://127.0.0.1:", peer_port);
    HSDP_RETURN_IF_ERROR(etcd->spawn(binary, "hsdp", peer, "hsdp=" + peer));
    last = etcd->waitReady(binary, options.start_timeout_ms);
    if (last.ok()) return etcd;
    // etcd's destructor stops it and removes the directory; ports taken: try new ones.
  }
  return last;
}

StatusOr<std::unique_ptr<LocalEtcdCluster>> LocalEtcdCluster::start(int members,
                                                                    LocalEtcd::Options options) {
  if (members < 1 || members > 9)
    return invalidArgument("an etcd cluster of ", members, " members (want 1..9)");
  HSDP_ASSIGN_OR_RETURN(std::string binary, LocalEtcd::findBinary(options.binary));
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::unique_ptr<LocalEtcdCluster> c(new LocalEtcdCluster());
    std::vector<std::string> peers;
    std::string initial;
    for (int i = 0; i < members; ++i) {
      HSDP_ASSIGN_OR_RETURN(std::unique_ptr<LocalEtcd> m, LocalEtcd::prepare());
      HSDP_ASSIGN_OR_RETURN(int peer_port, freePort());
      peers.push_back(strCat("http://127.0.0.1:", peer_port));
      initial += strCat(i == 0 ? "" : ",", "m", i, "=", peers.back());
      c->endpoint_ += (i == 0 ? "" : ",") + m->endpoint();
      c->members_.push_back(std::move(m));
    }
    for (int i = 0; i < members; ++i)
      HSDP_RETURN_IF_ERROR(c->members_[i]->spawn(binary, strCat("m", i), peers[i], initial));
    last = okStatus();
    for (int i = 0; i < members && last.ok(); ++i)
      last = c->members_[i]->waitReady(binary, options.start_timeout_ms);
    if (last.ok()) return c;
  }
  return last;
}

void LocalEtcd::stop() { (void)child_.stop(std::chrono::seconds(5)); }

void LocalEtcd::kill() {
  if (child_.signal(SIGKILL)) (void)child_.wait();
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
