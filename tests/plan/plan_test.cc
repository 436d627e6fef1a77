// The planning arithmetic against cases computed by hand (the numbers in the comments are the
// hand computation; the formulas are in include/hsdp/plan.h).
#include "hsdp/plan.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tests/plan/xml_check.h"

namespace hsdp {
namespace {

constexpr uint64_t kPsi = 7'500'000'000;

Plan mustPlan(const PlanInput& in) {
  auto p = makePlan(in);
  EXPECT_TRUE(p.ok()) << p.status().toString();
  return p.ok() ? *p : Plan{};
}

PlanInput input(std::vector<uint64_t> units, int nodes, int gpus, int I, int J, ShardMode mode,
                DType dtype = DType::kBFloat16) {
  PlanInput in;
  in.units = std::move(units);
  in.nodes = nodes;
  in.gpus_per_node = gpus;
  in.intra_shard = I;
  in.inter_shard = J;
  in.mode = mode;
  in.param_dtype = dtype;
  return in;
}

// ZeRO paper, figure 1: Ψ = 7.5B, 64 GPUs, mixed-precision Adam (K = 12):
// baseline (2+2+12)Ψ = 120 GB; Pos 4Ψ + 12Ψ/64 = 31.4 GB; Pos+g 2Ψ + 14Ψ/64 = 16.6 GB;
// Pos+g+p 16Ψ/64 = 1.9 GB. 7.5e9 / 64 = 117,187,500 exactly, so no padding.
TEST(PlanZeroPaper, SevenPointFiveBillionOnSixtyFourGpus) {
  const std::vector<uint64_t> one_unit = {kPsi};
  Plan none = mustPlan(input(one_unit, 8, 8, 1, 1, ShardMode::kNone));
  EXPECT_EQ(none.gpu.params, 15'000'000'000ull);
  EXPECT_EQ(none.gpu.grads, 15'000'000'000ull);
  EXPECT_EQ(none.gpu.optimizer, 90'000'000'000ull);
  EXPECT_EQ(none.gpu.modelStateTotal(), 120'000'000'000ull);

  Plan z1 = mustPlan(input(one_unit, 8, 8, 8, 8, ShardMode::kZero1));
  EXPECT_EQ(z1.shard_group, 64);
  EXPECT_EQ(z1.shard_params, 117'187'500ull);
  EXPECT_EQ(z1.gpu.optimizer, 1'406'250'000ull);
  EXPECT_EQ(z1.gpu.modelStateTotal(), 31'406'250'000ull);  // 31.4 GB

  Plan z2 = mustPlan(input(one_unit, 8, 8, 8, 8, ShardMode::kZero2));
  EXPECT_EQ(z2.gpu.params, 15'000'000'000ull);
  EXPECT_EQ(z2.gpu.grads, 234'375'000ull);
  EXPECT_EQ(z2.gpu.modelStateTotal(), 16'640'625'000ull);  // 16.6 GB

  Plan z3 = mustPlan(input(one_unit, 8, 8, 8, 8, ShardMode::kZero3));
  EXPECT_EQ(z3.gpu.modelStateTotal(), 1'875'000'000ull);  // 1.9 GB

  // The same with the factors swapped around (I·J = 64 however it is split).
  Plan z3b = mustPlan(input(one_unit, 16, 4, 4, 16, ShardMode::kZero3));
  EXPECT_EQ(z3b.gpu.modelStateTotal(), 1'875'000'000ull);
}

// 7.5e9 parameters (one unit: no padding), 2 nodes x 8 GPUs, bf16, D = 2Ψ = 15e9 bytes.
TEST(PlanTwoNodes, EveryModeMemoryAndTraffic) {
  const std::vector<uint64_t> u = {kPsi};
  const uint64_t D = 15'000'000'000;
  // none: DDP, 16Ψ = 120e9 per GPU; all-reduce over 2 nodes: 2·(N−1)·D = 30e9.
  Plan none = mustPlan(input(u, 2, 8, 1, 1, ShardMode::kNone));
  EXPECT_EQ(none.gpu.modelStateTotal(), 120'000'000'000ull);
  EXPECT_EQ(none.gpu.gathered_peak, 0ull);
  EXPECT_EQ(none.gpu.comm_estimate, 0ull);
  EXPECT_EQ(none.cross_node.all_gather, 0ull);
  EXPECT_EQ(none.cross_node.reduce_scatter, 0ull);
  EXPECT_EQ(none.cross_node.all_reduce, 2 * D);
  EXPECT_EQ(none.crossNodePerNode(), D);

  // I = 8, J = 2: S = 16, R = 1, M = 1; s = 7.5e9/16 = 468,750,000.
  Plan z1 = mustPlan(input(u, 2, 8, 8, 2, ShardMode::kZero1));
  EXPECT_EQ(z1.gpu.params, 2 * kPsi);
  EXPECT_EQ(z1.gpu.grads, 2 * kPsi);
  EXPECT_EQ(z1.gpu.optimizer, 12 * 468'750'000ull);  // 5.625e9
  EXPECT_EQ(z1.gpu.modelStateTotal(), 35'625'000'000ull);
  EXPECT_EQ(z1.gpu.gathered_peak, 0ull);
  EXPECT_EQ(z1.cross_node.all_gather, D);      // R·(J−1)·D
  EXPECT_EQ(z1.cross_node.reduce_scatter, D);  // R·(J−1)·D
  EXPECT_EQ(z1.cross_node.all_reduce, 0ull);   // M = 1

  Plan z2 = mustPlan(input(u, 2, 8, 8, 2, ShardMode::kZero2));
  EXPECT_EQ(z2.gpu.params, 2 * kPsi);
  EXPECT_EQ(z2.gpu.grads, 937'500'000ull);
  EXPECT_EQ(z2.gpu.modelStateTotal(), 21'562'500'000ull);
  EXPECT_EQ(z2.gpu.gathered_peak, 2 * 2 * kPsi);  // 2 gradient blocks of the (only) unit
  EXPECT_EQ(z2.cross_node.total(), 2 * D);

  Plan z3 = mustPlan(input(u, 2, 8, 8, 2, ShardMode::kZero3));
  EXPECT_EQ(z3.gpu.modelStateTotal(), 16 * 468'750'000ull);  // 7.5e9
  EXPECT_EQ(z3.gpu.gathered_peak, 4 * 2 * kPsi);
  EXPECT_EQ(z3.cross_node.all_gather, 2 * D);  // forward + backward
  EXPECT_EQ(z3.cross_node.reduce_scatter, D);
  EXPECT_EQ(z3.cross_node.all_reduce, 0ull);
  EXPECT_EQ(z3.crossNodePerNode(), 3 * D / 2);
  // Comm estimate: s_max = 468,750,000, e = 2: 2·(J·s·e + 2·J·s·e + 2·s·e) = 2·(4+8+4)·s.
  EXPECT_EQ(z3.gpu.comm_estimate, 32 * 468'750'000ull);

  // hpZ: the secondary partition is ΣP/I = 7.5e9/8 elements of bf16; backward stays in-node.
  PlanInput hin = input(u, 2, 8, 8, 2, ShardMode::kZero3);
  hin.hpz = true;
  Plan hpz = mustPlan(hin);
  EXPECT_EQ(hpz.gpu.hpz_secondary, 1'875'000'000ull);
  EXPECT_EQ(hpz.gpu.modelStateTotal(), 7'500'000'000ull + 1'875'000'000ull);
  EXPECT_EQ(hpz.cross_node.all_gather, D);

  // I = 8, J = 1 (HSDP default): S = 8, R = 2, M = 2: only the replica all-reduce crosses nodes:
  // 2·(M−1)·D over S groups of D/S each.
  Plan hsdp = mustPlan(input(u, 2, 8, 8, 1, ShardMode::kZero3));
  EXPECT_EQ(hsdp.gpu.modelStateTotal(), 15'000'000'000ull);
  EXPECT_EQ(hsdp.cross_node.all_gather, 0ull);
  EXPECT_EQ(hsdp.cross_node.reduce_scatter, 0ull);
  EXPECT_EQ(hsdp.cross_node.all_reduce, 2 * D);

  // I = 4, J = 2: R = 2 shard groups, each spanning both nodes: twice zero3 I8J2's gathers.
  Plan mixed = mustPlan(input(u, 2, 8, 4, 2, ShardMode::kZero3));
  EXPECT_EQ(mixed.cross_node.all_gather, 4 * D);
  EXPECT_EQ(mixed.cross_node.reduce_scatter, 2 * D);
  EXPECT_EQ(mixed.cross_node.all_reduce, 0ull);

  // I = 1, J = 2: R = 8; inter-node only sharding is the most traffic.
  Plan inter = mustPlan(input(u, 2, 8, 1, 2, ShardMode::kZero3));
  EXPECT_EQ(inter.cross_node.all_gather, 16 * D);
  EXPECT_EQ(inter.gpu.comm_estimate, 2 * (2 * 3'750'000'000ull * 2 + 2 * 3'750'000'000ull * 2));
}

// 7.5e9 in 32 equal units: 234,375,000 each; on S = 16 a shard is ceil(14,648,437.5) = 14,648,438
// and a padded unit 234,375,008.
TEST(PlanTwoNodes, EqualUnitsPad) {
  auto units = splitUnits(kPsi, 32);
  ASSERT_TRUE(units.ok());
  ASSERT_EQ(units->size(), 32ull);
  EXPECT_EQ((*units)[0], 234'375'000ull);
  Plan z3 = mustPlan(input(*units, 2, 8, 8, 2, ShardMode::kZero3));
  EXPECT_EQ(z3.shard_params, 32ull * 14'648'438ull);
  EXPECT_EQ(z3.padded_params, 32ull * 234'375'008ull);
  EXPECT_EQ(z3.gpu.params, 2ull * 32ull * 14'648'438ull);  // 937,500,032
  EXPECT_EQ(z3.gpu.gathered_peak, 4ull * 2ull * 234'375'008ull);
  EXPECT_EQ(z3.cross_node.reduce_scatter, 2ull * 32ull * 234'375'008ull);
}

TEST(PlanSplit, RemainderGoesToTheFirstUnits) {
  auto u = splitUnits(10, 4);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(*u, (std::vector<uint64_t>{3, 3, 2, 2}));
  EXPECT_FALSE(splitUnits(3, 4).ok());
  EXPECT_FALSE(splitUnits(3, 0).ok());
}

// Odd unit sizes on S = 4: 7 -> shard 2, padded 8; 1 -> 1, 4; 10 -> 3, 12.
// Σs = 6, ΣP = 24, P_max = 12, s_max = 3. Ψ = 18.
TEST(PlanPadding, OddUnitSizes) {
  const std::vector<uint64_t> u = {7, 1, 10};
  Plan z3 = mustPlan(input(u, 1, 4, 4, 1, ShardMode::kZero3, DType::kFloat32));
  EXPECT_EQ(z3.total_params, 18ull);
  EXPECT_EQ(z3.shard_params, 6ull);
  EXPECT_EQ(z3.padded_params, 24ull);
  EXPECT_EQ(z3.largest_padded, 12ull);
  EXPECT_EQ(z3.largest_shard, 3ull);
  EXPECT_EQ(z3.gpu.params, 24ull);  // 4·6
  EXPECT_EQ(z3.gpu.grads, 24ull);
  EXPECT_EQ(z3.gpu.optimizer, 48ull);  // 8·6
  EXPECT_EQ(z3.gpu.gathered_peak, 4ull * 4ull * 12ull);
  EXPECT_EQ(z3.gpu.comm_estimate, 2ull * (3ull * 4ull + 2ull * 3ull * 4ull));  // J = 1, I = 4: 72

  // zero2 keeps the whole padded buffer of parameters: 4·24; zero1 the gradients too.
  Plan z2 = mustPlan(input(u, 1, 4, 4, 1, ShardMode::kZero2, DType::kFloat32));
  EXPECT_EQ(z2.gpu.params, 96ull);
  EXPECT_EQ(z2.gpu.grads, 24ull);
  EXPECT_EQ(z2.gpu.gathered_peak, 2ull * 4ull * 12ull);
  Plan z1 = mustPlan(input(u, 1, 4, 4, 1, ShardMode::kZero1, DType::kFloat32));
  EXPECT_EQ(z1.gpu.grads, 96ull + 24ull);  // whole gradient + the reduce-scatter's shard
  EXPECT_EQ(z1.gpu.optimizer, 48ull);
  EXPECT_EQ(z1.gpu.gathered_peak, 0ull);

  // bf16: e = 2, optimizer 12 per shard element. S = 3 (3 GPUs): 7 -> 3/9, 1 -> 1/3, 10 -> 4/12.
  Plan b = mustPlan(input(u, 1, 3, 3, 1, ShardMode::kZero3));
  EXPECT_EQ(b.shard_params, 8ull);
  EXPECT_EQ(b.padded_params, 24ull);
  EXPECT_EQ(b.gpu.params, 16ull);
  EXPECT_EQ(b.gpu.optimizer, 96ull);
  EXPECT_EQ(b.gpu.gathered_peak, 4ull * 2ull * 12ull);

  // Mode none: no padding, no pool.
  Plan n = mustPlan(input(u, 1, 4, 1, 1, ShardMode::kNone, DType::kFloat32));
  EXPECT_EQ(n.padded_params, 18ull);
  EXPECT_EQ(n.gpu.modelStateTotal(), 16ull * 18ull);
  EXPECT_EQ(n.gpu.gathered_peak, 0ull);
}

// The example MLP (32-1000-333-128-10) as the fp32 engine lays it out on S = 4 (2 nodes x 4,
// I = 4, J = 1: the demo). Units: 32·1000+1000 = 33,000; 1000·333+333 = 333,333;
// 333·128+128 = 42,752; 128·10+10 = 1,290. Shards ceil(n/4): 8,250; 83,334; 10,688; 323 -> Σs =
// 102,595. Per rank: params = grads = 4·102,595 = 410,380 B; Adam moments 2·410,380 = 820,760 B;
// pool: 4 blocks of the largest padded unit 4·83,334 = 333,336 elements: 4·4·333,336 = 5,333,376
// B; comm: s_max = 83,334: 2·(1·s·4 + 2·1·s·4) = 24·s = 2,000,016 B.
// (Measured by the engine, train_mlp --intra-shard 4: params 400.8 KiB = 410,380 B, gathered
// pool 5.09 MiB = 5,333,376 B.)
// Bytes per level per step (plan.h), by hand for train_mlp --dims 24,40,33,10 (units 1000, 1353,
// 340), fp32 (e = 4), the cases tests/examples/level_bytes_test.py measures.
TEST(PlanLevels, BytesSentPerLevelByHand) {
  const std::vector<uint64_t> units = {1000, 1353, 340};
  // 3 x 2, zero3 I2 J3: S = 6, shards 167 + 226 + 57 = 450, ΣP = 2700, D = 10800, R = 1.
  Plan a = mustPlan(input(units, 3, 2, 2, 3, ShardMode::kZero3, DType::kFloat32));
  EXPECT_EQ(a.per_level.intra, 3u * 1 * 3 * 1 * 10800);  // 3 passes · R · J · (I-1) · D
  EXPECT_EQ(a.per_level.inter, 3u * 1 * 2 * 10800);      // 3 passes · R · (J-1) · D
  EXPECT_EQ(a.per_level.replica, 0u);
  PlanInput hpz = input(units, 3, 2, 2, 3, ShardMode::kZero3, DType::kFloat32);
  hpz.hpz = true;  // the backward gather stays in the node: 2 passes cross
  Plan h = mustPlan(hpz);
  EXPECT_EQ(h.per_level.intra, 97200u);
  EXPECT_EQ(h.per_level.inter, 43200u);
  // 3 x 2, zero3 I2 J1: S = 2, shards 500 + 677 + 170, ΣP = 2694, D = 10776, R = 3.
  Plan b = mustPlan(input(units, 3, 2, 2, 1, ShardMode::kZero3, DType::kFloat32));
  EXPECT_EQ(b.per_level.intra, 3u * 3 * 1 * 1 * 10776);
  EXPECT_EQ(b.per_level.inter, 0u);
  EXPECT_EQ(b.per_level.replica, 2u * 2 * 10776);  // the ring over R = 3: 2 · · D
  // 2 x 2, zero1 I1 J2: one gather and one reduce-scatter cross; 2 replicas inside each node.
  Plan c = mustPlan(input(units, 2, 2, 1, 2, ShardMode::kZero1, DType::kFloat32));
  EXPECT_EQ(c.per_level.intra, 0u);
  EXPECT_EQ(c.per_level.inter, 2u * 2 * 1 * 10776);
  EXPECT_EQ(c.per_level.replica, 21552u);
  EXPECT_EQ(c.cross_node.all_reduce, 0u);  // the replicas share a node: nothing crosses
  // Mode none on 3 x 2: the world's all-reduce of Ψ = 2693 elements, 2 · 5 · 10772.
  Plan d = mustPlan(input(units, 3, 2, 1, 1, ShardMode::kNone, DType::kFloat32));
  EXPECT_EQ(d.per_level.intra + d.per_level.inter, 0u);
  EXPECT_EQ(d.per_level.replica, 107720u);
}

TEST(PlanEngineLayout, ExampleMlpFp32OnFourShards) {
  const std::vector<uint64_t> mlp = {32 * 1000 + 1000, 1000 * 333 + 333, 333 * 128 + 128,
                                     128 * 10 + 10};
  Plan p = mustPlan(input(mlp, 2, 4, 4, 1, ShardMode::kZero3, DType::kFloat32));
  EXPECT_EQ(p.total_params, 410'375ull);
  EXPECT_EQ(p.shard_params, 102'595ull);
  EXPECT_EQ(p.largest_padded, 333'336ull);
  EXPECT_EQ(p.gpu.params, 410'380ull);
  EXPECT_EQ(p.gpu.grads, 410'380ull);
  EXPECT_EQ(p.gpu.optimizer, 820'760ull);
  EXPECT_EQ(p.gpu.modelStateTotal(), 1'641'520ull);
  EXPECT_EQ(p.gpu.gathered_peak, 5'333'376ull);
  EXPECT_EQ(p.gpu.comm_estimate, 2'000'016ull);
  EXPECT_EQ(p.gpu.total(), 1'641'520ull + 5'333'376ull + 2'000'016ull);
  // Traffic: J = 1, so only the replica all-reduce (R = 2 on M = 2 nodes) crosses: 2·1·4·ΣP.
  EXPECT_EQ(p.cross_node.all_reduce, 2ull * 4ull * 410'380ull);
  EXPECT_EQ(p.cross_node.all_gather + p.cross_node.reduce_scatter, 0ull);

  // I = 2, J = 2 (also S = 4): same model state; comm 2·(2·s·4 + 2·2·s·4 + 2·s·4) = 64·s.
  Plan q = mustPlan(input(mlp, 2, 4, 2, 2, ShardMode::kZero3, DType::kFloat32));
  EXPECT_EQ(q.gpu.modelStateTotal(), 1'641'520ull);
  EXPECT_EQ(q.gpu.comm_estimate, 64ull * 83'334ull);
  // R = 2 groups, each (J−1)·D: gathers 2·2·D, scatter 2·D, no all-reduce (M = 1).
  EXPECT_EQ(q.cross_node.all_gather, 4ull * 4ull * 410'380ull);
  EXPECT_EQ(q.cross_node.reduce_scatter, 2ull * 4ull * 410'380ull);
  EXPECT_EQ(q.cross_node.all_reduce, 0ull);

  // Mode none on 8 ranks: 16 bytes per parameter, 4·16·... nothing padded.
  Plan n = mustPlan(input(mlp, 2, 4, 1, 1, ShardMode::kNone, DType::kFloat32));
  EXPECT_EQ(n.gpu.params, 4ull * 410'375ull);
  EXPECT_EQ(n.gpu.modelStateTotal(), 16ull * 410'375ull);
}

TEST(PlanOffload, PinnedHostBytes) {
  // bf16 zero3 I8J2 on 2 x 8, Ψ = 7.5e9 one unit: Σs = 468,750,000; per rank 18 B/element,
  // per node 8 ranks.
  PlanInput in = input({kPsi}, 2, 8, 8, 2, ShardMode::kZero3);
  in.offload_cpu = true;
  Plan p = mustPlan(in);
  EXPECT_EQ(p.gpu.optimizer, 0ull);
  EXPECT_EQ(p.gpu.modelStateTotal(), 4ull * 468'750'000ull);
  EXPECT_EQ(p.host_pinned_per_rank, 18ull * 468'750'000ull);
  EXPECT_EQ(p.host_pinned_per_node, 8ull * 18ull * 468'750'000ull);
  in.param_dtype = DType::kFloat32;
  Plan f = mustPlan(in);
  EXPECT_EQ(f.host_pinned_per_rank, 16ull * 468'750'000ull);
  in.offload_cpu = false;
  EXPECT_EQ(mustPlan(in).host_pinned_per_node, 0ull);
}

TEST(PlanValidate, ErrorsNameTheValue) {
  auto msg = [](PlanInput in) { return validatePlanInput(in).message(); };
  const std::vector<uint64_t> u = {100};
  EXPECT_NE(
      msg(input(u, 2, 8, 3, 1, ShardMode::kZero3)).find("intra_shard=3 does not divide the 8"),
      std::string::npos);
  EXPECT_NE(
      msg(input(u, 2, 8, 8, 3, ShardMode::kZero3)).find("inter_shard=3 does not divide the 2"),
      std::string::npos);
  EXPECT_NE(msg(input(u, 2, 8, 0, 1, ShardMode::kZero3)).find("--intra-shard 0"),
            std::string::npos);
  EXPECT_NE(msg(input(u, -1, 8, 1, 1, ShardMode::kZero3)).find("--nodes -1"), std::string::npos);
  EXPECT_NE(msg(input(u, 2, 8, 2, 1, ShardMode::kNone)).find("mode none"), std::string::npos);
  EXPECT_NE(msg(input({5, 0}, 2, 8, 2, 1, ShardMode::kZero3)).find("unit 1 has 0"),
            std::string::npos);
  PlanInput h = input(u, 2, 8, 8, 2, ShardMode::kZero1);
  h.hpz = true;
  EXPECT_NE(msg(h).find("--hpz with mode zero1"), std::string::npos);
  h.mode = ShardMode::kZero2;
  EXPECT_NE(msg(h).find("--hpz with mode zero2"), std::string::npos);
  h.mode = ShardMode::kZero3;
  h.intra_shard = 1;
  EXPECT_NE(msg(h).find("--hpz with intra_shard=1"), std::string::npos);
  h.intra_shard = 8;
  h.inter_shard = 1;
  EXPECT_NE(msg(h).find("--hpz with inter_shard=1"), std::string::npos);
  h.inter_shard = 2;
  EXPECT_TRUE(validatePlanInput(h).ok());
  EXPECT_FALSE(parseShardMode("zero4").ok());
  EXPECT_NE(parseShardMode("zero4").status().message().find("'zero4'"), std::string::npos);
}

TEST(PlanParse, Counts) {
  EXPECT_EQ(*parseCount("7500000000", "--params"), 7'500'000'000ull);
  EXPECT_EQ(*parseCount("7.5e9", "--params"), 7'500'000'000ull);
  EXPECT_EQ(*parseCount("1E6", "--params"), 1'000'000ull);
  EXPECT_EQ(*parseCount("175000000000", "--params"), 175'000'000'000ull);
  for (const char* bad : {"-5", "0", "1.5", "abc", "", "7.5e9x", "1e30", "nan", "inf"}) {
    auto r = parseCount(bad, "--params");
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
  }
}

// The wires: each term's e·s per shard becomes the shard's encoded size (hsdp/quantize.h). One
// unit of 10^6 on 2 nodes x 4, I4 J2 (S = 8, s = 125,000), zero3, fp32 policy: int8 blocks of
// 2048 are 61 full blocks of 2052 bytes and one of 72 elements (76 bytes): 125,248 per shard.
TEST(PlanWires, EncodedShardBytesPerCollective) {
  PlanInput in = input({1'000'000}, 2, 4, 4, 2, ShardMode::kZero3, DType::kFloat32);
  const Plan fp32 = mustPlan(in);
  EXPECT_EQ(fp32.cross_node.all_gather, 2ull * 8 * 125'000 * 4);  // 2·R·(J−1)·D
  in.param_wire = Wire::kInt8;
  in.grad_wire = Wire::kInt4;
  const Plan q = mustPlan(in);
  EXPECT_EQ(q.cross_node.all_gather, 2ull * 8 * 125'248);
  // int4: 61 blocks of 4 + 1024 bytes and one of 4 + 36.
  EXPECT_EQ(q.cross_node.reduce_scatter, 8ull * (61 * 1028 + 40));
  EXPECT_EQ(q.cross_node.all_reduce, 0ull);  // one replica
  ASSERT_EQ(q.traffic_by_wire.size(), 4u);
  EXPECT_EQ(q.traffic_by_wire[0].traffic.total(), fp32.cross_node.total());
  EXPECT_EQ(q.traffic_by_wire[1].traffic.total(), fp32.cross_node.total() / 2);
  EXPECT_LT(double(q.traffic_by_wire[2].traffic.total()) / fp32.cross_node.total(), 0.27);
  // The replica all-reduce on its wire: mode none over 2 nodes, 2·(N−1)·enc(10^6) with bf16.
  PlanInput none = input({1'000'000}, 2, 4, 1, 1, ShardMode::kNone, DType::kFloat32);
  none.replica_wire = Wire::kBf16;
  EXPECT_EQ(mustPlan(none).cross_node.all_reduce, 2ull * 2'000'000);
  // What the engine refuses: int8 parameters outside zero3, int8 with the bf16 policy, bad blocks.
  in.mode = ShardMode::kZero2;
  EXPECT_NE(makePlan(in).status().message().find("zero3"), std::string::npos);
  PlanInput bf = input({1'000'000}, 2, 4, 4, 2, ShardMode::kZero3);
  bf.grad_wire = Wire::kInt8;
  EXPECT_NE(makePlan(bf).status().message().find("fp32"), std::string::npos);
  PlanInput blk = input({1'000'000}, 2, 4, 4, 2, ShardMode::kZero3, DType::kFloat32);
  blk.quant_block = 100;
  EXPECT_NE(makePlan(blk).status().message().find("block 100"), std::string::npos);
}

TEST(PlanParse, ByteSizes) {
  EXPECT_EQ(*parseByteSize("80G", "b"), 80ull << 30);
  EXPECT_EQ(*parseByteSize("80GiB", "b"), 80ull << 30);
  EXPECT_EQ(*parseByteSize("80g", "b"), 80ull << 30);
  EXPECT_EQ(*parseByteSize("80GB", "b"), 80'000'000'000ull);
  EXPECT_EQ(*parseByteSize("1.5T", "b"), 3ull << 39);
  EXPECT_EQ(*parseByteSize("512M", "b"), 512ull << 20);
  EXPECT_EQ(*parseByteSize("4096", "b"), 4096ull);
  EXPECT_EQ(*parseByteSize("1e9", "b"), 1'000'000'000ull);
  for (const char* bad : {"80X", "-1G", "G", "", "0", "1.5.2G"})
    EXPECT_FALSE(parseByteSize(bad, "--mem-budget").ok()) << bad;
}

TEST(PlanParse, LayersText) {
  auto u = parseUnitsText("# model\nembed 1000\n\n  2000  # a comment\nlm_head 3e3\n", "f.txt");
  ASSERT_TRUE(u.ok()) << u.status().toString();
  EXPECT_EQ(*u, (std::vector<uint64_t>{1000, 2000, 3000}));
  auto bad = parseUnitsText("fc1 10\nfc2 ten\n", "units.txt");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("units.txt:2: 'fc2 ten'"), std::string::npos)
      << bad.status().message();
  auto three = parseUnitsText("a b 3\n", "u.txt");
  EXPECT_NE(three.status().message().find("u.txt:1:"), std::string::npos);
  EXPECT_NE(parseUnitsText("x 0\n", "u.txt").status().message().find("u.txt:1:"),
            std::string::npos);
  EXPECT_NE(parseUnitsText("x -4\n", "u.txt").status().message().find("must be positive"),
            std::string::npos);
  EXPECT_NE(parseUnitsText("# nothing\n", "u.txt").status().message().find("no units"),
            std::string::npos);
}

// --auto: every configuration of 2 x 8, ranked by cross-node bytes, ties by memory.
TEST(PlanAuto, EnumerationAndRanking) {
  auto units = splitUnits(kPsi, 32);
  ASSERT_TRUE(units.ok());
  PlanInput base;
  base.units = *units;
  base.nodes = 2;
  base.gpus_per_node = 8;
  std::vector<Plan> all = enumeratePlans(base);
  // I in {1,2,4,8} x J in {1,2}: (I,J) = (1,1) only none; 7 sharded pairs x zero1/2/3; hpz where
  // I > 1 and J = 2: 3 more. 1 + 21 + 3 = 25.
  EXPECT_EQ(all.size(), 25ull);
  rankPlans(&all);
  for (size_t i = 1; i < all.size(); ++i) {
    const uint64_t a = all[i - 1].cross_node.total(), b = all[i].cross_node.total();
    EXPECT_LE(a, b) << i;
    if (a == b) EXPECT_LE(all[i - 1].gpu.total(), all[i].gpu.total()) << i;
  }
  // The least traffic is the replica all-reduce of J = 1 layouts, 2·(N−1)·2Ψ = 30e9 exactly
  // (7.5e9/32 units divide by 8: no padding); the least memory among those is zero3 over I8xJ1.
  // J = 2 layouts with the same formula count (zero1/2 and zero3+hpz over I8xJ2: AG + RS =
  // 2·2·ΣP) move a few bytes more, because S = 16 pads each unit by 8 elements.
  EXPECT_EQ(all[0].label(), "I8xJ1 zero3");
  EXPECT_EQ(all[0].cross_node.total(), 30'000'000'000ull);
  size_t first_j2 = 0;
  while (all[first_j2].input.inter_shard == 1) ++first_j2;
  EXPECT_EQ(first_j2, 10ull);  // none + zero1/2/3 x I in {2,4,8}
  EXPECT_EQ(all[first_j2].label(), "I8xJ2 zero3+hpz");
  EXPECT_EQ(all[first_j2].cross_node.total(), 2ull * 2ull * 32ull * 234'375'008ull);
  EXPECT_EQ(all.back().label(), "I1xJ2 zero3");  // inter-only sharding: the most traffic
}

TEST(PlanChart, SvgIsWellFormedAndAtomic) {
  PlanInput base;
  base.units = {1000, 333'333, 42'752};
  base.nodes = 2;
  base.gpus_per_node = 4;
  std::vector<Plan> all = enumeratePlans(base);
  rankPlans(&all);
  const std::string svg = planChartSvg(all, 4ull << 20, "a <title> & \"quotes\"");
  EXPECT_EQ(test::checkWellFormedXml(svg), "");
  EXPECT_EQ(test::countElements(svg, "svg"), 1);
  EXPECT_NE(svg.find("I4xJ2 zero3+hpz"), std::string::npos);
  EXPECT_NE(svg.find("budget 4.00 MiB"), std::string::npos);
  EXPECT_EQ(test::checkWellFormedXml(planChartSvg({}, 0, "empty")), "");
  // The checker itself rejects broken documents.
  EXPECT_NE(test::checkWellFormedXml("<svg><g></svg>"), "");
  EXPECT_NE(test::checkWellFormedXml("<svg a=1/>"), "");
  EXPECT_NE(test::checkWellFormedXml("<svg>a & b</svg>"), "");
  EXPECT_NE(test::checkWellFormedXml("<svg/><svg/>"), "");

  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("hsdp_plan_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "chart.svg").string();
  ASSERT_TRUE(writeFileAtomically(path, svg).ok());
  std::ifstream f(path);
  std::string back((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(back, svg);
  // Renaming over a directory fails: the error names the path, no temporary is left behind.
  fs::create_directories(dir / "taken");
  Status s = writeFileAtomically((dir / "taken").string(), "x");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("taken"), std::string::npos);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++entries;
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  }
  EXPECT_EQ(entries, 2);  // chart.svg and taken/
  // The name forwards to hsdp/files.h: never through a symbolic link (what it names is untouched).
  fs::create_symlink(path, dir / "link.svg");
  s = writeFileAtomically((dir / "link.svg").string(), "x");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("link.svg"), std::string::npos) << s.message();
  std::ifstream again(path);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>()),
            svg);
  fs::remove_all(dir);
}

TEST(PlanFormat, Bytes) {
  EXPECT_EQ(formatBytes(17), "17 B");
  EXPECT_EQ(formatBytes(410'380), "400.8 KiB");
  EXPECT_EQ(formatBytes(5'333'376), "5.09 MiB");
  EXPECT_EQ(formatBytes(120'000'000'000), "111.76 GiB");
}

}  // namespace
}  // namespace hsdp
