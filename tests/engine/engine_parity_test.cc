// The engine on device memory against the engine on host memory, in one process per rank: the
// same small model (units of odd sizes that do not divide the shard count) trained for a few
// steps on the host engine over an MPI mesh and on the device engine over an NCCL mesh with
// identical synthetic gradients, in every mode (none, zero1, zero2, zero3), fp32 and bf16
// policies, gradient accumulation, clipping, the rate limiter, CPU offload and hpZ; the
// parameters seen in forward and the final gathered parameters must agree.
//
// Why agreement is expected, and how close: gathers are copies (exact); the GPU Adam equals the
// CPU Adam bit for bit (cuda/kernels.h); the synthetic gradients are positive multiples of 1/4
// below 32, so every sum of them is exact in fp32 and bf16 in any order, and averaging over 2 or
// 4 ranks (a power of two) is exact too. What can differ: averaging over 3 ranks (NCCL multiplies
// by 1/3 before summing, MPI divides the sum: one rounding apart), and the gradient norm (summed
// in double in a different order, then rounded to float), which feeds the clipping factor. Each
// moves an Adam update by about one float ulp of lr, far below the 1e-6 relative tolerance. With
// bf16 reduction over 3 ranks the 1/3 rounding is a bf16 ulp of the gradient (2^-8 relative),
// which moves an update by up to ~0.4% of lr per step: those cases use a tolerance of 1e-3
// (lr = 1e-2, 3 steps). With bf16 parameters and inexact averaging, a master one float ulp apart
// can round to the neighbouring bf16 in the compute copy: forward views then get 1e-2.
//
// Without a device every test skips (exit 77 via gpu_test_main.cc).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "collectives/nccl/cuda_resources.h"
#include "hsdp/nccl.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"
#include "tests/common/gpu_test.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::world;

// The world over NCCL, built once (creation is collective) and destroyed before MPI_Finalize.
std::unique_ptr<Comm> g_nccl_world;

Comm* ncclWorld() {
  if (!g_nccl_world) {
    auto c = nccl::createNcclComm(world());
    EXPECT_TRUE(c.ok()) << c.status().toString();
    if (!c.ok()) return nullptr;
    g_nccl_world = std::move(*c);
  }
  return g_nccl_world.get();
}

class NcclWorldTeardown : public ::testing::Environment {
 public:
  void TearDown() override { g_nccl_world.reset(); }
};
const auto* const kTeardown = ::testing::AddGlobalTestEnvironment(new NcclWorldTeardown);

// Units with odd sizes: none divides 2, 3 or 4 shards evenly, one is smaller than the group.
std::vector<std::pair<std::string, std::vector<ParamSpec>>> model() {
  return {{"embed", {{"w", {37, 5}}, {"b", {37}}}},
          {"mid", {{"w", {11, 13}}, {"b", {13}}, {"gain", {1}}}},
          {"head", {{"w", {3}}}}};
}

float initValue(int unit, int param, size_t i) {
  return 0.01f * static_cast<float>(static_cast<int>((i * 13 + unit * 7 + param * 3) % 41) - 20);
}

// Positive multiples of 1/4, rank-dependent, at most 7 * 4 / 4 = 7 each: sums of up to 4 ranks
// and 3 micro-steps stay exact in fp32 and bf16.
float gradValue(int rank, int64_t step, int micro, int unit, int param, size_t i) {
  const int k = static_cast<int>((i * 7 + unit * 3 + param * 5 + step * 2 + micro) % 7);
  return 0.25f * static_cast<float>(1 + k) * static_cast<float>(1 + rank % 4);
}

struct Case {
  std::string name;
  EngineConfig cfg;
  int accum = 1;
  bool legacy_stream = false;  // run the device engine on the legacy default stream
  // The device engine's model keeps its own tensors: copyOutParams in forward, copyInGrads
  // (batched copy kernels) in backward; the host engine uses the views.
  bool copy_io = false;
};

