// The engine's inter wires (EngineConfig::wires.inter_param_wire, inter_grad_wire, replica_wire),
// under mpirun where the layout has several (virtual) nodes, against closed forms:
//  - the configuration: HSDP_INTER_DTYPE as the shorthand of both inter wires, each wire's own
//    variable, the block size and error feedback, malformed values named;
//  - what the engine refuses, before anything is allocated;
//  - zero3 with an int8 parameter wire: every gather (before and after steps, with and without
//    CPU offload) holds exactly decode(encode(shard k)) of the exact fp32 master shards, which an
//    exact gather (gatherFullParameters) returns;
//  - an encoded replica wire (zero3 replicated across nodes, and mode none): every replica holds
//    bitwise the same parameters after the step, and the reduced gradient's norm is within 1%
//    of the fp32 wire's.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "collectives/mpi/mpi_comm.h"
#include "hsdp/quantize.h"
#include "hsdp/sharded_model.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::world;

MPI_Comm raw(Comm& c) { return dynamic_cast<mpi::MpiComm&>(c).raw(); }

std::unique_ptr<Mesh> meshOf(int intra, int inter) {
  auto l = groupRanksIntoNodes(world());
  EXPECT_TRUE(l.ok());
  auto m = Mesh::create(
      world(), *l, {intra == 0 ? l->ranks_per_node : intra, inter == 0 ? l->num_nodes : inter});
  EXPECT_TRUE(m.ok()) << m.status().toString();
  return m.ok() ? std::move(*m) : nullptr;
}

bool severalNodes() {
  auto l = groupRanksIntoNodes(world());
  return l.ok() && l->num_nodes > 1;
}

const std::vector<size_t> kUnitSizes = {5000, 3001};

// Two units, registered, finalized, with deterministic values.
std::unique_ptr<ShardedModel> build(const Mesh& mesh, const EngineConfig& cfg) {
  auto m = ShardedModel::create(mesh, cfg);
  EXPECT_TRUE(m.ok()) << m.status().toString();
  if (!m.ok()) return nullptr;
  for (size_t u = 0; u < kUnitSizes.size(); ++u)
    EXPECT_TRUE((*m)->addUnit("u" + std::to_string(u), {{"w", {int64_t(kUnitSizes[u])}}}).ok());
  EXPECT_TRUE((*m)->finalize().ok());
  for (size_t u = 0; u < kUnitSizes.size(); ++u) {
    std::vector<float> v(kUnitSizes[u]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * float(i) + u) * (1 + i % 7);
    EXPECT_TRUE((*m)->setParameter(int(u), "w", v.data(), v.size()).ok());
  }
  return std::move(*m);
}

// One step with rank-dependent gradients.
void step(ShardedModel& m) {
  for (int u = 0; u < m.numUnits(); ++u) {
    auto g = m.grad(u, "w");
    ASSERT_TRUE(g.ok()) << g.status().toString();
    for (size_t i = 0; i < g->numel; ++i)
      g->data[i] = std::cos(0.11f * float(i) * float(world().rank() + 1)) * float(1 + i % 5);
    ASSERT_TRUE(m.reduceGrad(u).ok());
  }
  ASSERT_TRUE(m.step().ok());
}

