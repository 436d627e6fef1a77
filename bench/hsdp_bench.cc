// hsdp-bench: collective bandwidth in the style of nccl-tests, with hsdp's hierarchical schedule,
// its flat collective and the MPI library's own collective measured side by side in one run.
//
//   mpirun -np 8 build/bench/hsdp-bench -b 1M -e 64M -f 4 --op reducescatter --algo hier,mpi
//
// size is the whole buffer in bytes (all-gather: the gathered result, reduce-scatter: the input,
// all-reduce: the buffer); time is the median over iterations of the slowest rank; algbw =
// size / time; busbw = algbw * (n-1)/n for all-gather and reduce-scatter, 2(n-1)/n for
// all-reduce (docs/collectives.md).
//
// hier-off and flat-off are hier and flat over communicators the watchdog does not trace, with
// their waits unwatched (watchdog::Untraced): the watchdog's and the fingerprints' cost, taking
// turns with hier and flat iteration by iteration (docs/reliability.md).
//
// --inter-dtype int8|int4 runs hier's all-gather and reduce-scatter over the block-quantized
// inter wire (--quant-block elements per scale). A comma list (--inter-dtype float,bf16,int8)
// runs one hier per wire, named hier/<wire>, side by side in the same interleaved rounds. #wrong is
// then judged against the quantized closed form: an all-gather element is wrong unless it equals
// decode(encode(its shard)) exactly; a reduce-scatter element unless it is within the bound its
// blocks' scales give, the sum over the other nodes j of (1/2 + 2^-12) * (the largest partial sum
// of node j in the block) / L (L = 127 for int8, 7 for int4), plus fp32 rounding. xnode_min stays
// the fp32 minimum.
#include <dirent.h>
#include <mpi.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "bench/hsdp_bench_ops.h"
#include "bench/hsdp_bench_wait.h"
#include "collectives/mpi/mpi_comm.h"
#include "core/host_buffer.h"
#include "core/watchdog/watchdog.h"
#include "hsdp/cli.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/quantize.h"
#include "hsdp/topology.h"

namespace {

using hsdp::DType;
using hsdp::RedOp;
using hsdp_bench::Bench;
using hsdp_bench::HierCase;

struct Options {
  std::string min_bytes = "1M", max_bytes = "64M";
  double factor = 2;
  int iters = 10, warmup = 3, check = 1;
  std::string op = "allgather", algo = "hier,mpi", dtype = "float", inter_dtype = "";
  int chunks = 32;
  uint32_t quant_block = hsdp::kDefaultQuantBlock;
  std::string min_chunk = "1M";  // below ~1 MiB per chunk, per-chunk latency dominates here
  bool json = false;
};

// Bytes this network namespace has sent on every interface but loopback. On the emulated
// cluster each node is its own namespace, so the sum over nodes is the traffic that crossed
// between nodes (plus TCP/IP headers); on one machine it is whatever the host sends meanwhile.
uint64_t txBytes() {
  uint64_t total = 0;
  DIR* d = opendir("/sys/class/net");
  if (d == nullptr) return 0;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == ".." || name == "lo") continue;
    std::ifstream f("/sys/class/net/" + name + "/statistics/tx_bytes");
    uint64_t v = 0;
    if (f >> v) total += v;
  }
  closedir(d);
  return total;
}

// The header's inter dtype: as before for one schedule ("float", "bf16", "int8"), else the list.
std::string wireTitle(const Options& o, const std::vector<HierCase>& hiers) {
  if (hiers.size() > 1) return o.inter_dtype;
  const HierCase& c = hiers.front();
  if (hsdp::wireQuantized(c.wire.wire)) return hsdp::wireName(c.wire.wire);
  return hsdp::dtypeName(c.hier->options().inter_dtype);
}

int fail(int rank, const std::string& msg) {
  std::fprintf(stderr, "hsdp-bench [rank %d]: error: %s\n", rank, msg.c_str());
  return 2;
}

