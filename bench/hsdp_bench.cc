// hsdp-bench: collective bandwidth in the style of nccl-tests, with hsdp's hierarchical schedule,
// its flat collective and the MPI library's own collective measured side by side in one run.
//
//   mpirun -np 8 build/bench/hsdp-bench -b 1M -e 64M -f 4 --op reducescatter --algo hier,mpi
//
// size is the whole buffer in bytes (all-gather: the gathered result, reduce-scatter: the input,
// all-reduce: the buffer); time is the median over iterations of the slowest rank; algbw =
// size / time; busbw = algbw * (n-1)/n for all-gather and reduce-scatter, 2(n-1)/n for
// all-reduce (docs/collectives.md).
#include <dirent.h>
#include <unistd.h>
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "cli.h"
#include "collectives/mpi/mpi_comm.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/host_buffer.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/topology.h"

namespace {

using hsdp::DType;
using hsdp::RedOp;

struct Options {
  std::string min_bytes = "1M", max_bytes = "64M";
  double factor = 2;
  int iters = 10, warmup = 3, check = 1;
  std::string op = "allgather", algo = "hier,mpi", dtype = "float", inter_dtype = "";
  int chunks = 32;
  std::string min_chunk = "1M";  // below ~1 MiB per chunk, per-chunk latency dominates here
  bool json = false;
};


std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// Small integers: exact in float and bf16 whatever the summation order, so #wrong is exact.
float value(int rank, size_t i) { return float(((rank + 1) * (i % 13 + 3)) % 17 % 9); }

struct Bench {
  hsdp::Comm& world;
  MPI_Comm raw;
  MPI_Comm shard_order;  // the world ordered by shard index k: hier's result layout
  hsdp::HierarchicalCollectives& hier;
  DType dtype;
  size_t es;
  hsdp::HostBuffer send, recv, expect;

  void fill(void* buf, size_t n, int rank) {
    for (size_t i = 0; i < n; ++i) {
      float v = value(rank, i);
      if (dtype == DType::kFloat32) static_cast<float*>(buf)[i] = v;
      else static_cast<hsdp::bf16*>(buf)[i] = hsdp::toBf16(v);
    }
  }

  // Runs one operation; `count` is the whole buffer's element count.
  hsdp::Status run(const std::string& op, const std::string& algo, size_t count) {
    const int n = world.size();
    const size_t per = count / n;
    MPI_Datatype mt = dtype == DType::kFloat32 ? MPI_FLOAT : MPI_UINT16_T;
    if (op == "allgather") {
      void* mine = send.data();
      if (algo == "hier") return hier.allGather(mine, recv.data(), per, dtype);
      if (algo == "flat") return world.allGather(mine, recv.data(), per, dtype);
      MPI_Allgather(mine, int(per), mt, recv.data(), int(per), mt, raw);
      return hsdp::okStatus();
    }
    if (op == "reducescatter") {
      if (algo == "hier") return hier.reduceScatter(send.data(), recv.data(), per, dtype, RedOp::kSum);
      if (algo == "flat") return world.reduceScatter(send.data(), recv.data(), per, dtype, RedOp::kSum);
      if (dtype != DType::kFloat32) return hsdp::unimplemented("MPI has no bf16 reduce-scatter");
      MPI_Reduce_scatter_block(send.data(), recv.data(), int(per), MPI_FLOAT, MPI_SUM, raw);
      return hsdp::okStatus();
    }
    std::memcpy(recv.data(), send.data(), count * es);  // all-reduce is in place
    if (algo == "hier") return hier.allReduce(recv.data(), count, dtype, RedOp::kSum);
    if (algo == "flat") return world.allReduce(recv.data(), count, dtype, RedOp::kSum);
    if (dtype != DType::kFloat32) return hsdp::unimplemented("MPI has no bf16 all-reduce");
    MPI_Allreduce(MPI_IN_PLACE, recv.data(), int(count), MPI_FLOAT, MPI_SUM, raw);
    return hsdp::okStatus();
  }

