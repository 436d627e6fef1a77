// watchdog_bench: what the watchdog adds to each collective, in nanoseconds, without the noise of
// a collective around it: CommTrace::enter (the fingerprint into the node table), a Label (the
// engine sets one per collective it starts) and a CommWait (every wait). Rounds interleave the
// measurements and the table shows medians over rounds (docs/reliability.md). One process:
//
//   mpirun -np 1 build/bench/watchdog_bench [--rounds 9] [--calls 2000000]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/watchdog/watchdog.h"
#include "hsdp/cli.h"
#include "hsdp/mpi.h"

namespace {

using Clock = std::chrono::steady_clock;

// ns per call of `f`, over `calls` calls.
double perCall(long calls, const std::function<void(long)>& f) {
  const auto t0 = Clock::now();
  f(calls);
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / calls;
}

}  // namespace

int main(int argc, char** argv) {
  long rounds = 9;
  long calls = 2000000;
  CLI::App app{"What the watchdog adds per collective and per wait, in ns", "watchdog_bench"};
  hsdp::cli::addInt(app, "--rounds", rounds, "Rounds (medians over these)", 1L, 1000L);
  hsdp::cli::addInt(app, "--calls", calls, "Calls timed per round", 1L, 1000000000L);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, "watchdog_bench", -1, true);
  }
  auto session = hsdp::mpi::Session::init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "watchdog_bench: %s\n", session.status().toString().c_str());
    return 2;
  }
  if (*hsdp::watchdog::config().check_collectives) {
    std::fprintf(stderr,
                 "watchdog_bench: measures the unchecked path; unset HSDP_CHECK_COLLECTIVES\n");
    return 2;
  }
  // A trace of a (pretend) two-rank communicator: the table slot is this rank's own.
  auto trace = hsdp::traceComm({0, 1}, 0, nullptr);
  if (!trace.ok() || *trace == nullptr) {
    std::fprintf(stderr, "watchdog_bench: no trace (is HSDP_WATCHDOG=0?)\n");
    return 2;
  }
  hsdp::CommTrace& t = **trace;
  volatile uint64_t sink = 0;
  struct Row {
    const char* what;
    std::function<void(long)> run;
    std::vector<double> ns;
  };
  std::vector<Row> rows = {
      {"empty loop (the measurement's own cost)",
       [&](long n) {
         for (long i = 0; i < n; ++i) sink = sink + 1;
       },
       {}},
      {"CommTrace::enter (fingerprint into the table)",
       [&](long n) {
         for (long i = 0; i < n; ++i)
           sink = t.enter(hsdp::OpKind::kAllGather, 1000, hsdp::DType::kFloat32);
       },
       {}},
      {"watchdog::Label (per engine collective)",
       [&](long n) {
         for (long i = 0; i < n; ++i) {
           hsdp::watchdog::Label label("fc1", "shard group");
           sink = sink + 1;
         }
       },
       {}},
      {"watchdog::CommWait (per wait)",
       [&](long n) {
         for (long i = 0; i < n; ++i) {
           hsdp::watchdog::CommWait wait(&t, 7, "wait");
           sink = sink + 1;
         }
       },
       {}},
  };
  for (long r = 0; r < rounds; ++r)
    for (size_t k = 0; k < rows.size(); ++k) {
      Row& row = rows[(k + r) % rows.size()];
      row.ns.push_back(perCall(calls, row.run));
    }
  std::printf("# watchdog_bench: %ld rounds of %ld calls, median ns per call (watchdog %s)\n",
              rounds, calls, hsdp::watchdog::running() ? "running" : "not running");
  for (Row& row : rows) {
    std::sort(row.ns.begin(), row.ns.end());
    std::printf("  %-48s %8.1f ns\n", row.what, row.ns[row.ns.size() / 2]);
  }
  return 0;
}
