// The hierarchical schedules with a block-quantized inter wire (int8, int4), against MPI's fp32
// collectives over the shard group:
//   all-gather      every rank holds exactly decode(encode(shard k)) for every k (the closed form,
//                   computed here from MPI_Allgather's fp32 shards), also from a shard encoded by
//                   the caller (iallGatherEncoded), and so within (1/2 + 2^-12) * scale of fp32;
//   reduce-scatter  within the bound derived from the blocks' scales: the J-1 pieces from other
//                   nodes each carry at most (1/2 + 2^-12) * absmax / L of error per element, and a
//                   node's partial sum is at most the sum of its ranks' |x| (from MPI), plus fp32
//                   rounding; and the error is not zero (the wire is really used);
//   error feedback  T reductions of the same gradient with a residual average to MPI's exact sum
//                   within the one-step bound / T (the residual telescopes), far closer than
//                   without it.
// Runs where the layout has more than one (virtual) node: 8 = 2 x 4, 6 = 2 x 3, 8 = 4 x 2, and on
// the emulated cluster.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "collectives/mpi/mpi_comm.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"
#include "hsdp/quantize.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::world;

MPI_Comm raw(Comm& c) { return dynamic_cast<mpi::MpiComm&>(c).raw(); }

// Every mesh of the layout whose shard group spans more than one node; with
// HSDP_TEST_QUANT_CASES=full (a setting of this test only, for the slow emulated cluster) only
// the one of all ranks.
std::vector<std::unique_ptr<Mesh>>& meshes() {
  static auto* m = [] {
    auto* v = new std::vector<std::unique_ptr<Mesh>>();
    auto l = groupRanksIntoNodes(world());
    EXPECT_TRUE(l.ok()) << l.status().toString();
    const char* cases = std::getenv("HSDP_TEST_QUANT_CASES");
    const bool full_only = cases != nullptr && std::string(cases) == "full";
    for (int I = 1; I <= l->ranks_per_node; ++I) {
      if (l->ranks_per_node % I || (full_only && I != l->ranks_per_node)) continue;
      for (int J = 2; J <= l->num_nodes; ++J) {
        if (l->num_nodes % J) continue;
        auto mesh = Mesh::create(world(), *l, {I, J});
        EXPECT_TRUE(mesh.ok()) << mesh.status().toString();
        v->push_back(std::move(*mesh));
      }
    }
    return v;
  }();
  return *m;
}

#define SKIP_WITHOUT_NODES() \
  if (meshes().empty()) GTEST_SKIP() << "needs more than one (virtual) node"