// Every case on the meshes that matter most (`full`); a few on the other factor pairs, which
// keeps the whole binary well inside its ctest timeout with 4 ranks time-sharing one GPU.
std::vector<Case> cases(const MeshShape& s, bool full) {
  std::vector<Case> out;
  auto add = [&](std::string name, ShardMode mode, auto tweak, int accum = 1) {
    Case c;
    c.name = std::move(name);
    c.cfg.mode = mode;
    c.cfg.adam.kind = OptimizerKind::kAdamW;
    c.cfg.adam.lr = 1e-2f;
    c.cfg.adam.weight_decay = 0.01f;
    tweak(c);
    c.accum = accum;
    out.push_back(std::move(c));
  };
  auto none = [](Case&) {};
  auto clip = [](Case& c) { c.cfg.clip_norm = 5.0f; };
  auto bf16p = [](Case& c) { c.cfg.precision.param_dtype = DType::kBFloat16; };
  auto bf16r = [](Case& c) { c.cfg.precision.reduce_dtype = DType::kBFloat16; };
  auto bf16both = [](Case& c) {
    c.cfg.precision.param_dtype = DType::kBFloat16;
    c.cfg.precision.reduce_dtype = DType::kBFloat16;
  };
  if (s.shardGroupSize() == 1) {
    add("none", ShardMode::kNone, [](Case& c) { c.legacy_stream = true; });
    add("none.accum2.clip", ShardMode::kNone, clip, 2);
  }
  if (!full) {
    add("zero3", ShardMode::kZero3, none);
    add("zero1.accum2.clip", ShardMode::kZero1, clip, 2);
    add("zero2.bf16both", ShardMode::kZero2, bf16both);
    return out;
  }
  for (ShardMode mode : {ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3}) {
    const std::string m = shardModeName(mode);
    add(m, mode, none);
    add(m + ".accum3.clip", mode, clip, 3);
    add(m + ".bf16params", mode, bf16p);
    add(m + ".bf16grads", mode, bf16r);
    add(
        m + ".bf16both.accum2.clip", mode,
        [&](Case& c) {
          bf16both(c);
          clip(c);
        },
        2);
  }
  auto offload = [](Case& c) { c.cfg.offload.cpu = true; };
  add("zero1.offload", ShardMode::kZero1, offload);
  add(
      "zero3.offload.accum2.clip", ShardMode::kZero3,
      [&](Case& c) {
        offload(c);
        clip(c);
      },
      2);
  add("zero2.bf16both.offload", ShardMode::kZero2, [&](Case& c) {
    offload(c);
    bf16both(c);
  });
  auto copy_io = [](Case& c) { c.copy_io = true; };
  add("zero3.copyio", ShardMode::kZero3, copy_io);
  add("zero1.copyio.accum2", ShardMode::kZero1, copy_io, 2);
  add(
      "zero2.copyio.bf16params.accum3.clip", ShardMode::kZero2,
      [&](Case& c) {
        copy_io(c);
        bf16p(c);
        clip(c);
      },
      3);
  add("zero3.maxgathered1", ShardMode::kZero3,
      [](Case& c) { c.cfg.pipeline.max_gathered_units = 1; });
  add("zero3.adam.legacy_stream", ShardMode::kZero3, [](Case& c) {
    c.cfg.adam.kind = OptimizerKind::kAdam;
    c.legacy_stream = true;
  });
  if (s.intra_shard > 1 && s.inter_shard > 1) {
    add("zero3.hpz", ShardMode::kZero3, [](Case& c) { c.cfg.hpz = true; });
    add(
        "zero3.hpz.bf16both.accum2.clip", ShardMode::kZero3,
        [&](Case& c) {
          c.cfg.hpz = true;
          bf16both(c);
          clip(c);
        },
        2);
  }
  return out;
}

// What a run leaves: the first parameter of every unit as forward saw it in the last step, the
// gathered full parameters after the last step, and the last gradient norm.
struct Outcome {
  std::vector<std::vector<float>> forward_view;
  std::vector<std::vector<float>> full;
  float norm = 0;
  MemoryReport memory;
};

constexpr int kSteps = 3;

