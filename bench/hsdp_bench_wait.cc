#include "bench/hsdp_bench_wait.h"

#include <mpi.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "collectives/mpi/mpi_comm.h"
#include "core/progress.h"
#include "hsdp/parse.h"
#include "hsdp/transport_registry.h"

namespace hsdp_bench {
namespace {

using Clock = std::chrono::steady_clock;

double cpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Times a thread of this process went to sleep (a wait that spins, yielding or not, adds none).
long sleepsSoFar() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_nvcsw;
}

// Work the compiler cannot drop: rank 0's compute while the others wait.
double compute(std::chrono::milliseconds d) {
  const auto end = Clock::now() + d;
  double x = 1;
  while (Clock::now() < end)
    for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
  return x;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct Share {
  double cpu = 0;     // CPU share of the wait (rank 0: of its compute)
  double sleeps = 0;  // voluntary context switches per second of the wait
};

// One round: this rank's CPU share of its wait; rank 0's, of its compute (what the waiters left
// it: 100% on a core of its own).
hsdp::StatusOr<Share> round(hsdp::Comm& c, MPI_Comm raw, bool blocking, std::vector<float>& buf,
                            int wait_ms) {
  MPI_Barrier(raw);
  double compute_share = 0;
  if (c.rank() == 0) {
    const double cpu = cpuSeconds();
    const auto t = Clock::now();
    volatile double sink = compute(std::chrono::milliseconds(wait_ms));
    (void)sink;
    compute_share = (cpuSeconds() - cpu) / std::chrono::duration<double>(Clock::now() - t).count();
  }
  const double cpu0 = cpuSeconds();
  const long sleeps0 = sleepsSoFar();
  const auto t0 = Clock::now();
  hsdp::Status s;
  if (blocking) {
    s = c.allReduce(buf.data(), buf.size(), hsdp::DType::kFloat32, hsdp::RedOp::kSum);
  } else {
    auto w = c.iallReduce(buf.data(), buf.size(), hsdp::DType::kFloat32, hsdp::RedOp::kSum);
    s = w.ok() ? (*w)->wait() : w.status();
  }
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cpu = cpuSeconds() - cpu0;
  const double sleeps = double(sleepsSoFar() - sleeps0) / wall;
  if (!s.ok()) return s;
  if (c.rank() == 0) return Share{compute_share, 0};
  return Share{cpu / wall, sleeps};
}

}  // namespace

int waitCpuMain(const WaitCpuOptions& o, hsdp::Comm& world) {
  const int rank = world.rank(), n = world.size();
  auto fail = [rank](const std::string& m) {
    std::fprintf(stderr, "hsdp-bench [rank %d]: error: %s\n", rank, m.c_str());
    return 2;
  };
  if (n < 2) return fail("--wait-cpu needs at least 2 ranks (one computes, the others wait)");
  auto names = hsdp::parseList(o.transports, "--wait-transports");
  if (!names.ok()) return fail(names.status().message());
  MPI_Comm raw = dynamic_cast<hsdp::mpi::MpiComm&>(world).raw();
  std::vector<float> buf(std::max<size_t>(1, o.bytes / sizeof(float)), 1.0f);
  if (rank == 0)
    std::printf(
        "# hsdp-bench --wait-cpu: %d ranks, rank 0 computes %d ms then joins an all-reduce of "
        "%zu B; the others' CPU time (all threads) over their wait, as %% of one core; progress "
        "thread %s; medians of %d rounds. r0_cpu%%: rank 0's CPU share of its compute (100: the "
        "waiters left it a core); min_sleep/s: the fewest times per second a waiter's threads "
        "went to sleep (a spinning wait: ~0)\n#\n# %9s %9s %9s %9s %9s %11s %9s\n",
        n, o.wait_ms, buf.size() * sizeof(float), hsdp::progress_thread::running() ? "on" : "off",
        o.rounds, "transport", "call", "mean_cpu%", "max_cpu%", "r0_cpu%", "min_sleep/s",
        "wait_ms");
  int exceeded = 0;
  for (const std::string& name : *names) {
    auto boot = world.split(0, rank);
    if (!boot.ok()) return fail(boot.status().message());
    auto comm = hsdp::createTransport(name, std::move(*boot));
    if (!comm.ok()) return fail(comm.status().message());
    for (bool blocking : {false, true}) {
      std::vector<double> means, maxes, r0, sleeps;
      for (int r = 0; r < o.rounds; ++r) {
        auto share = round(**comm, raw, blocking, buf, o.wait_ms);
        if (!share.ok()) return fail(share.status().toString());
        const double mine[2] = {share->cpu, share->sleeps};
        std::vector<double> all(2 * n);
        MPI_Gather(mine, 2, MPI_DOUBLE, all.data(), 2, MPI_DOUBLE, 0, raw);
        if (rank != 0) continue;
        double sum = 0, worst = 0, fewest = all[3];
        for (int q = 1; q < n; ++q) {
          sum += all[2 * q];
          worst = std::max(worst, all[2 * q]);
          fewest = std::min(fewest, all[2 * q + 1]);
        }
        means.push_back(100 * sum / (n - 1));
        maxes.push_back(100 * worst);
        r0.push_back(100 * all[0]);
        sleeps.push_back(fewest);
        if (fewest < o.min_sleeps_per_s) {
          std::fprintf(stderr,
                       "hsdp-bench: %s %s: a waiting rank slept %.0f times a second, below "
                       "--wait-min-sleeps %.0f (it spun)\n",
                       name.c_str(), blocking ? "allReduce" : "iallReduce+wait", fewest,
                       o.min_sleeps_per_s);
          exceeded = 1;
        }
        if (o.max_cpu_percent > 0 && 100 * worst > o.max_cpu_percent) {
          std::fprintf(stderr,
                       "hsdp-bench: %s %s: a waiting rank used %.1f%% of a core, above "
                       "--wait-max-cpu %.1f%%\n",
                       name.c_str(), blocking ? "allReduce" : "iallReduce+wait", 100 * worst,
                       o.max_cpu_percent);
          exceeded = 1;
        }
      }
      if (rank == 0)
        std::printf("  %9s %9s %9.1f %9.1f %9.1f %11.0f %9d\n", name.c_str(),
                    blocking ? "blocking" : "nonblock", median(means), median(maxes), median(r0),
                    median(sleeps), o.wait_ms);
    }
  }
  MPI_Bcast(&exceeded, 1, MPI_INT, 0, raw);
  return exceeded;
}

}  // namespace hsdp_bench
