// Checkpoint throughput against the filesystem's own ceiling, in one run (docs/checkpoint.md):
//   save      ShardedModel::save of the whole model state (fp32 masters + both Adam moments)
//   load      ShardedModel::load of it, page cache dropped first (posix_fadvise DONTNEED)
//   ceiling   the same bytes written sequentially by one process (8 MiB writes, then fsync) and
//             read back cold, on the same filesystem, through the page cache and around it
//             (O_DIRECT, like dd oflag=direct / iflag=direct); and the same per rank in
//             parallel. A ratio is against the faster of the two one-process ceilings.
//   async     step time with saveAsync after every step vs without saving, and vs a plain
//             O_DIRECT write of each rank's share beside every step (the floor here); rounds of
//             three blocks of --steps steps, order rotating, --blocks rounds; medians of ratios
// Medians of --repeats. Run it under mpirun, e.g. 8 ranks as 2 virtual nodes x 4:
//   mpirun -np 8 -x HSDP_RANKS_PER_NODE=4 build/bench/ckpt_bench --dir /tmp/ckpt-bench --gib 1
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "hsdp/cli.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"

using namespace hsdp;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void dropCache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void dropCacheTree(const std::string& dir) {
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) dropCache(e.path().string());
}

// An 8 MiB block on a page boundary (what O_DIRECT needs of memory), reused by every ceiling.
struct Block {
  Block() : p(static_cast<char*>(std::aligned_alloc(4096, size))) { std::memset(p, 'x', size); }
  ~Block() { std::free(p); }
  static constexpr size_t size = 8 << 20;
  char* p;
};

// With `direct`, O_DIRECT where the filesystem has it (whole blocks: `bytes` is rounded up to
// 4 KiB); else through the page cache.
int openFile(const std::string& path, int flags, bool direct) {
  int fd = direct ? ::open(path.c_str(), flags | O_DIRECT, 0644) : -1;
  return fd >= 0 ? fd : ::open(path.c_str(), flags, 0644);
}

// One process writes `bytes` to `path` in 8 MiB writes and fsyncs; returns seconds.
double writeFile(const std::string& path, uint64_t bytes, const Block& block, bool direct) {
  const auto t0 = Clock::now();
  int fd = openFile(path, O_WRONLY | O_CREAT | O_TRUNC, direct);
  bytes = (bytes + 4095) / 4096 * 4096;
  for (uint64_t at = 0; at < bytes; at += block.size)
    if (::write(fd, block.p, std::min<uint64_t>(block.size, bytes - at)) < 0) break;
  ::fsync(fd);
  ::close(fd);
  return since(t0);
}

double readFile(const std::string& path, Block& block, bool direct) {
  dropCache(path);
  const auto t0 = Clock::now();
  int fd = openFile(path, O_RDONLY, direct);
  while (::read(fd, block.p, block.size) > 0) {
  }
  ::close(fd);
  return since(t0);
}

Status trainStep(ShardedModel& m, int rank, int step) {
  std::vector<int> order(m.numUnits());
  for (int u = 0; u < m.numUnits(); ++u) order[u] = u;
  HSDP_RETURN_IF_ERROR(forwardUnits(m, order, [](int) { return okStatus(); }));
  return backwardUnits(
      m, order,
      [&](int u) -> Status {
        HSDP_ASSIGN_OR_RETURN(ParamView g, m.grad(u, "weight"));
        std::fill(g.data, g.data + g.numel, 1e-3f * float(1 + (rank + step + u) % 5));
        return okStatus();
      },
      true);
}

