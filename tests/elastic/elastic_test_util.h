// The elastic tests' fixture: a private etcd per test (elastic/local_etcd.h), skipped loudly
// when the etcd binary is absent.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "elastic/local_etcd.h"

namespace hsdp::elastic::testing {

class WithEtcd : public ::testing::Test {
 protected:
  void SetUp() override {
    auto binary = LocalEtcd::findBinary();
    if (!binary.ok()) {
      GTEST_SKIP() << "\n*** SKIPPED: " << binary.status().message()
                   << "\n*** the elastic tests need etcd (scripts/setup installs etcd-server)";
    }
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