TEST(EngineWires, ConfigFieldsAndTheirEnvironmentVariables) {
  for (const char* v : {"HSDP_INTER_DTYPE", "HSDP_INTER_PARAM_WIRE", "HSDP_INTER_GRAD_WIRE",
                        "HSDP_REPLICA_WIRE", "HSDP_QUANT_BLOCK", "HSDP_GRAD_ERROR_FEEDBACK"})
    unsetenv(v);
  auto d = resolveEngineConfig({});
  ASSERT_TRUE(d.ok()) << d.status().toString();
  EXPECT_EQ(*d->wires.inter_param_wire, Wire::kFp32);
  EXPECT_EQ(*d->wires.inter_grad_wire, Wire::kFp32);
  EXPECT_EQ(*d->wires.replica_wire, Wire::kFp32);
  EXPECT_EQ(*d->wires.quant_block, kDefaultQuantBlock);
  EXPECT_TRUE(*d->wires.grad_error_feedback);
  setenv("HSDP_INTER_DTYPE", "bf16", 1);  // the shorthand: both inter wires
  auto a = resolveEngineConfig({});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a->wires.inter_param_wire, Wire::kBf16);
  EXPECT_EQ(*a->wires.inter_grad_wire, Wire::kBf16);
  EXPECT_EQ(*a->wires.replica_wire, Wire::kFp32);
  setenv("HSDP_INTER_GRAD_WIRE", "int8", 1);  // a wire's own variable wins over the shorthand
  setenv("HSDP_QUANT_BLOCK", "512", 1);
  setenv("HSDP_GRAD_ERROR_FEEDBACK", "0", 1);
  auto b = resolveEngineConfig({});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b->wires.inter_param_wire, Wire::kBf16);
  EXPECT_EQ(*b->wires.inter_grad_wire, Wire::kInt8);
  EXPECT_EQ(*b->wires.quant_block, 512u);
  EXPECT_FALSE(*b->wires.grad_error_feedback);
  EngineConfig given;  // fields given win over every variable
  given.wires.inter_param_wire = Wire::kInt4;
  given.wires.inter_grad_wire = Wire::kFp32;
  given.wires.quant_block = 64;
  given.wires.grad_error_feedback = true;
  auto c = resolveEngineConfig(given);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c->wires.inter_param_wire, Wire::kInt4);
  EXPECT_EQ(*c->wires.inter_grad_wire, Wire::kFp32);
  EXPECT_EQ(*c->wires.quant_block, 64u);
  EXPECT_TRUE(*c->wires.grad_error_feedback);
  setenv("HSDP_REPLICA_WIRE", "fp8", 1);
  auto bad = resolveEngineConfig({});
  EXPECT_NE(bad.status().message().find("HSDP_REPLICA_WIRE='fp8'"), std::string::npos)
      << bad.status().toString();
  unsetenv("HSDP_REPLICA_WIRE");
  setenv("HSDP_QUANT_BLOCK", "24", 1);
  auto blk = resolveEngineConfig({});
  EXPECT_NE(blk.status().message().find("HSDP_QUANT_BLOCK=24"), std::string::npos)
      << blk.status().toString();
  given.wires.quant_block = 8;
  auto blk2 = resolveEngineConfig(given);
  EXPECT_NE(blk2.status().message().find("EngineConfig::wires.quant_block=8"), std::string::npos);
  for (const char* v :
       {"HSDP_INTER_DTYPE", "HSDP_INTER_GRAD_WIRE", "HSDP_QUANT_BLOCK", "HSDP_GRAD_ERROR_FEEDBACK"})
    unsetenv(v);
}

TEST(EngineWires, UnsupportedCombinationsAreNamed) {
  if (!severalNodes()) GTEST_SKIP() << "needs more than one (virtual) node";
  auto mesh = meshOf(0, 0);
  auto refused = [&](EngineConfig cfg, const char* want) {
    auto m = ShardedModel::create(*mesh, cfg);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find(want), std::string::npos) << m.status().toString();
  };
  EngineConfig cfg;
  cfg.wires.inter_param_wire = Wire::kInt8;
  cfg.mode = ShardMode::kZero2;
  refused(cfg, "needs mode zero3");
  cfg.mode = ShardMode::kZero3;
  cfg.precision.param_dtype = DType::kBFloat16;
  refused(cfg, "param_dtype bf16");
  cfg.precision.param_dtype = DType::kFloat32;
  cfg.pipeline.hierarchical = false;
  refused(cfg, "hierarchical schedules");
  EngineConfig grads;
  grads.wires.inter_grad_wire = Wire::kInt4;
  grads.precision.reduce_dtype = DType::kBFloat16;
  refused(grads, "reduce_dtype bf16");
  // Nothing crosses nodes with inter_shard 1: accepted, nothing quantized.
  auto inside = meshOf(0, 1);
  EngineConfig z2;
  z2.mode = ShardMode::kZero2;
  z2.wires.inter_param_wire = Wire::kInt8;
  EXPECT_TRUE(ShardedModel::create(*inside, z2).ok());
}