// Copies n floats the engine handed out to the host: device views on the compute stream.
std::vector<float> readView(const ParamView& v, bool device, cudaStream_t stream) {
  std::vector<float> out(v.numel);
  if (!device) {
    std::copy(v.data, v.data + v.numel, out.begin());
    return out;
  }
  EXPECT_EQ(
      cudaMemcpyAsync(out.data(), v.data, v.numel * sizeof(float), cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // test code: read it now
  return out;
}

void train(ShardedModel& m, bool device, cudaStream_t stream, const Case& c, int rank,
           Outcome* out) {
  const auto units = model();
  const int U = static_cast<int>(units.size());
  for (int u = 0; u < U; ++u) {
    for (size_t p = 0; p < units[u].second.size(); ++p) {
      const ParamSpec& spec = units[u].second[p];
      std::vector<float> v(spec.numel());
      for (size_t i = 0; i < v.size(); ++i) v[i] = initValue(u, static_cast<int>(p), i);
      ASSERT_OK(m.setParameter(u, spec.name, v.data(), v.size()));
    }
  }
  out->forward_view.assign(U, {});
  // copy_io: the model's own device tensors (first parameter of each unit; every gradient) and
  // the host staging of one micro-step's gradients.
  std::vector<gpu::DeviceBuffer> own_params;
  std::vector<std::vector<gpu::DeviceBuffer>> own_grads(U);
  std::vector<std::vector<std::vector<float>>> staged(U);
  if (device && c.copy_io) {
    for (int u = 0; u < U; ++u) {
      auto b = gpu::DeviceBuffer::allocate(units[u].second[0].numel() * 4);
      ASSERT_TRUE(b.ok()) << b.status().toString();
      own_params.push_back(std::move(*b));
      for (const ParamSpec& spec : units[u].second) {
        auto g = gpu::DeviceBuffer::allocate(spec.numel() * 4);
        ASSERT_TRUE(g.ok()) << g.status().toString();
        own_grads[u].push_back(std::move(*g));
        staged[u].emplace_back(spec.numel(), 0.0f);
      }
    }
  }
  for (int64_t step = 0; step < kSteps; ++step) {
    // Forward, prefetching the next unit.
    ASSERT_OK(m.unshard(0));
    for (int u = 0; u < U; ++u) {
      if (u + 1 < U) ASSERT_OK(m.unshard(u + 1));
      ASSERT_OK(m.waitForUnshard(u));
      auto view = m.param(u, units[u].second[0].name);
      ASSERT_TRUE(view.ok()) << view.status().toString();
      if (device && c.copy_io) {  // the model's own tensor, filled by the copy-out kernel
        const ParamSpec& spec = units[u].second[0];
        const TensorRef t{spec.name, own_params[u].as<float>(), spec.numel()};
        ASSERT_OK(m.copyOutParams(u, std::span<const TensorRef>(&t, 1)));
        out->forward_view[u] = readView(ParamView{t.data, spec.shape, t.numel}, device, stream);
      } else {
        out->forward_view[u] = readView(*view, device, stream);
      }
      ASSERT_OK(m.reshard(u));
    }
    // Backward, micro-steps accumulating; the host mirror `acc` is what the device gets.
    std::vector<std::vector<std::vector<float>>> acc(U);
    for (int u = 0; u < U; ++u)
      for (const ParamSpec& spec : units[u].second) acc[u].emplace_back(spec.numel(), 0.0f);
    for (int micro = 0; micro < c.accum; ++micro) {
      const bool last = micro + 1 == c.accum;
      ASSERT_OK(m.unshard(U - 1));
      for (int u = U - 1; u >= 0; --u) {
        if (u > 0) ASSERT_OK(m.unshard(u - 1));
        ASSERT_OK(m.waitForUnshard(u));
        if (device && c.copy_io) {
          // This micro-step's gradient in the model's own tensors, added in by the copy-in
          // kernel (one rounding per add, as the host engine's +=).
          std::vector<TensorRef> refs;
          for (size_t p = 0; p < units[u].second.size(); ++p) {
            const ParamSpec& spec = units[u].second[p];
            std::vector<float>& inc = staged[u][p];
            for (size_t i = 0; i < inc.size(); ++i)
              inc[i] = gradValue(rank, step, micro, u, static_cast<int>(p), i);
            ASSERT_EQ(cudaMemcpyAsync(own_grads[u][p].data(), inc.data(), inc.size() * 4,
                                      cudaMemcpyHostToDevice, stream),
                      cudaSuccess);
            refs.push_back({spec.name, own_grads[u][p].as<float>(), spec.numel()});
          }
          ASSERT_OK(m.copyInGrads(u, refs));
          ASSERT_OK(m.reshard(u));
          if (last) ASSERT_OK(m.reduceGrad(u));
          continue;
        }
        for (size_t p = 0; p < units[u].second.size(); ++p) {
          auto g = m.grad(u, units[u].second[p].name);
          ASSERT_TRUE(g.ok()) << g.status().toString();
          std::vector<float>& a = acc[u][p];
          for (size_t i = 0; i < a.size(); ++i)
            a[i] += gradValue(rank, step, micro, u, static_cast<int>(p), i);
          if (device) {
            // The running sum, as the host engine's += leaves it (same additions, same order).
            ASSERT_EQ(cudaMemcpyAsync(g->data, a.data(), a.size() * sizeof(float),
                                      cudaMemcpyHostToDevice, stream),
                      cudaSuccess);
          } else {
            for (size_t i = 0; i < a.size(); ++i)
              g->data[i] += gradValue(rank, step, micro, u, static_cast<int>(p), i);
          }
        }
        ASSERT_OK(m.reshard(u));
        if (last) ASSERT_OK(m.reduceGrad(u));
      }
      // `acc` is pageable memory read by cudaMemcpyAsync; keep the test free of doubt.
      if (device) ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    ASSERT_OK(m.step());
  }
  out->norm = m.lastGradNorm();
  out->full.assign(U, {});
  for (int u = 0; u < U; ++u) ASSERT_OK(m.gatherFullParameters(u, &out->full[u]));
  out->memory = m.memoryReport();
}

void expectClose(const std::vector<float>& host, const std::vector<float>& dev, double tol,
                 const std::string& what) {
  ASSERT_EQ(host.size(), dev.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    const double h = host[i], d = dev[i];
    if (std::fabs(h - d) > tol * std::max(1.0, std::fabs(h))) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: host " << h << " device " << d << " (diff "
                      << std::fabs(h - d) << ", tolerance " << tol << " relative)";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << host.size() << " elements differ";
}

void runParity(int ranks_per_node) {
  HSDP_REQUIRE_GPU();
  Comm& mpi = world();
  Comm* nccl_world = ncclWorld();
  ASSERT_NE(nccl_world, nullptr);
  auto layout = virtualNodeLayout(mpi.size(), ranks_per_node, "gpu-test");
  ASSERT_TRUE(layout.ok()) << layout.status().toString();
  // The engine's device is the communicators' device (HSDP_CUDA_DEVICE or local rank).
  const int device = dynamic_cast<nccl::NcclComm&>(*nccl_world).device();
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
  auto compute = gpu::Stream::create("test-compute");
  ASSERT_TRUE(compute.ok()) << compute.status().toString();

  for (int I = 1; I <= layout->ranks_per_node; ++I) {
    if (layout->ranks_per_node % I) continue;
    for (int J = 1; J <= layout->num_nodes; ++J) {
      if (layout->num_nodes % J) continue;
      auto host_mesh = Mesh::create(mpi, *layout, {I, J});
      ASSERT_TRUE(host_mesh.ok()) << host_mesh.status().toString();
      auto dev_mesh = Mesh::create(*nccl_world, *layout, {I, J});
      ASSERT_TRUE(dev_mesh.ok()) << dev_mesh.status().toString();
      const MeshShape& s = (*dev_mesh)->shape();
      const bool full = (J == 1 && I == layout->ranks_per_node) || (I > 1 && J > 1);
      for (const Case& c : cases(s, full)) {
        SCOPED_TRACE((*dev_mesh)->describe() + ", case " + c.name);
        Outcome host_out, dev_out;
        {
          auto m = ShardedModel::create(**host_mesh, c.cfg);
          ASSERT_TRUE(m.ok()) << m.status().toString();
          for (auto& [name, params] : model()) ASSERT_TRUE((*m)->addUnit(name, params).ok());
          ASSERT_OK((*m)->finalize());
          train(**m, false, nullptr, c, mpi.rank(), &host_out);
        }
        if (::testing::Test::HasFatalFailure()) return;
        {
          EngineConfig cfg = c.cfg;
          cfg.device = Device::kCuda;
          auto m = ShardedModel::create(**dev_mesh, cfg);
          ASSERT_TRUE(m.ok()) << m.status().toString();
          EXPECT_EQ((*m)->device(), Device::kCuda);
          EXPECT_FALSE((*m)->hierarchical());
          cudaStream_t stream = c.legacy_stream ? nullptr : compute->get();
          (*m)->setComputeStream(stream);
          for (auto& [name, params] : model()) ASSERT_TRUE((*m)->addUnit(name, params).ok());
          ASSERT_OK((*m)->finalize());
          train(**m, true, stream, c, mpi.rank(), &dev_out);
          EXPECT_GT(dev_out.memory.param_bytes, 0u);
          EXPECT_EQ(dev_out.memory.param_bytes, host_out.memory.param_bytes);
          EXPECT_EQ(dev_out.memory.optim_bytes, host_out.memory.optim_bytes);
        }
        if (::testing::Test::HasFatalFailure()) return;
        auto pow2 = [](int n) { return (n & (n - 1)) == 0; };
        const bool exact_avg = pow2(s.shardGroupSize()) && pow2(s.replicas());
        const bool loose = c.cfg.precision.reduce_dtype == DType::kBFloat16 && !exact_avg;
        const double tol = loose ? 1e-3 : 1e-6;
        // bf16 compute copies: a master one float ulp apart may round to the neighbouring bf16
        // (2^-8 relative) when averaging was not exact.
        const double view_tol =
            c.cfg.precision.param_dtype == DType::kBFloat16 && !exact_avg ? 1e-2 : tol;
        for (size_t u = 0; u < host_out.full.size(); ++u) {
          expectClose(host_out.full[u], dev_out.full[u], tol, "unit " + std::to_string(u));
          expectClose(host_out.forward_view[u], dev_out.forward_view[u], view_tol,
                      "forward view of unit " + std::to_string(u));
        }
        EXPECT_NEAR(host_out.norm, dev_out.norm, 1e-5 * std::max(1.0f, host_out.norm));
      }
    }
  }
}

// One node of all ranks: shard groups 1 .. world (mode none only with 1).
TEST(EngineOnDevice, MatchesHostEngineOneNode) { runParity(world().size()); }

// Two virtual nodes when the world is even: inter-node factors and hpZ (4 ranks: 2 x 2).
TEST(EngineOnDevice, MatchesHostEngineTwoNodes) {
  if (world().size() % 2 != 0 || world().size() < 4) GTEST_SKIP() << "needs an even world >= 4";
  runParity(world().size() / 2);
}

// Bad input on a device: an MPI mesh, named in the error; nothing collective happens first.
TEST(EngineOnDevice, RejectsMpiMesh) {
  HSDP_REQUIRE_GPU();
  Comm* nccl_world = ncclWorld();
  ASSERT_NE(nccl_world, nullptr);
  auto layout = virtualNodeLayout(world().size(), world().size(), "gpu-test");
  ASSERT_TRUE(layout.ok());
  auto mpi_mesh = Mesh::create(world(), *layout, {});
  ASSERT_TRUE(mpi_mesh.ok());
  EngineConfig cfg;
  cfg.device = Device::kCuda;
  auto m = ShardedModel::create(**mpi_mesh, cfg);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status().toString();
  EXPECT_NE(m.status().message().find("'mpi'"), std::string::npos) << m.status().message();
}

}  // namespace
}  // namespace hsdp