int run(Comm& world, const std::string& dir, double gib, int repeats, int units, int steps,
        int blocks, bool keep) {
  const int rank = world.rank();
  auto layout = groupRanksIntoNodes(world);
  if (!layout.ok()) return 2;
  auto mesh = Mesh::create(world, *layout, {layout->ranks_per_node, layout->num_nodes});
  if (!mesh.ok()) {
    std::fprintf(stderr, "%s\n", mesh.status().toString().c_str());
    return 2;
  }
  EngineConfig cfg;
  cfg.mode = ShardMode::kZero3;
  auto model_or = ShardedModel::create(**mesh, cfg);
  if (!model_or.ok()) return 2;
  ShardedModel& model = **model_or;
  const int64_t per_unit = static_cast<int64_t>(gib * (1 << 30) / 12 / units);  // 3 fp32 arrays
  // This rank: its 1/world of the state, the snapshot of it, and one unit's values to set.
  const uint64_t need =
      uint64_t(gib * (1 << 30)) / uint64_t(world.size()) * 2 + uint64_t(per_unit) * 4;
  if (auto b = checkedAllocation(need, 1, strCat("--gib ", gib, " --units ", units)); !b.ok()) {
    std::fprintf(stderr, "ckpt_bench [rank %d]: error: %s\n", rank,
                 std::string(b.status().message()).c_str());
    return 2;
  }
  for (int u = 0; u < units; ++u)
    if (!model.addUnit("u" + std::to_string(u), {{"weight", {per_unit}}}).ok()) return 2;
  if (!model.finalize().ok()) return 2;
  {
    std::vector<float> v(per_unit);
    for (int u = 0; u < units; ++u) {
      for (int64_t i = 0; i < per_unit; ++i) v[i] = 0.001f * float((i * 7 + u) % 1000);
      if (!model.setParameter(u, "weight", v.data(), v.size()).ok()) return 3;
    }
  }
  if (!trainStep(model, rank, 0).ok() || !model.step().ok()) return 3;  // moments non-zero
  if (rank == 0) std::filesystem::create_directories(dir);
  (void)world.barrier();
  const std::string root = dir + "/ckpt";
  std::vector<double> save_s, load_s, w1_s, r1_s, w1d_s, r1d_s, wp_s, rp_s;
  uint64_t bytes = 0;
  Block block;
  for (int rep = 0; rep < repeats; ++rep) {
    (void)world.barrier();
    auto t0 = Clock::now();
    auto r = model.save(root, {.name = "bench", .keep_last = 1});
    (void)world.barrier();
    save_s.push_back(since(t0));
    if (!r.ok()) {
      std::fprintf(stderr, "save: %s\n", r.status().toString().c_str());
      return 3;
    }
    bytes = r->bytes;
    if (rank == 0) dropCacheTree(root + "/bench");
    (void)world.barrier();
    t0 = Clock::now();
    auto l = model.load(root + "/bench");
    (void)world.barrier();
    load_s.push_back(since(t0));
    if (!l.ok()) {
      std::fprintf(stderr, "load: %s\n", l.status().toString().c_str());
      return 3;
    }
    // Ceilings: one sequential writer of the same bytes; every rank its share in parallel.
    const std::string one = dir + "/ceiling.bin";
    if (rank == 0) {
      w1_s.push_back(writeFile(one, bytes, block, false));
      r1_s.push_back(readFile(one, block, false));
      std::filesystem::remove(one);
      w1d_s.push_back(writeFile(one, bytes, block, true));
      r1d_s.push_back(readFile(one, block, true));
      std::filesystem::remove(one);
    }
    (void)world.barrier();
    const std::string mine = dir + "/ceiling-" + std::to_string(rank) + ".bin";
    t0 = Clock::now();
    writeFile(mine, bytes / world.size(), block, false);
    (void)world.barrier();
    wp_s.push_back(since(t0));
    dropCache(mine);
    (void)world.barrier();
    t0 = Clock::now();
    {
      int fd = ::open(mine.c_str(), O_RDONLY);
      while (::read(fd, block.p, block.size) > 0) {
      }
      ::close(fd);
    }
    (void)world.barrier();
    rp_s.push_back(since(t0));
    std::filesystem::remove(mine);
  }
  // Step time of three kinds of block of --steps steps: without saving; with saveAsync after
  // every step; and with a plain direct write of this rank's share of the checkpoint's bytes
  // (8 MiB writes from one buffer, then fsync: no copy, no hash, no commit) on a thread started
  // where saveAsync is and joined where the next one would wait. The last kind is the same disk
  // traffic as an async save without any of its work: the floor an async save can reach on this
  // machine. Blocks are timed in the steady state: one untimed step starts the first save
  // (write) and the last one finishes untimed after the block, so every timed step carries one
  // save's background work and one save's blocking part. The machine drifts by more than the
  // effect over a minute, so a round is one block of each kind back to back (the order rotating
  // round by round, --blocks rounds) and a ratio is the median of the rounds' ratios.
  enum Kind { kPlain, kAsync, kBeside };
  std::vector<double> plain, async, beside, async_ratio, beside_ratio, vs_beside, snap, write;
  Block wblock;
  std::jthread writer;  // joins on every way out of run(), an early error return included
  const std::string wpath = dir + "/beside-" + std::to_string(rank) + ".bin";
  int step = 1;
  auto oneStep = [&](Kind kind) -> bool {
    if (!trainStep(model, rank, step++).ok() || !model.step().ok()) return false;
    if (kind == kBeside) {
      if (writer.joinable()) writer.join();
      writer = std::jthread([&] { writeFile(wpath, bytes / world.size(), wblock, true); });
    }
    if (kind != kAsync) return true;
    if (model.saveInFlight()) {  // what saveAsync would wait for anyway
      auto r = model.waitForSave();
      if (!r.ok()) return false;
      snap.push_back(r->snapshot_seconds);
      write.push_back(r->seconds);
    }
    return model.saveAsync(root + "-async", {.keep_last = 1}).ok();
  };
  auto timeBlock = [&](Kind kind) -> double {
    if (kind != kPlain && !oneStep(kind)) return -1;
    (void)world.barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i)
      if (!oneStep(kind)) return -1;
    (void)world.barrier();
    const double t = since(t0) / steps;
    if (writer.joinable()) writer.join();
    if (model.saveInFlight() && !model.waitForSave().ok()) return -1;
    return t;
  };
  for (int b = 0; b < blocks; ++b) {
    double t[3] = {0, 0, 0};
    for (int k = 0; k < 3; ++k) {
      const Kind kind = static_cast<Kind>((b + k) % 3);
      t[kind] = timeBlock(kind);
      if (t[kind] < 0) return 3;
    }
    plain.push_back(t[kPlain]);
    async.push_back(t[kAsync]);
    beside.push_back(t[kBeside]);
    async_ratio.push_back(t[kAsync] / t[kPlain]);
    beside_ratio.push_back(t[kBeside] / t[kPlain]);
    vs_beside.push_back(t[kAsync] / t[kBeside]);
  }
  std::filesystem::remove(wpath);
  if (model.saveInFlight() && !model.waitForSave().ok()) return 3;
  if (rank == 0) std::filesystem::remove_all(root + "-async");
  if (rank == 0 && !keep) std::filesystem::remove_all(root);
  if (rank == 0) {
    const double gb = bytes / 1e9;
    std::printf(
        "checkpoint benchmark: %d ranks (%s), %d units, %.3f GB of model state "
        "(fp32 params + 2 Adam moments), %d repeats, medians; filesystem of %s; the "
        "machine is shared (2 cores), so absolute numbers vary\n\n",
        world.size(), (*mesh)->describe().c_str(), units, gb, repeats, dir.c_str());
    std::printf("%-44s %10s %10s %10s\n", "", "seconds", "GB/s", "vs ceiling");
    auto row = [&](const char* what, double s, double ceil) {
      std::printf("%-44s %10.3f %10.3f %10s\n", what, s, gb / s,
                  ceil > 0 ? (std::to_string(ceil / s).substr(0, 4) + "x").c_str() : "");
    };
    // Against the faster way of one process: the ceiling a user could have had with dd.
    const double w1 = std::min(median(w1_s), median(w1d_s));
    const double r1 = std::min(median(r1_s), median(r1d_s));
    row("ceiling: 1 process writes, fsync", median(w1_s), 0);
    row("ceiling: 1 process writes O_DIRECT, fsync", median(w1d_s), 0);
    row("ceiling: every rank writes 1/W, fsync", median(wp_s), 0);
    row("save (snapshot, write, fsync, commit)", median(save_s), w1);
    row("ceiling: 1 process reads (cold)", median(r1_s), 0);
    row("ceiling: 1 process reads O_DIRECT", median(r1d_s), 0);
    row("ceiling: every rank reads 1/W (cold)", median(rp_s), 0);
    row("load (cold: read, verify, install)", median(load_s), r1);
    std::vector<double> sorted = async_ratio;
    std::sort(sorted.begin(), sorted.end());
    std::printf(
        "\nstep time: %.3f s without saving, %.3f s with saveAsync after every step "
        "(%.2fx)\n",
        median(plain), median(async), median(async_ratio));
    std::printf(
        "  %d rounds of 3 blocks of %d steps, each round's ratio: min %.2fx, median %.2fx, "
        "max %.2fx\n",
        blocks, steps, sorted.front(), median(async_ratio), sorted.back());
    std::printf(
        "  floor: %.3f s with a plain O_DIRECT write of each rank's share beside every step "
        "(%.2fx); saveAsync is %.2fx of that\n",
        median(beside), median(beside_ratio), median(vs_beside));
    std::printf(
        "async save: %.3f s blocking (saveAsync itself), %.3f s until committed in the "
        "background\n",
        median(snap), median(write));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto session = mpi::Session::init(&argc, &argv);
  if (!session.ok()) return 2;
  auto world = (*session)->world();
  if (!world.ok()) return 2;
  CLI::App app{"checkpoint save/load throughput vs the filesystem", "ckpt_bench"};
  std::string dir = "/tmp/hsdp-ckpt-bench";
  double gib = 1.0;
  int repeats = 3, units = 16, steps = 3, blocks = 7;
  bool keep = false;
  app.add_option("--dir", dir, "Where to write (removed at the end)");
  // Bounded so that every size they make fits: 4 TiB of state, 10^4 units and repeats.
  hsdp::cli::addReal(app, "--gib", gib, "GiB of model state (params + 2 moments)",
                     hsdp::RealRange{0, 4096, true, false});
  hsdp::cli::addInt(app, "--repeats", repeats, "Repeats of save/load/ceilings", 1, 10000);
  hsdp::cli::addInt(app, "--units", units, "Units the model is split into", 1, 10000);
  hsdp::cli::addInt(app, "--steps", steps,
                    "Steps of a timed block (of each kind: no saving, saveAsync, plain write)", 1,
                    10000);
  hsdp::cli::addInt(app, "--blocks", blocks, "Rounds of timed blocks (one block of each kind)", 1,
                    10000);
  app.add_flag("--keep", keep, "Leave the checkpoint in DIR/ckpt/bench (bench/ckpt_bench.sh)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rank = (*world)->rank();
    return hsdp::cli::reportParseError(app, e, "ckpt_bench", rank, rank == 0);
  }
  int rc = run(**world, dir, gib, repeats, units, steps, blocks, keep);
  world->reset();
  return rc;
}
