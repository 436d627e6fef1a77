// An etcd started for one job on this machine: the elastic protocol's default when no etcd
// endpoint is given, and the tests' coordinator. It is the real etcd (Debian's etcd-server), so
// the protocol runs unchanged on it; only the process is ours.
//
// start() runs `etcd` on 127.0.0.1 with two free ports (client and peer) and a private data
// directory under $TMPDIR, and returns once etcd answers /health. The destructor stops it
// (SIGTERM, then SIGKILL after a grace period) and removes the directory, also when a test fails
// with an exception or an assertion.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

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

 private:
  LocalEtcd() = default;
  std::string endpoint_;
  std::string dir_;
  proc::Child child_;  // etcd (core/subprocess.h)
};

}  // namespace hsdp::elastic
