// An etcd started for one job on this machine: the elastic protocol's default when no etcd
// endpoint is given, and the tests' coordinator. It is the real etcd (Debian's etcd-server), so
// the protocol runs unchanged on it; only the process is ours.
//
// start() runs `etcd` on 127.0.0.1 with two free ports (client and peer) and a private data
// directory (under HSDP_ETCD_DIR, else /dev/shm, else $TMPDIR: local_etcd.cc), and returns once
// etcd answers /health. The destructor stops it (SIGTERM, then SIGKILL after a grace period) and
// removes the directory, also when a test fails with an exception or an assertion.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "core/subprocess.h"
#include "hsdp/status.h"

namespace hsdp::elastic {

class LocalEtcd {
 public:
  struct Options {
    std::string binary = "etcd";  // looked up in PATH when it has no '/'
    int64_t start_timeout_ms = 15000;
  };
  // The path of `binary` (PATH lookup), or NotFound naming it.
  static StatusOr<std::string> findBinary(const std::string& binary = "etcd");
  static StatusOr<std::unique_ptr<LocalEtcd>> start(Options options);
  static StatusOr<std::unique_ptr<LocalEtcd>> start() { return start(Options{}); }
  ~LocalEtcd();
  LocalEtcd(const LocalEtcd&) = delete;
  LocalEtcd& operator=(const LocalEtcd&) = delete;

  // "http://127.0.0.1:<client port>".
  const std::string& endpoint() const { return endpoint_; }
  const std::string& dataDir() const { return dir_; }
  pid_t pid() const { return child_.pid(); }
  // Stops etcd now (the coordinator lost); the directory stays until destruction.
  void stop();
  // SIGKILL now (a member lost without a goodbye); the directory stays until destruction.
  void kill();

 private:
  friend class LocalEtcdCluster;
  LocalEtcd() = default;
  // A private directory (see etcdBase() in local_etcd.cc) for a new (not yet started) member.
  static StatusOr<std::unique_ptr<LocalEtcd>> prepare();
  // Runs etcd as member `name` of `initial_cluster` ("name=peer-url,..."), with `peer` its own.
  Status spawn(const std::string& binary, const std::string& name, const std::string& peer,
               const std::string& initial_cluster);
  // Until this member answers a linearizable read (or exits, or `timeout_ms` passes).
  Status waitReady(const std::string& binary, int64_t timeout_ms);
  std::string endpoint_;
  std::string dir_;
  proc::Child child_;  // etcd (core/subprocess.h)
};

}  // namespace hsdp::elastic

namespace hsdp::elastic {

// A cluster of etcd members on 127.0.0.1 for tests (docs/elastic.md, "The etcd cluster"): each a
// LocalEtcd with its own client and peer port and directory, started together with one
// --initial-cluster; start() returns once every member answers a linearizable read (a leader is
// elected). endpoint() is the comma list the client and hsdp-elastic take. Destruction stops
// every member that is still running and removes the directories.
class LocalEtcdCluster {
 public:
  static StatusOr<std::unique_ptr<LocalEtcdCluster>> start(int members, LocalEtcd::Options options);
  static StatusOr<std::unique_ptr<LocalEtcdCluster>> start(int members) {
    return start(members, LocalEtcd::Options{});
  }
  const std::string& endpoint() const { return endpoint_; }
  int size() const { return static_cast<int>(members_.size()); }
  LocalEtcd& member(int i) { return *members_.at(static_cast<size_t>(i)); }

 private:
  LocalEtcdCluster() = default;
  std::string endpoint_;
  std::vector<std::unique_ptr<LocalEtcd>> members_;
};

}  // namespace hsdp::elastic
