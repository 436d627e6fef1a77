// hsdp-ucx-bench: the hierarchical all-gather and reduce-scatter with the inter-node level on MPI
// and on UCX, side by side in one run (the intra-node level stays on MPI), plus the inter-level
// collective alone. Not a test (ctest never runs it): a measurement for docs/ucx.md and for
// choosing a transport on a given cluster.
//
//   mpirun -np 8 -x HSDP_RANKS_PER_NODE=4 build/tests/collectives/ucx/hsdp-ucx-bench
//   tests/cluster/cluster.sh --nodes 2 --ranks-per-node 4 --rate 1gbit -- \
//       build/tests/collectives/ucx/hsdp-ucx-bench --sizes-mib 1,16,64
//
// Sizes are the full (gathered) buffer per rank, fp32; the shard group is the whole job
// (intra_shard = ranks per node, inter_shard = nodes), as in full ZeRO-3. Each figure is the
// median over iterations of the slowest rank's time; runs of the two transports alternate, so
// both see the same background load.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "collectives/ucx/ucx_comm.h"
#include "core/host_buffer.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/topology.h"

namespace hsdp {
namespace {

struct Args {
  std::vector<double> sizes_mib = {1, 16, 64};
  int iters = 10;
  int warmup = 2;
};

StatusOr<Args> parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) return invalidArgument("flag ", flag, " needs a value");
    std::string v = argv[++i];
    if (flag == "--sizes-mib") {
      a.sizes_mib.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) {
        char* end = nullptr;
        double x = std::strtod(item.c_str(), &end);
        if (end == item.c_str() || *end != '\0' || x <= 0)
          return invalidArgument("--sizes-mib '", v, "': '", item, "' is not a positive size");
        a.sizes_mib.push_back(x);
      }
    } else if (flag == "--iters" || flag == "--warmup") {
      int x = std::atoi(v.c_str());
      if (x < (flag == "--iters" ? 1 : 0)) return invalidArgument(flag, " ", v, " is out of range");
      (flag == "--iters" ? a.iters : a.warmup) = x;
    } else {
      return invalidArgument("unknown flag ", flag,
                             " (known: --sizes-mib a,b,c --iters N --warmup N)");
    }
  }
  return a;
}