  // Elements of this rank's result that differ from the MPI library's float answer.
  // (hier lays shards out by shard index k, so its oracle runs on the k-ordered communicator.)
  long wrong(const std::string& op, const std::string& algo, size_t count) {
    const int n = world.size(), r = world.rank();
    MPI_Comm raw = algo == "hier" ? shard_order : this->raw;
    const size_t per = count / n;
    std::vector<float> in(op == "allgather" ? per : count);
    for (size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
    std::vector<float> want(op == "reducescatter" ? per : count);
    if (op == "allgather")
      MPI_Allgather(in.data(), int(per), MPI_FLOAT, want.data(), int(per), MPI_FLOAT, raw);
    else if (op == "reducescatter")
      MPI_Reduce_scatter_block(in.data(), want.data(), int(per), MPI_FLOAT, MPI_SUM, raw);
    else
      MPI_Allreduce(in.data(), want.data(), int(count), MPI_FLOAT, MPI_SUM, raw);
    long bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      float got = dtype == DType::kFloat32 ? recv.as<float>()[i]
                                           : hsdp::toFloat(recv.as<hsdp::bf16>()[i]);
      if (got != want[i]) ++bad;
    }
    return bad;
  }
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
  std::vector<std::string> algos = split(o.algo);
  for (const auto& a : algos)
    if (a != "hier" && a != "flat" && a != "mpi")
      return fail(rank, hsdp::strCat("--algo '", a, "' is not hier, flat or mpi"));

  auto layout = hsdp::groupRanksIntoNodes(world);
  if (!layout.ok()) return fail(rank, layout.status().message());
  // The whole world is one shard group: intra = every rank of a node, inter = every node.
  auto mesh = hsdp::Mesh::create(world, *layout, {layout->ranks_per_node, layout->num_nodes});
  if (!mesh.ok()) return fail(rank, mesh.status().message());
  hsdp::HierarchicalCollectives hier((*mesh)->intraShard(), (*mesh)->interShard());
  hsdp::HierOptions hopts{o.chunks, *dt};
  if (o.min_chunk != "0") {
    auto min_chunk = hsdp::parseByteSize(o.min_chunk, "--min-chunk-bytes");
    if (!min_chunk.ok()) return fail(rank, min_chunk.status().message());
    hopts.min_chunk_bytes = *min_chunk;
  }
  if (!o.inter_dtype.empty()) {
    auto w = hsdp::parseDType(o.inter_dtype);
    if (!w.ok()) return fail(rank, w.status().message());
    hopts.inter_dtype = *w;
  }
  if (auto s = hier.setOptions(hopts); !s.ok()) return fail(rank, s.message());

  const size_t es = hsdp::dtypeSize(*dt);
  // Buffers for the largest size, allocated and pre-faulted once.
  const size_t max_count = (*hi / es + n - 1) / n * n;
  // Two buffers of the largest size: refused with the limit named, not killed by the kernel.
  if (auto b = hsdp::checkedAllocation(max_count, 2 * es, hsdp::strCat("-e ", o.max_bytes)); !b.ok())
    return fail(rank, b.status().message());
  auto send = hsdp::HostBuffer::allocate(max_count * es);
  auto recv = hsdp::HostBuffer::allocate(max_count * es);
  if (!send.ok() || !recv.ok()) return fail(rank, "out of host memory for the buffers");
  MPI_Comm raw = dynamic_cast<hsdp::mpi::MpiComm&>(world).raw();
  if (auto s = hier.reserve(max_count / n, *dt); !s.ok()) return fail(rank, s.message());
  if (auto s = world.reserveScratch(max_count / n * es); !s.ok()) return fail(rank, s.message());
  MPI_Comm shard_order = dynamic_cast<hsdp::mpi::MpiComm&>((*mesh)->shardGroup()).raw();
  Bench b{world, raw, shard_order, hier, *dt, es, std::move(*send), std::move(*recv), {}};
  b.fill(b.send.data(), max_count, rank);