// Gradient-like values: magnitudes that change every 500 elements over several octaves.
std::vector<float> values(int seed, size_t n) {
  std::mt19937 gen(977 + seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = d(gen) * std::ldexp(1.0f, int(i / 500 % 7) - 3);
  return v;
}

float levels(const WireFormat& w) { return w.wire == Wire::kInt8 ? 127.0f : 7.0f; }

const std::vector<WireFormat>& wires() {
  static const std::vector<WireFormat> w = {
      {Wire::kInt8, 2048}, {Wire::kInt4, 2048}, {Wire::kInt8, 48}};
  return w;
}

HierOptions optionsFor(int chunks, const WireFormat& w) {
  HierOptions o;
  o.chunks = chunks;
  o.gather_wire = w;
  o.reduce_wire = w;
  return o;
}

// f(mesh, wire, hier, count) for every mesh, wire, chunk count (1 and 3) and element count, with
// a schedule on that wire reserved for the count.
template <typename F>
void forEachCase(std::initializer_list<size_t> counts, F f) {
  for (auto& mesh : meshes()) {
    for (const WireFormat& w : wires()) {
      for (int chunks : {1, 3}) {
        HierarchicalCollectives hier(mesh->intraShard(), mesh->interShard());
        ASSERT_TRUE(hier.setOptions(optionsFor(chunks, w)).ok());
        ASSERT_TRUE(hier.gatherQuantizes());
        for (size_t count : counts) {
          SCOPED_TRACE(strCat(mesh->describe(), " ", wireName(w.wire), "/", w.block,
                              " chunks=", chunks, " count=", count));
          ASSERT_TRUE(hier.reserve(count, DType::kFloat32).ok());
          f(*mesh, w, hier, count);
        }
      }
    }
  }
}

TEST(QuantizedHier, AllGatherIsEveryShardDecoded) {
  SKIP_WITHOUT_NODES();
  forEachCase({1, 7, 2049, 20011}, [](Mesh& mesh, const WireFormat& w,
                                      HierarchicalCollectives& hier, size_t count) {
    Comm& group = mesh.shardGroup();
    const int S = group.size();
    const std::vector<float> shard = values(world().rank(), count);
    std::vector<float> exact(S * count), full(S * count), from_encoded(S * count);
    MPI_Allgather(shard.data(), int(count), MPI_FLOAT, exact.data(), int(count), MPI_FLOAT,
                  raw(group));
    std::vector<unsigned char> mine(encodedBytes(w, count));
    wireEncode(w, shard.data(), count, mine.data());
    // Two in flight at once on one object, waited in reverse order.
    auto a = hier.iallGather(shard.data(), full.data(), count, DType::kFloat32);
    auto b = hier.iallGatherEncoded(mine.data(), from_encoded.data(), count);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().toString() << b.status().toString();
    ASSERT_TRUE((*b)->wait().ok());
    ASSERT_TRUE((*a)->wait().ok());
    std::vector<unsigned char> enc(encodedBytes(w, count));
    for (int k = 0; k < S; ++k) {
      std::vector<float> want(count);
      wireEncode(w, exact.data() + k * count, count, enc.data());
      wireDecode(w, enc.data(), count, want.data());
      for (size_t i = 0; i < count; ++i) {
        const size_t e = k * count + i;
        ASSERT_EQ(full[e], want[i]) << "shard " << k << " element " << i;
        ASSERT_EQ(from_encoded[e], want[i]) << "encoded path, shard " << k << " element " << i;
        const double bound = (0.5 + std::ldexp(1.0, -12)) * blockScale(w, enc.data(), i / w.block);
        ASSERT_LE(std::fabs(double(full[e]) - exact[e]), bound) << "vs fp32 at " << e;
      }
    }
  });
}

// Bound of the quantized reduce-scatter's result against MPI's fp32 one, per element of our
// block: `quant`, the sum over the other nodes j of (1/2 + 2^-12) * (largest of node j's sum of
// |x| over the element's block) / L; `fp`, fp32 rounding of sums of at most S terms.
struct Bound {
  std::vector<double> quant, fp;
  double at(size_t i) const { return quant[i] + fp[i]; }
};
Bound reduceBound(Mesh& mesh, const std::vector<float>& full, size_t count, const WireFormat& w) {
  const int S = mesh.shardGroup().size(), J = mesh.interShard().size();
  const int me = mesh.interShard().rank();
  const size_t k = static_cast<size_t>(mesh.shardGroup().rank());
  std::vector<float> mag(full.size()), node(full.size()), nodes(J * full.size());
  for (size_t i = 0; i < full.size(); ++i) mag[i] = std::fabs(full[i]);
  MPI_Allreduce(mag.data(), node.data(), int(mag.size()), MPI_FLOAT, MPI_SUM,
                raw(mesh.intraShard()));
  MPI_Allgather(node.data(), int(node.size()), MPI_FLOAT, nodes.data(), int(node.size()), MPI_FLOAT,
                raw(mesh.interShard()));
  Bound bound{std::vector<double>(count), std::vector<double>(count)};
  for (size_t b0 = 0; b0 < count; b0 += w.block) {
    const size_t b1 = std::min(count, b0 + w.block);
    double total = 0;
    for (int j = 0; j < J; ++j) {
      double amax = 0;
      for (size_t i = b0; i < b1; ++i)
        amax = std::max<double>(amax, nodes[j * full.size() + k * count + i]);
      if (j != me) total += (0.5 + std::ldexp(1.0, -12)) * amax * (1 + 1e-6) / levels(w);
    }
    for (size_t i = b0; i < b1; ++i) {
      double sum_abs = 0;
      for (int j = 0; j < J; ++j) sum_abs += nodes[j * full.size() + k * count + i];
      bound.quant[i] = total;
      bound.fp[i] = 4.0 * S * std::ldexp(1.0, -24) * sum_abs + 1e-30;
    }
  }
  return bound;
}

TEST(QuantizedHier, ReduceScatterWithinTheBoundOfItsBlocks) {
  SKIP_WITHOUT_NODES();
  forEachCase({7, 2049, 20011}, [](Mesh& mesh, const WireFormat& w, HierarchicalCollectives& hier,
                                   size_t count) {
    Comm& group = mesh.shardGroup();
    const int S = group.size();
    const std::vector<float> full = values(world().rank() + 100, S * count);
    std::vector<float> exact(count), sum(count), avg(count);
    MPI_Reduce_scatter_block(full.data(), exact.data(), int(count), MPI_FLOAT, MPI_SUM, raw(group));
    auto a = hier.ireduceScatter(full.data(), sum.data(), count, DType::kFloat32, RedOp::kSum);
    auto b = hier.ireduceScatter(full.data(), avg.data(), count, DType::kFloat32, RedOp::kAvg);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_TRUE((*a)->wait().ok());
    ASSERT_TRUE((*b)->wait().ok());
    const Bound bound = reduceBound(mesh, full, count, w);
    double worst = 0;
    for (size_t i = 0; i < count; ++i) {
      const double err = std::fabs(double(sum[i]) - exact[i]);
      ASSERT_LE(err, bound.at(i)) << "sum, element " << i << " (exact " << exact[i] << ")";
      ASSERT_LE(std::fabs(double(avg[i]) - exact[i] / S), bound.at(i) / S * (1 + 1e-5))
          << "avg, element " << i;
      worst = std::max(worst, err);
    }
    double any = 0;  // the wire quantized something somewhere
    MPI_Allreduce(&worst, &any, 1, MPI_DOUBLE, MPI_MAX, raw(group));
    EXPECT_GT(any, 0.0);
  });
}

TEST(QuantizedHier, ErrorFeedbackAveragesToTheExactSum) {
  SKIP_WITHOUT_NODES();
  auto& mesh = meshes().back();
  Comm& group = mesh->shardGroup();
  const int S = group.size(), T = 16;
  const size_t count = 4099;
  const WireFormat w{Wire::kInt4, 2048};
  HierarchicalCollectives hier(mesh->intraShard(), mesh->interShard());
  ASSERT_TRUE(hier.setOptions(optionsFor(2, w)).ok());
  ASSERT_EQ(hier.residualCount(count), size_t(mesh->interShard().size() - 1) * count);
  const std::vector<float> full = values(world().rank() + 7, S * count);
  std::vector<float> exact(count), out(count), residual(hier.residualCount(count), 0.0f);
  MPI_Reduce_scatter_block(full.data(), exact.data(), int(count), MPI_FLOAT, MPI_SUM, raw(group));
  std::vector<double> with(count, 0.0), without(count, 0.0);
  for (int t = 0; t < T; ++t) {
    ASSERT_TRUE(hier.reduceScatter(full.data(), out.data(), count, DType::kFloat32, RedOp::kSum,
                                   residual.data())
                    .ok());
    for (size_t i = 0; i < count; ++i) with[i] += out[i];
    ASSERT_TRUE(
        hier.reduceScatter(full.data(), out.data(), count, DType::kFloat32, RedOp::kSum).ok());
    for (size_t i = 0; i < count; ++i) without[i] += out[i];
  }
  const Bound bound = reduceBound(*mesh, full, count, w);
  double err_with = 0, err_without = 0;
  for (size_t i = 0; i < count; ++i) {
    // The residual telescopes: mean = exact - e_T / T, |e_T| within a step's bound (a little
    // more: the encoded value carries the previous residual).
    const double e = std::fabs(with[i] / T - exact[i]);
    ASSERT_LE(e, 1.2 * bound.quant[i] / T + bound.fp[i]) << i;
    err_with = std::max(err_with, e);
    err_without = std::max(err_without, std::fabs(without[i] / T - exact[i]));
  }
  double w_all = 0, wo_all = 0;
  MPI_Allreduce(&err_with, &w_all, 1, MPI_DOUBLE, MPI_MAX, raw(group));
  MPI_Allreduce(&err_without, &wo_all, 1, MPI_DOUBLE, MPI_MAX, raw(group));
  EXPECT_LT(w_all * 4, wo_all) << "error feedback: " << w_all << ", without: " << wo_all;
}

TEST(QuantizedHier, BadBlocksAndEncodedGathersWithoutQuantizationAreErrors) {
  auto l = groupRanksIntoNodes(world());
  ASSERT_TRUE(l.ok());
  auto mesh = Mesh::create(world(), *l, {l->ranks_per_node, 1});  // one node: nothing crosses
  ASSERT_TRUE(mesh.ok());
  HierarchicalCollectives hier((*mesh)->intraShard(), (*mesh)->interShard());
  Status bad = hier.setOptions(optionsFor(1, {Wire::kInt8, 24}));
  EXPECT_NE(bad.message().find("block 24"), std::string::npos) << bad.toString();
  ASSERT_TRUE(hier.setOptions(optionsFor(1, {Wire::kInt8, 2048})).ok());
  EXPECT_FALSE(hier.gatherQuantizes());
  EXPECT_EQ(hier.residualCount(100), 0u);
  std::vector<unsigned char> enc(16);
  std::vector<float> full(4 * (*mesh)->shardGroup().size());
  auto w = hier.iallGatherEncoded(enc.data(), full.data(), 4);
  EXPECT_EQ(w.status().code(), StatusCode::kFailedPrecondition) << w.status().toString();
}

}  // namespace
}  // namespace hsdp
