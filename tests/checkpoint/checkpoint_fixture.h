// The fixture of checkpoint_test (checkpoint_test.cc, checkpoint_export_test.cc): a scratch
// directory shared by every rank (removed after each test), meshes of this job's node layout,
// the engine settings of a case, and the helpers the tests compare with.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "hsdp/mesh.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp::ckpttest {

using testing::world;

inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  const char* name;
  ShardMode mode;
  int intra, inter;  // 0: all ranks of a node / all nodes
  bool hpz = false;
  DType param_dtype = DType::kFloat32, reduce_dtype = DType::kFloat32;
  int accum = 1;
  float clip = 0;
  bool offload = false;
  bool async = false;
};

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = sharedTempDir(world());
    ASSERT_FALSE(dir_.empty());
    auto l = groupRanksIntoNodes(world());
    ASSERT_TRUE(l.ok());
    layout_ = *l;
  }
  void TearDown() override {
    (void)world().barrier();
    if (world().rank() == 0) std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<Mesh> mesh(int intra, int inter) {
    auto m = Mesh::create(
        world(), layout_,
        {intra == 0 ? layout_.ranks_per_node : intra, inter == 0 ? layout_.num_nodes : inter});
    EXPECT_TRUE(m.ok()) << m.status().toString();
    return m.ok() ? std::move(*m) : nullptr;
  }
  static EngineConfig config(const Case& c) {
    EngineConfig cfg;
    cfg.mode = c.mode;
    cfg.adam.lr = 0.01f;
    cfg.adam.weight_decay = 0.1f;
    cfg.adam.eps = 1e-5f;
    cfg.hpz = c.hpz;
    cfg.precision.param_dtype = c.param_dtype;
    cfg.precision.reduce_dtype = c.reduce_dtype;
    cfg.clip_norm = c.clip;
    cfg.offload.cpu = c.offload;
    return cfg;
  }
  std::string dir_;
  NodeLayout layout_;
};

inline std::vector<std::vector<float>> gatherAll(ShardedModel& m) {
  std::vector<std::vector<float>> v(m.numUnits());
  for (int u = 0; u < m.numUnits(); ++u) EXPECT_TRUE(m.gatherFullParameters(u, &v[u]).ok());
  return v;
}

}  // namespace hsdp::ckpttest