  const double bus = o.op == "allreduce" ? 2.0 * (n - 1) / n : double(n - 1) / n;
  if (rank == 0 && !o.json) {
    std::printf("# hsdp-bench: op %s, dtype %s, %d ranks = %d nodes x %d, iters %d, warmup %d, "
                "pipeline chunks %d (each >= %zu B), inter dtype %s\n",
                o.op.c_str(), o.dtype.c_str(), n, layout->num_nodes, layout->ranks_per_node,
                o.iters, o.warmup, hopts.chunks, hopts.min_chunk_bytes,
                hsdp::dtypeName(hopts.inter_dtype));
    for (int q = 0; q < n; ++q)
      std::printf("#  rank %2d  node %d (%s)\n", q, layout->node_of_rank[q],
                  layout->node_names[layout->node_of_rank[q]].c_str());
    std::printf("#\n# %10s %12s %6s %6s %5s %11s %8s %8s %7s %9s %9s\n", "size", "count",
                "type", "redop", "algo", "time", "algbw", "busbw", "#wrong", "xnode", "xnode_min");
    std::printf("# %10s %12s %6s %6s %5s %11s %8s %8s %7s %9s %9s\n", "(B)", "(elements)", "", "",
                "", "(us)", "(GB/s)", "(GB/s)", "", "(MB/op)", "(MB/op)");
  }
  std::string json = "[";
  for (double bytes = double(*lo); bytes <= double(*hi) * 1.0001; bytes *= o.factor) {
    const size_t count = std::max<size_t>(n, size_t(bytes) / es / n * n);
    std::map<std::string, double> median_us;
    // The algorithms take turns iteration by iteration (warm-ups first), so a noisy spell on
    // this shared machine hits all of them alike and the ratios compare like with like.
    const bool leader = layout->local_rank_of_rank[rank] == 0;
    std::map<std::string, std::vector<double>> times;
    std::map<std::string, double> tx_bytes;
    std::map<std::string, hsdp::Status> status;
    std::map<std::string, long> wrong;  // checked right after the algorithm's last run
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      for (const std::string& algo : algos) {
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
      // Least traffic between N nodes: every node must receive the (N-1)/N of the result it
      // does not hold (all-gather, reduce-scatter), twice over for all-reduce.
      const double N = layout->num_nodes;
      const double tx_min = (o.op == "allreduce" ? 2.0 : 1.0) * (N - 1) * count * es;
      long bad = wrong[algo], total_bad = 0;
      MPI_Allreduce(&bad, &total_bad, 1, MPI_LONG, MPI_SUM, raw);
      std::vector<double>& ts = times[algo];
      std::sort(ts.begin(), ts.end());
      const double t = ts[ts.size() / 2];
      const size_t size = count * es;
      const double algbw = size / t / 1e9;
      median_us[algo] = t * 1e6;
      if (rank == 0) {
        if (o.json) {
          json += hsdp::strCat(json.size() > 1 ? "," : "", "{\"op\":\"", o.op, "\",\"algo\":\"",
                               algo, "\",\"size\":", size, ",\"count\":", count, ",\"type\":\"",
                               o.dtype, "\",\"time_us\":", t * 1e6, ",\"algbw\":", algbw,
                               ",\"busbw\":", algbw * bus, ",\"wrong\":", total_bad,
                               ",\"xnode_bytes\":", tx_all, ",\"xnode_min_bytes\":", tx_min, "}");
        } else {
          std::printf("  %10zu %12zu %6s %6s %5s %11.1f %8.3f %8.3f %7ld %9.2f %9.2f\n", size,
                      count, o.dtype.c_str(), o.op == "allgather" ? "none" : "sum", algo.c_str(),
                      t * 1e6, algbw, algbw * bus, total_bad, tx_all / 1e6, tx_min / 1e6);
        }
      }
    }
    if (rank == 0 && !o.json && median_us.count("mpi"))
      for (auto& [algo, us] : median_us)
        if (algo != "mpi")
          std::printf("# %zu B: %s is %.2fx the speed of mpi\n", count * es, algo.c_str(),
                      median_us["mpi"] / us);
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
  hsdp::cli::addByteSize(app, "-b,--minbytes", o.min_bytes, "Smallest size (bytes; K, M, G suffixes)");
  hsdp::cli::addByteSize(app, "-e,--maxbytes", o.max_bytes, "Largest size");
  // At most 1024 and 10^6: a factor of at least 1.001 and bounded counts keep a run finite.
  hsdp::cli::addReal(app, "-f,--stepfactor", o.factor, "Size multiplier between rows",
                     hsdp::RealRange::closed(1.001, 1024));
  hsdp::cli::addInt(app, "-n,--iters", o.iters, "Timed iterations per size (median reported)", 1,
                    1000000);
  hsdp::cli::addInt(app, "-w,--warmup_iters", o.warmup, "Untimed iterations per size", 0, 1000000);
  hsdp::cli::addInt(app, "-c,--check", o.check, "Check results against the MPI library (0/1)", 0, 1);
  app.add_option("--op", o.op, "allgather | reducescatter | allreduce")
      ->check(CLI::IsMember({"allgather", "reducescatter", "allreduce"}));
  app.add_option("--algo", o.algo, "Comma list of hier, flat, mpi (mpi: the library's own)");
  app.add_option("--dtype", o.dtype, "float | bf16");
  app.add_option("--inter-dtype", o.inter_dtype, "Wire type across nodes for hier: float | bf16");
  hsdp::cli::addInt(app, "--chunks", o.chunks, "Pipeline chunks of the hierarchical schedule", 1,
                    4096);
  app.add_option("--min-chunk-bytes", o.min_chunk,
                 "Smallest pipeline chunk of the full buffer (fewer chunks below; 0: off)");
  app.add_flag("--json", o.json, "One JSON array instead of the table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rank = (*world)->rank();
    return hsdp::cli::reportParseError(app, e, "hsdp-bench", rank, rank == 0);
  }
  return benchMain(o, **world);
}