int benchMain(const Options& o, hsdp::Comm& world) {
  const int rank = world.rank(), n = world.size();
  auto lo = hsdp::parseByteSize(o.min_bytes, "-b"), hi = hsdp::parseByteSize(o.max_bytes, "-e");
  if (!lo.ok()) return fail(rank, lo.status().message());
  if (!hi.ok()) return fail(rank, hi.status().message());
  if (*hi < *lo) return fail(rank, hsdp::strCat("-e ", o.max_bytes, " is below -b ", o.min_bytes));
  auto dt = hsdp::parseDType(o.dtype);
  if (!dt.ok()) return fail(rank, dt.status().message());
  auto algos_or = hsdp::parseList(o.algo, "--algo");
  if (!algos_or.ok()) return fail(rank, algos_or.status().message());
  std::vector<std::string> algos = *algos_or;
  for (const auto& a : algos)
    if (a != "hier" && a != "flat" && a != "mpi" && a != "hier-off" && a != "flat-off")
      return fail(rank,
                  hsdp::strCat("--algo '", a, "' is not hier, flat, mpi, hier-off or flat-off"));

  auto layout = hsdp::groupRanksIntoNodes(world);
  if (!layout.ok()) return fail(rank, layout.status().message());
  // The whole world is one shard group: intra = every rank of a node, inter = every node.
  auto mesh = hsdp::Mesh::create(world, *layout, {layout->ranks_per_node, layout->num_nodes});
  if (!mesh.ok()) return fail(rank, mesh.status().message());
  hsdp::HierOptions hopts{o.chunks, *dt};
  if (o.min_chunk != "0") {
    auto min_chunk = hsdp::parseByteSize(o.min_chunk, "--min-chunk-bytes");
    if (!min_chunk.ok()) return fail(rank, min_chunk.status().message());
    hopts.min_chunk_bytes = *min_chunk;
  }
  // One schedule per inter wire: float/bf16 set the inter dtype of both directions, as before;
  // int8/int4 the quantized wire of the all-gather and the reduce-scatter.
  std::vector<HierCase> hiers;
  std::vector<std::string> wires;  // none: the one schedule of --dtype
  if (!o.inter_dtype.empty()) {
    auto w = hsdp::parseList(o.inter_dtype, "--inter-dtype");
    if (!w.ok()) return fail(rank, w.status().message());
    wires = *w;
  }
  for (const std::string& text : wires.empty() ? std::vector<std::string>{""} : wires) {
    HierCase c{wires.size() > 1 ? "hier/" + text : "hier",
               std::make_unique<hsdp::HierarchicalCollectives>((*mesh)->intraShard(),
                                                               (*mesh)->interShard()),
               {hsdp::Wire::kFp32, o.quant_block}};
    hsdp::HierOptions ho = hopts;
    if (!text.empty()) {
      auto w = hsdp::parseWire(text);
      if (!w.ok()) return fail(rank, "--inter-dtype: " + w.status().message());
      if (*w == hsdp::Wire::kBf16) ho.inter_dtype = DType::kBFloat16;
      if (*w == hsdp::Wire::kFp32) ho.inter_dtype = DType::kFloat32;
      if (hsdp::wireQuantized(*w)) {
        c.wire.wire = *w;
        if (auto v = hsdp::validate(c.wire); !v.ok())
          return fail(rank, "--quant-block: " + v.message());
        ho.gather_wire = ho.reduce_wire = c.wire;
      }
    }
    if (auto st = c.hier->setOptions(ho); !st.ok()) return fail(rank, st.message());
    c.options = ho;
    hiers.push_back(std::move(c));
  }
  // hier-off, flat-off: the same communicators again, untraced, with the same schedules.
  std::unique_ptr<hsdp::Comm> world_off;
  std::unique_ptr<hsdp::Mesh> mesh_off;
  {
    hsdp::watchdog::Untraced untraced;
    auto w = world.split(0, rank);
    if (!w.ok()) return fail(rank, w.status().message());
    world_off = std::move(*w);
    auto m = hsdp::Mesh::create(*world_off, *layout, {layout->ranks_per_node, layout->num_nodes});
    if (!m.ok()) return fail(rank, m.status().message());
    mesh_off = std::move(*m);
  }
  std::vector<HierCase> hiers_off;
  for (const HierCase& c : hiers) {
    HierCase off{c.name,
                 std::make_unique<hsdp::HierarchicalCollectives>(mesh_off->intraShard(),
                                                                 mesh_off->interShard()),
                 c.wire, c.options};
    if (auto st = off.hier->setOptions(c.options); !st.ok()) return fail(rank, st.message());
    hiers_off.push_back(std::move(off));
  }
  // "hier" in --algo stands for every schedule, in --inter-dtype order.
  std::vector<std::string> expanded;
  for (const std::string& a : algos) {
    if (a != "hier" && a != "hier-off") {
      expanded.push_back(a);
      continue;
    }
    for (const HierCase& c : hiers) expanded.push_back(c.name + (a == "hier-off" ? "-off" : ""));
  }
  algos = expanded;
  int algo_w = 5;  // the algo column: as wide as the longest name
  for (const std::string& a : algos) algo_w = std::max(algo_w, static_cast<int>(a.size()));

  const size_t es = hsdp::dtypeSize(*dt);
  // Buffers for the largest size, allocated and pre-faulted once.
  const size_t max_count = (*hi / es + n - 1) / n * n;
  // Two buffers of the largest size: refused with the limit named, not killed by the kernel.
  if (auto b = hsdp::checkedAllocation(max_count, 2 * es, hsdp::strCat("-e ", o.max_bytes));
      !b.ok())
    return fail(rank, b.status().message());
  auto send = hsdp::HostBuffer::allocate(max_count * es);
  auto recv = hsdp::HostBuffer::allocate(max_count * es);
  if (!send.ok() || !recv.ok()) return fail(rank, "out of host memory for the buffers");
  MPI_Comm raw = dynamic_cast<hsdp::mpi::MpiComm&>(world).raw();
  for (std::vector<HierCase>* v : {&hiers, &hiers_off})
    for (HierCase& c : *v)
      if (auto s = c.hier->reserve(max_count / n, *dt); !s.ok()) return fail(rank, s.message());
  for (hsdp::Comm* c : {&world, world_off.get()})
    if (auto s = c->reserveScratch(max_count / n * es); !s.ok()) return fail(rank, s.message());
  // The reference's communicators, split from the world by MPI itself (the mesh's levels may
  // run on UCX), ranked as the mesh ranks them.
  MPI_Comm shard_order, intra_raw, inter_raw;
  const hsdp::Mesh& m = **mesh;
  MPI_Comm_split(raw, 0, m.shardGroup().rank(), &shard_order);
  MPI_Comm_split(raw, layout->node_of_rank[rank], m.intraShard().rank(), &intra_raw);
  MPI_Comm_split(raw, layout->local_rank_of_rank[rank], m.interShard().rank(), &inter_raw);
  struct FreeComms {
    MPI_Comm* c[3];
    ~FreeComms() {
      for (MPI_Comm* p : c) MPI_Comm_free(p);
    }
  } free_comms{{&shard_order, &intra_raw, &inter_raw}};
  Bench b{
      world,  raw, shard_order, intra_raw,        inter_raw,        hiers, *world_off, hiers_off,
      **mesh, *dt, es,          std::move(*send), std::move(*recv), {}};
  b.fill(b.send.data(), max_count, rank);

  const double bus = o.op == "allreduce" ? 2.0 * (n - 1) / n : double(n - 1) / n;
  bool quantized = false;
  for (const HierCase& c : hiers) quantized |= hsdp::wireQuantized(c.wire.wire);
  if (rank == 0 && !o.json) {
    std::printf(
        "# hsdp-bench: op %s, dtype %s, %d ranks = %d nodes x %d, iters %d, warmup %d, "
        "pipeline chunks %d (each >= %zu B), inter dtype %s%s\n",
        o.op.c_str(), o.dtype.c_str(), n, layout->num_nodes, layout->ranks_per_node, o.iters,
        o.warmup, hopts.chunks, hopts.min_chunk_bytes, wireTitle(o, hiers).c_str(),
        quantized ? hsdp::strCat(" (int8/int4 blocks of ", o.quant_block,
                                 ", all-gather and reduce-scatter)")
                        .c_str()
                  : "");
    for (int q = 0; q < n; ++q)
      std::printf("#  rank %2d  node %d (%s)\n", q, layout->node_of_rank[q],
                  layout->node_names[layout->node_of_rank[q]].c_str());
    // xnode is measured, xnode_min is arithmetic: xnode below it means the traffic did not go
    // through a network interface at all (virtual nodes on one host).
    std::printf(
        "#\n# xnode: bytes the nodes' network interfaces sent during one run (on the emulated "
        "cluster, what crossed between nodes; with virtual nodes on one host ~0: nothing "
        "leaves the host). xnode_min: the least any algorithm must move between the nodes.\n");
    std::printf("#\n# %10s %12s %6s %6s %*s %11s %8s %8s %7s %9s %9s\n", "size", "count", "type",
                "redop", algo_w, "algo", "time", "algbw", "busbw", "#wrong", "xnode", "xnode_min");
    std::printf("# %10s %12s %6s %6s %*s %11s %8s %8s %7s %9s %9s\n", "(B)", "(elements)", "", "",
                algo_w, "", "(us)", "(GB/s)", "(GB/s)", "", "(MB/op)", "(MB/op)");
  }
  std::string json = "[";
  for (double bytes = double(*lo); bytes <= double(*hi) * 1.0001; bytes *= o.factor) {
    const size_t count = std::max<size_t>(n, size_t(bytes) / es / n * n);
    std::map<std::string, double> median_us, xnode;
    // The algorithms take turns iteration by iteration (warm-ups first), so a noisy spell on
    // this shared machine hits all of them alike and the ratios compare like with like; the
    // order is shuffled each iteration (the same seed on every rank), so that none always runs
    // after a given other (what the previous one leaves behind moves a 64 MiB run by 1-3%).
    const bool leader = layout->local_rank_of_rank[rank] == 0;
    std::map<std::string, std::vector<double>> times;
    std::map<std::string, double> tx_bytes;
    std::map<std::string, hsdp::Status> status;
    std::map<std::string, long> wrong;  // checked right after the algorithm's last run
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      std::vector<std::string> order = algos;
      std::mt19937 shuffle_rng(static_cast<uint32_t>(it) * 2654435761u + 1u);
      std::shuffle(order.begin(), order.end(), shuffle_rng);
      for (const std::string& algo : order) {
        if (!status[algo].ok()) continue;
        MPI_Barrier(raw);
        double t0 = MPI_Wtime();
        status[algo] = b.run(o.op, algo, count);
        double dt_local = MPI_Wtime() - t0, dt_max = 0;
        MPI_Allreduce(&dt_local, &dt_max, 1, MPI_DOUBLE, MPI_MAX, raw);
        if (it >= o.warmup) times[algo].push_back(dt_max);
        if (it == o.warmup + o.iters - 1 && o.check && status[algo].ok())
          wrong[algo] = b.wrong(o.op, algo, count);
      }
    }
    // Cross-node bytes: one more run of each algorithm alone, between pauses that let the
    // previous traffic leave the link's queue (the emulated link queues up to 50 ms). The counter
    // is read before the barrier that releases the run: read after it, the node's other ranks
    // would already be sending (reading sysfs takes about a millisecond).
    for (const std::string& algo : algos) {
      if (!status[algo].ok()) continue;
      MPI_Barrier(raw);
      usleep(150000);
      const uint64_t tx0 = leader ? txBytes() : 0;
      MPI_Barrier(raw);
      status[algo] = b.run(o.op, algo, count);
      MPI_Barrier(raw);
      usleep(150000);
      if (leader) tx_bytes[algo] = double(txBytes() - tx0);
    }
    for (const std::string& algo : algos) {
      const hsdp::Status& st = status[algo];
      if (!st.ok()) {
        if (rank == 0) std::printf("# %s: %s\n", algo.c_str(), st.message().c_str());
        continue;
      }
      MPI_Barrier(raw);
      double tx = tx_bytes[algo], tx_all = 0;
      MPI_Allreduce(&tx, &tx_all, 1, MPI_DOUBLE, MPI_SUM, raw);
      xnode[algo] = tx_all;
      // Least traffic between N nodes: every node must receive the (N-1)/N of the result it
      // does not hold (all-gather, reduce-scatter), twice over for all-reduce.
      const double N = layout->num_nodes;
      const double tx_min = (o.op == "allreduce" ? 2.0 : 1.0) * (N - 1) * count * es;
      long bad = wrong[algo], total_bad = 0;
      MPI_Allreduce(&bad, &total_bad, 1, MPI_LONG, MPI_SUM, raw);
      std::vector<double> ts = times[algo];  // times[algo] stays in iteration order (--json)
      std::sort(ts.begin(), ts.end());
      const double t = ts[ts.size() / 2], t_min = ts.front();
      const size_t size = count * es;
      const double algbw = size / t / 1e9;
      median_us[algo] = t * 1e6;
      if (rank == 0) {
        if (o.json) {
          json += hsdp::strCat(json.size() > 1 ? "," : "", "{\"op\":\"", o.op, "\",\"algo\":\"",
                               algo, "\",\"size\":", size, ",\"count\":", count, ",\"type\":\"",
                               o.dtype, "\",\"time_us\":", t * 1e6, ",\"min_us\":", t_min * 1e6,
                               ",\"algbw\":", algbw, ",\"busbw\":", algbw * bus,
                               ",\"wrong\":", total_bad, ",\"xnode_bytes\":", tx_all,
                               ",\"xnode_min_bytes\":", tx_min, ",\"iter_us\":[");
          for (size_t i = 0; i < times[algo].size(); ++i)
            json += hsdp::strCat(i ? "," : "", times[algo][i] * 1e6);
          json += "]}";
        } else {
          std::printf("  %10zu %12zu %6s %6s %*s %11.1f %8.3f %8.3f %7ld %9.2f %9.2f\n", size,
                      count, o.dtype.c_str(), o.op == "allgather" ? "none" : "sum", algo_w,
                      algo.c_str(), t * 1e6, algbw, algbw * bus, total_bad, tx_all / 1e6,
                      tx_min / 1e6);
        }
      }
    }
    if (rank == 0 && !o.json && median_us.count("mpi"))
      for (auto& [algo, us] : median_us)
        if (algo != "mpi")
          std::printf("# %zu B: %s is %.2fx the speed of mpi\n", count * es, algo.c_str(),
                      median_us["mpi"] / us);
    // Several wires: each against the first (e.g. hier/int8 against hier/float).
    if (rank == 0 && !o.json && hiers.size() > 1 && median_us.count(hiers[0].name))
      for (size_t k = 1; k < hiers.size(); ++k)
        if (median_us.count(hiers[k].name))
          std::printf("# %zu B: %s is %.2fx the speed of %s%s\n", count * es, hiers[k].name.c_str(),
                      median_us[hiers[0].name] / median_us[hiers[k].name], hiers[0].name.c_str(),
                      xnode[hiers[0].name] > 0
                          ? hsdp::strCat(", ", xnode[hiers[k].name] / xnode[hiers[0].name],
                                         "x its cross-node bytes")
                                .c_str()
                          : "");
    std::fflush(stdout);
  }
  if (rank == 0 && o.json) std::printf("%s]\n", json.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto session = hsdp::mpi::Session::init(&argc, &argv);
  if (!session.ok()) return fail(hsdp::mpi::Session::worldRank(), session.status().toString());
  auto world = (*session)->world();
  if (!world.ok()) return fail(-1, world.status().toString());
  Options o;
  CLI::App app{"hsdp-bench: collective bandwidth, nccl-tests style"};
  hsdp::cli::addByteSize(app, "-b,--minbytes", o.min_bytes,
                         "Smallest size (bytes; K, M, G suffixes)");
  hsdp::cli::addByteSize(app, "-e,--maxbytes", o.max_bytes, "Largest size");
  // At most 1024 and 10^6: a factor of at least 1.001 and bounded counts keep a run finite.
  hsdp::cli::addReal(app, "-f,--stepfactor", o.factor, "Size multiplier between rows",
                     hsdp::RealRange::closed(1.001, 1024));
  hsdp::cli::addInt(app, "-n,--iters", o.iters, "Timed iterations per size (median reported)", 1,
                    1000000);
  hsdp::cli::addInt(app, "-w,--warmup_iters", o.warmup, "Untimed iterations per size", 0, 1000000);
  hsdp::cli::addInt(app, "-c,--check", o.check, "Check results against the MPI library (0/1)", 0,
                    1);
  app.add_option("--op", o.op, "allgather | reducescatter | allreduce")
      ->check(CLI::IsMember({"allgather", "reducescatter", "allreduce"}));
  hsdp::cli::addList(app, "--algo", o.algo,
                     "Comma list of hier, flat, mpi (mpi: the library's own), hier-off, flat-off "
                     "(hier, flat untraced: the watchdog's cost)");
  app.add_option("--dtype", o.dtype, "float | bf16");
  hsdp::cli::addList(app, "--inter-dtype", o.inter_dtype,
                     "Wire type across nodes for hier: float | bf16 | int8 | int4 (int8/int4: "
                     "block-quantized all-gather and reduce-scatter); a comma list runs one hier "
                     "per wire (hier/<wire>) side by side");
  hsdp::cli::addInt(app, "--quant-block", o.quant_block,
                    "Elements per scale of the int8/int4 wire (a multiple of 16)", uint32_t{16},
                    uint32_t{1} << 20);
  hsdp::cli::addInt(app, "--chunks", o.chunks, "Pipeline chunks of the hierarchical schedule", 1,
                    4096);
  hsdp::cli::addByteSize(app, "--min-chunk-bytes", o.min_chunk,
                         "Smallest pipeline chunk of the full buffer (fewer chunks below; 0: off)",
                         /*zero_ok=*/true);
  app.add_flag("--json", o.json, "One JSON array instead of the table");
  bool wait_cpu = false;
  hsdp_bench::WaitCpuOptions wo;
  app.add_flag("--wait-cpu", wait_cpu,
               "Instead of the table: the CPU ranks use while they wait for a late rank 0 in an "
               "all-reduce of -b bytes (bench/hsdp_bench_wait.h), -n rounds");
  hsdp::cli::addList(app, "--wait-transports", wo.transports, "--wait-cpu: transports (mpi,ucx)");
  hsdp::cli::addInt(app, "--wait-ms", wo.wait_ms, "--wait-cpu: rank 0's compute before it joins", 1,
                    600000);
  hsdp::cli::addReal(app, "--wait-max-cpu", wo.max_cpu_percent,
                     "--wait-cpu: exit 1 if a waiter used more than this % of a core (0: no bound)",
                     hsdp::RealRange::closed(0, 10000));
  hsdp::cli::addReal(app, "--wait-min-sleeps", wo.min_sleeps_per_s,
                     "--wait-cpu: exit 1 if a waiter slept fewer times a second (0: no bound)",
                     hsdp::RealRange::closed(0, 1e6));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rank = (*world)->rank();
    return hsdp::cli::reportParseError(app, e, "hsdp-bench", rank, rank == 0);
  }
  if (wait_cpu) {
    auto bytes = hsdp::parseByteSize(o.min_bytes, "-b");
    if (!bytes.ok()) return fail((*world)->rank(), bytes.status().message());
    wo.bytes = *bytes;
    wo.rounds = o.iters;
    return hsdp_bench::waitCpuMain(wo, **world);
  }
  return benchMain(o, **world);
}
