// The device choice of the engine, on the CPU side (no GPU needed): parsing and naming, and the
// errors of ShardedModel::create for a device engine that cannot run here. A device engine over
// an MPI mesh is bad input on every build; Device::kCuda in a build without CUDA says so.
#include <gtest/gtest.h>

#include <string>

#include "hsdp/sharded_model.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::world;

TEST(DeviceConfig, ParseAndName) {
  auto cpu = parseDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, Device::kHost);
  auto cuda = parseDevice("cuda");
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(*cuda, Device::kCuda);
  EXPECT_STREQ(deviceName(Device::kHost), "cpu");
  EXPECT_STREQ(deviceName(Device::kCuda), "cuda");
  for (const char* bad : {"gpu", "CUDA", "", "host"}) {
    auto d = parseDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << d.status().message();
  }
  EXPECT_EQ(EngineConfig{}.device, Device::kHost);  // the default is unchanged host behaviour
}

// The default mesh over the MPI world; null (with the failure recorded) if it cannot be built,
// so no test reads a StatusOr that holds an error.
std::unique_ptr<Mesh> mpiMesh() {
  auto l = groupRanksIntoNodes(world());
  if (!l.ok()) {
    ADD_FAILURE() << l.status().toString();
    return nullptr;
  }
  auto mesh = Mesh::create(world(), *l, {});
  if (!mesh.ok()) {
    ADD_FAILURE() << mesh.status().toString();
    return nullptr;
  }
  return std::move(*mesh);
}

// Every rank gets the same error, before any collective: nothing can hang.
TEST(DeviceConfig, CudaOverAnMpiMeshIsRejected) {
  std::unique_ptr<Mesh> mesh = mpiMesh();
  ASSERT_NE(mesh, nullptr);
  for (ShardMode mode : {ShardMode::kNone, ShardMode::kZero1, ShardMode::kZero3}) {
    if (mode == ShardMode::kNone && mesh->shape().shardGroupSize() != 1) continue;
    EngineConfig cfg;
    cfg.mode = mode;
    cfg.device = Device::kCuda;
    auto model = ShardedModel::create(*mesh, cfg);
    ASSERT_FALSE(model.ok());
#if defined(HSDP_HAVE_CUDA)
    EXPECT_EQ(model.status().code(), StatusCode::kInvalidArgument) << model.status().toString();
    EXPECT_NE(model.status().message().find("'mpi'"), std::string::npos)
        << model.status().message();
    EXPECT_NE(model.status().message().find("nccl"), std::string::npos) << model.status().message();
#else
    EXPECT_EQ(model.status().code(), StatusCode::kFailedPrecondition) << model.status().toString();
    EXPECT_NE(model.status().message().find("built without CUDA"), std::string::npos)
        << model.status().message();
#endif
  }
}

TEST(DeviceConfig, HostEngineIgnoresTheComputeStream) {
  std::unique_ptr<Mesh> mesh = mpiMesh();
  ASSERT_NE(mesh, nullptr);
  auto model = ShardedModel::create(*mesh, {});
  ASSERT_TRUE(model.ok()) << model.status().toString();
  EXPECT_EQ((*model)->device(), Device::kHost);
  int not_a_stream = 0;
  (*model)->setComputeStream(&not_a_stream);  // never dereferenced on the host
  ASSERT_TRUE((*model)->addUnit("u", {{"w", {7}}}).ok());
  ASSERT_TRUE((*model)->finalize().ok());
}

}  // namespace
}  // namespace hsdp