// Every gathered unit is decode(encode(shard k)) of the exact masters, shard by shard.
void expectGathersDecodeTheMasters(ShardedModel& m, const WireFormat& w) {
  const int S = m.shardCount();
  for (int u = 0; u < m.numUnits(); ++u) {
    std::vector<float> exact;
    ASSERT_TRUE(m.gatherFullParameters(u, &exact).ok());
    const FlatLayout& l = m.layout(u);
    const size_t n = l.shardNumel();
    std::vector<float> padded(S * n, 0.0f), want(S * n);
    std::copy(exact.begin(), exact.end(), padded.begin());
    std::vector<unsigned char> enc(encodedBytes(w, n));
    for (int k = 0; k < S; ++k) {
      wireEncode(w, padded.data() + k * n, n, enc.data());
      wireDecode(w, enc.data(), n, want.data() + k * n);
    }
    for (int round = 0; round < 2; ++round) {  // zero3's forward and backward gathers alike
      ASSERT_TRUE(m.unshard(u).ok());
      ASSERT_TRUE(m.waitForUnshard(u).ok());
      auto p = m.param(u, "w");
      ASSERT_TRUE(p.ok());
      ASSERT_EQ(0, std::memcmp(p->data, want.data(), p->numel * sizeof(float)))
          << "unit " << u << " round " << round;
      ASSERT_TRUE(m.reshard(u).ok());
    }
    bool differs = false;  // the wire is really used: some value is not the exact master
    for (size_t i = 0; i < exact.size(); ++i) differs |= want[i] != exact[i];
    EXPECT_TRUE(differs);
  }
}

TEST(EngineWires, Zero3GathersDecodeTheEncodedMasterShard) {
  if (!severalNodes()) GTEST_SKIP() << "needs more than one (virtual) node";
  auto mesh = meshOf(0, 0);
  for (bool offload : {false, true}) {
    SCOPED_TRACE(offload ? "offload" : "no offload");
    EngineConfig cfg;
    cfg.wires.inter_param_wire = Wire::kInt8;
    cfg.wires.inter_grad_wire = Wire::kInt8;
    cfg.wires.quant_block = 256;
    cfg.offload.cpu = offload;
    auto m = build(*mesh, cfg);
    ASSERT_TRUE(m);
    const WireFormat w{Wire::kInt8, 256};
    expectGathersDecodeTheMasters(*m, w);
    for (int s = 0; s < 2; ++s) {
      step(*m);
      expectGathersDecodeTheMasters(*m, w);  // re-encoded after each step
    }
  }
}

// Every rank's exact parameters, hashed and compared across the world: replicas identical.
void expectIdenticalEverywhere(ShardedModel& m) {
  for (int u = 0; u < m.numUnits(); ++u) {
    std::vector<float> p;
    ASSERT_TRUE(m.gatherFullParameters(u, &p).ok());
    std::vector<float> root = p;
    MPI_Bcast(root.data(), int(root.size()), MPI_FLOAT, 0, raw(world()));
    int same = std::memcmp(root.data(), p.data(), p.size() * sizeof(float)) == 0, all = 0;
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, raw(world()));
    EXPECT_TRUE(all) << "unit " << u << " differs between ranks";
  }
}

TEST(EngineWires, EncodedReplicaWireKeepsReplicasIdentical) {
  if (!severalNodes()) GTEST_SKIP() << "needs more than one (virtual) node";
  // zero3 inside the node, replicated across nodes; and mode none (the world).
  for (auto [mode, intra] : {std::pair{ShardMode::kZero3, 0}, std::pair{ShardMode::kNone, 1}}) {
    auto mesh = meshOf(intra, 1);
    SCOPED_TRACE(strCat(shardModeName(mode), " ", mesh->describe()));
    float norms[2] = {0, 0};
    for (Wire w : {Wire::kFp32, Wire::kInt8}) {
      EngineConfig cfg;
      cfg.mode = mode;
      cfg.wires.replica_wire = w;
      auto m = build(*mesh, cfg);
      ASSERT_TRUE(m);
      step(*m);
      norms[w == Wire::kInt8] = m->lastGradNorm();
      step(*m);  // error feedback carried into a second step
      expectIdenticalEverywhere(*m);
    }
    EXPECT_NEAR(norms[1], norms[0], 0.01 * norms[0]);
  }
}

}  // namespace
}  // namespace hsdp