// Median over iterations of the slowest rank's seconds for `op`.
template <typename Op>
StatusOr<double> timeIt(Comm& world, const Args& a, Op op) {
  std::vector<double> samples;
  for (int i = 0; i < a.warmup + a.iters; ++i) {
    HSDP_RETURN_IF_ERROR(world.barrier());
    auto t0 = std::chrono::steady_clock::now();
    HSDP_RETURN_IF_ERROR(op());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double slowest = 0;
    MPI_Allreduce(&s, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i >= a.warmup) samples.push_back(slowest);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

Status run(Comm& world, const Args& a) {
  HSDP_ASSIGN_OR_RETURN(NodeLayout layout, groupRanksIntoNodes(world));
  // Build the mesh on MPI whatever the environment says; the UCX inter level is made here.
  unsetenv("HSDP_TRANSPORT_INTER");
  unsetenv("HSDP_TRANSPORT_INTRA");
  HSDP_ASSIGN_OR_RETURN(auto mesh, Mesh::create(world, layout, {0, layout.num_nodes}));
  Comm& intra = mesh->intraShard();
  Comm& inter_mpi = mesh->interShard();
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> inter_ucx, ucx::createUcxComm(inter_mpi));
  HierarchicalCollectives hier_mpi(intra, inter_mpi), hier_ucx(intra, *inter_ucx);
  const int S = hier_mpi.groupSize(), J = inter_mpi.size();
  if (world.rank() == 0) {
    std::printf(
        "hsdp-ucx-bench: %s; inter level %d ranks; median of %d (after %d warm-up), "
        "slowest rank\n",
        mesh->describe().c_str(), J, a.iters, a.warmup);
    std::printf("%-15s %9s %12s %12s %9s %12s %12s\n", "collective", "full MiB", "mpi-inter ms",
                "ucx-inter ms", "ucx/mpi", "mpi GB/s", "ucx GB/s");
  }
  for (double mib : a.sizes_mib) {
    const size_t count = std::max<size_t>(1, static_cast<size_t>(mib * (1 << 20) / 4 / S));
    const double bytes = static_cast<double>(count) * 4 * S;  // full buffer per rank
    HSDP_RETURN_IF_ERROR(hier_mpi.reserve(count, DType::kFloat32));
    HSDP_RETURN_IF_ERROR(hier_ucx.reserve(count, DType::kFloat32));
    HSDP_ASSIGN_OR_RETURN(HostBuffer full, HostBuffer::allocate(count * 4 * S));
    HSDP_ASSIGN_OR_RETURN(HostBuffer shard, HostBuffer::allocate(count * 4));
    HSDP_ASSIGN_OR_RETURN(HostBuffer inter_full, HostBuffer::allocate(count * 4 * J));
    for (size_t i = 0; i < count * S; ++i) full.as<float>()[i] = float(i % 251) * 0.5f;
    struct Row {
      const char* name;
      double bytes;  // the buffer the collective fills or reduces, per rank
      std::function<Status(HierarchicalCollectives&, Comm&)> op;
    };
    const Row rows[] = {
        {"hier allGather", bytes,
         [&](HierarchicalCollectives& h, Comm&) {
           return h.allGather(shard.data(), full.data(), count, DType::kFloat32);
         }},
        {"hier redScat", bytes,
         [&](HierarchicalCollectives& h, Comm&) {
           return h.reduceScatter(full.data(), shard.data(), count, DType::kFloat32, RedOp::kAvg);
         }},
        {"inter allGather", bytes / intra.size(),
         [&](HierarchicalCollectives&, Comm& inter) {
           return inter.allGather(shard.data(), inter_full.data(), count, DType::kFloat32);
         }},
        {"inter redScat", bytes / intra.size(),
         [&](HierarchicalCollectives&, Comm& inter) {
           return inter.reduceScatter(inter_full.data(), shard.data(), count, DType::kFloat32,
                                      RedOp::kAvg);
         }},
    };
    for (const Row& row : rows) {
      double t_mpi = 0, t_ucx = 0;
      // Alternate transports in rounds so that both meet the same background load.
      for (int round = 0; round < 2; ++round) {
        HSDP_ASSIGN_OR_RETURN(double m,
                              timeIt(world, a, [&] { return row.op(hier_mpi, inter_mpi); }));
        HSDP_ASSIGN_OR_RETURN(double u,
                              timeIt(world, a, [&] { return row.op(hier_ucx, *inter_ucx); }));
        t_mpi += m / 2;
        t_ucx += u / 2;
      }
      if (world.rank() == 0)
        std::printf("%-15s %9.2f %12.3f %12.3f %9.2f %12.3f %12.3f\n", row.name, bytes / (1 << 20),
                    t_mpi * 1e3, t_ucx * 1e3, t_ucx / t_mpi, row.bytes / t_mpi / 1e9,
                    row.bytes / t_ucx / 1e9);
    }
  }
  return okStatus();
}

}  // namespace
}  // namespace hsdp

int main(int argc, char** argv) {
  auto session = hsdp::mpi::Session::init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "hsdp-ucx-bench: %s\n", session.status().toString().c_str());
    return 3;
  }
  auto args = hsdp::parse(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "hsdp-ucx-bench: error: %s\n", args.status().toString().c_str());
    return 2;
  }
  auto world = (*session)->world();
  if (!world.ok()) {
    std::fprintf(stderr, "hsdp-ucx-bench: %s\n", world.status().toString().c_str());
    return 3;
  }
  hsdp::Status s = hsdp::run(**world, *args);
  if (!s.ok()) {
    std::fprintf(stderr, "hsdp-ucx-bench [rank %d]: error: %s\n", (*world)->rank(),
                 s.toString().c_str());
    (*world)->abortJob(3);
  }
  return 0;
}
