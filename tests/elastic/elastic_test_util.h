// The elastic tests' fixture: a private etcd per test (elastic/local_etcd.h), skipped loudly
// when the etcd binary is absent.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "elastic/local_etcd.h"

namespace hsdp::elastic::testing {

// Why the elastic tests cannot run here (the etcd binary is absent), or "" when they can.
inline std::string missingEtcd() {
  auto binary = LocalEtcd::findBinary();
  if (binary.ok()) return "";
  return "\n*** SKIPPED: " + binary.status().message() +
         "\n*** the elastic tests need etcd (scripts/setup installs etcd-server)";
}

class WithEtcd : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = missingEtcd(); !why.empty()) GTEST_SKIP() << why;
    auto etcd = LocalEtcd::start();
    ASSERT_TRUE(etcd.ok()) << etcd.status().toString();
    etcd_ = std::move(*etcd);
  }
  std::unique_ptr<LocalEtcd> etcd_;
};

inline double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace hsdp::elastic::testing
