// gpt_bench: what a training step of train_gpt costs, measured in one run, medians of repeats,
// the measurements interleaved round by round (the machine is shared: a slow spell hits every
// column of a round alike).
//
//   --part compute   one process, no engine: the model's forward + backward FLOP/s against
//                    Eigen's single-precision GEMM on a large square product, same thread (1)
//                    FLOPs: 6 N tokens (N: the parameters in matrix products, the tied head
//                    included) + attention's score and value products, counted over the full
//                    T x T square each head computes (12 L T^2 d per sequence, forward+backward)
//   --part overlap   under mpirun or tests/cluster/cluster.sh (e.g. 2 nodes x 1 rank at
//                    200mbit): the step alone in its parts: compute (the same forward+backward on
//                    local full parameters, no engine), communication (the engine's unit walk,
//                    reductions and step with no compute), and the real step with prefetch
//                    --prefetch (default 1) and with prefetch 0; hidden share of communication =
//                    1 - (step - compute) / comm
//   --part alone     under mpirun or cluster.sh: only the compute alone of every rank (the same
//                    forward+backward on local full parameters, no engine, no communication),
//                    the slowest rank per repeat, its median: "result compute_alone_ms=..."
//                    (bench/step_bench.sh's baseline for the step of the same processes)
//   --part sharding  under mpirun on one machine: tokens/s of mode none against zero3 over all
//                    ranks (one node: intra_shard = world), the same batch per rank
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "gpt/data.h"
#include "gpt/model.h"
#include "gpt/reference.h"
#include "gpt/trainer.h"
#include "hsdp/cli.h"
#include "hsdp/flags.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"

namespace {

struct Args {
  std::string part = "compute";
  std::string preset = "small";
  int batch = 8;  // sequences per rank
  int repeats = 5;
  int gemm = 2048;
  int intra = 1, inter = 2;
  int prefetch = 1;
  std::string data = gpt::kDefaultCorpus;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double seconds(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The slowest rank's time of fn (started together after a barrier).
hsdp::StatusOr<double> slowest(hsdp::Comm& world, const std::function<hsdp::Status()>& fn) {
  HSDP_RETURN_IF_ERROR(world.barrier());
  hsdp::Status s;
  const float t = static_cast<float>(seconds([&] { s = fn(); }));
  HSDP_RETURN_IF_ERROR(s);
  std::vector<float> all(world.size());
  HSDP_RETURN_IF_ERROR(world.allGather(&t, all.data(), 1, hsdp::DType::kFloat32));
  return *std::max_element(all.begin(), all.end());
}

// Full parameters and gradient buffers of every unit, local (no engine).
struct Local {
  std::vector<gpt::UnitInfo> units;
  std::vector<std::vector<float>> params, grads;
  explicit Local(const gpt::Config& c) : units(gpt::units(c)) {
    for (size_t u = 0; u < units.size(); ++u) {
      params.push_back(gpt::initUnit(c, static_cast<int>(u)));
      grads.emplace_back(params.back().size(), 0.0f);
    }
  }
};

double modelFlops(const gpt::Config& c, int sequences) {
  const double tokens = double(sequences) * c.context;
  return 6.0 * c.matmulParamCount() * tokens +
         12.0 * c.layers * double(c.context) * c.context * c.d_model * sequences;
}

int partCompute(const Args& a, const gpt::Config& c, const gpt::Corpus& corpus) {
  Local local(c);
  gpt::Model net(c, false);
  std::vector<int32_t> tokens, targets;
  gpt::fillBatch(corpus, c, 1, 0, 0, a.batch, &tokens, &targets);
  const int n = a.gemm;
  Eigen::MatrixXf A = Eigen::MatrixXf::Random(n, n), B = Eigen::MatrixXf::Random(n, n), C(n, n);
  auto model = [&] {
    gpt::modelGradients(net, local.units, local.params, a.batch, tokens.data(), targets.data(),
                        1.0f, &local.grads);
  };
  auto gemm = [&] { C.noalias() = A * B; };
  model(), gemm();  // warm-up: allocations, page faults
  std::vector<double> tm, tg;
  for (int r = 0; r < a.repeats; ++r) tg.push_back(seconds(gemm)), tm.push_back(seconds(model));
  const double gemm_rate = 2.0 * n * double(n) * n / median(tg);
  const double flops = modelFlops(c, a.batch);
  const double model_rate = flops / median(tm);
  std::printf(
      "compute efficiency, one process, 1 thread, %d repeats (medians), preset %s, %d x %d "
      "tokens per step\n",
      a.repeats, a.preset.c_str(), a.batch, c.context);
  std::printf("  Eigen sgemm %d^3:         %8.2f ms  %7.2f GFLOP/s\n", n, median(tg) * 1e3,
              gemm_rate / 1e9);
  std::printf("  model fwd+bwd (%.2f GFLOP): %8.2f ms  %7.2f GFLOP/s  %.0f tokens/s\n", flops / 1e9,
              median(tm) * 1e3, model_rate / 1e9, a.batch * double(c.context) / median(tm));
  std::printf("  model / GEMM rate: %.2f\n", model_rate / gemm_rate);
  std::printf("  (checksum %g)\n", double(C(0, 0)) + local.grads[0][0]);
  return 0;
}

// A mesh, an engine model and a trainer for one configuration.
struct Engine {
  gpt::Setup setup;
  std::unique_ptr<hsdp::Mesh> mesh;
  std::unique_ptr<hsdp::ShardedModel> model;
  std::unique_ptr<gpt::Trainer> trainer;
};

hsdp::Status makeEngine(hsdp::Comm& world, const hsdp::NodeLayout& layout, const gpt::Config& c,
                        const gpt::Corpus& corpus, const Args& a, hsdp::ShardMode mode, int intra,
                        int inter, Engine* e) {
  e->setup.model = c;
  e->setup.engine.mode = mode;
  e->setup.engine.adam.weight_decay = 0.1f;
  e->setup.engine.clip_norm = 1.0f;
  e->setup.mesh.intra_shard = intra;
  e->setup.mesh.inter_shard = inter;
  gpt::TrainSettings& t = e->setup.train;
  t.adam = e->setup.engine.adam;
  t.batch = a.batch * world.size();
  t.steps = 1000;
  t.clip_norm = 1.0f;
  t.schedule = {1e-3f, 1e-4f, 0, 1000};
  HSDP_ASSIGN_OR_RETURN(e->mesh, hsdp::Mesh::create(world, layout, e->setup.mesh));
  HSDP_ASSIGN_OR_RETURN(e->model, hsdp::ShardedModel::create(*e->mesh, e->setup.engine));
  e->trainer =
      std::make_unique<gpt::Trainer>(world, *e->model, e->setup, corpus, false, a.prefetch);
  return gpt::buildModel(*e->trainer);
}

// The engine's step with no compute: every unit gathered in forward and backward as the
// schedule does, every gradient reduced (zeros), the optimizer step.
hsdp::Status commOnly(gpt::Trainer& t) {
  auto nothing = [](int) { return hsdp::okStatus(); };
  HSDP_RETURN_IF_ERROR(hsdp::forwardUnits(t.model, t.order, nothing, t.schedule));
  HSDP_RETURN_IF_ERROR(hsdp::backwardUnits(
      t.model, t.order,
      [&](int u) -> hsdp::Status {
        for (const hsdp::ParamSpec& p : t.units[u].params)
          HSDP_RETURN_IF_ERROR(t.model.grad(u, p.name).status());
        return hsdp::okStatus();
      },
      true, t.schedule));
  return t.model.step();
}

int partOverlap(const Args& a, hsdp::Comm& world, const hsdp::NodeLayout& layout,
                const gpt::Config& c, const gpt::Corpus& corpus) {
  Engine e;
  if (hsdp::Status s =
          makeEngine(world, layout, c, corpus, a, hsdp::ShardMode::kZero3, a.intra, a.inter, &e);
      !s.ok()) {
    std::fprintf(stderr, "gpt_bench [rank %d]: %s\n", world.rank(), s.toString().c_str());
    return 2;
  }
  gpt::Trainer& t = *e.trainer;
  Local local(c);
  gpt::Model net(c, false);
  std::vector<int32_t> tokens, targets;
  gpt::fillBatch(corpus, c, 1, 0, world.rank() * a.batch, a.batch, &tokens, &targets);
  int step = 0;
  auto compute = [&]() -> hsdp::Status {
    gpt::modelGradients(net, local.units, local.params, a.batch, tokens.data(), targets.data(),
                        1.0f, &local.grads);
    return hsdp::okStatus();
  };
  auto comm = [&]() { return commOnly(t); };
  auto full = [&](int prefetch) {
    return [&, prefetch]() -> hsdp::Status {
      t.schedule.prefetch = prefetch;
      return gpt::trainStep(t, step++).status();
    };
  };
  std::vector<double> tc, tm, ts, t0, xs, x0;
  auto run = [&](const std::function<hsdp::Status()>& fn, std::vector<double>* out,
                 std::vector<double>* exposed) -> bool {
    e.model->takeExposedCommSeconds();
    auto s = slowest(world, fn);
    if (!s.ok()) {
      std::fprintf(stderr, "gpt_bench [rank %d]: %s\n", world.rank(),
                   s.status().toString().c_str());
      world.abortJob(3);
    }
    if (out) out->push_back(*s);
    const float mine = static_cast<float>(e.model->takeExposedCommSeconds());
    std::vector<float> all(world.size());
    if (!world.allGather(&mine, all.data(), 1, hsdp::DType::kFloat32).ok()) world.abortJob(3);
    if (exposed) exposed->push_back(*std::max_element(all.begin(), all.end()));
    return true;
  };
  run(full(a.prefetch), nullptr, nullptr);  // warm-up: allocation, first gathers
  run(compute, nullptr, nullptr);
  for (int r = 0; r < a.repeats; ++r) {
    run(compute, &tc, nullptr);
    run(comm, &tm, nullptr);
    run(full(a.prefetch), &ts, &xs);
    run(full(0), &t0, &x0);
  }
  // The hidden share per round (that round's compute, comm and step: a slow spell of the shared
  // machine moves all three), then its median and range over the rounds.
  auto shares = [&](const std::vector<double>& st) {
    std::vector<double> h;
    for (size_t r = 0; r < st.size(); ++r) h.push_back(1.0 - (st[r] - tc[r]) / tm[r]);
    std::sort(h.begin(), h.end());
    char buf[64];
    std::snprintf(buf, sizeof buf, "%5.0f%% (%.0f%%..%.0f%%)", 100 * h[h.size() / 2], 100 * h[0],
                  100 * h.back());
    return std::string(buf);
  };
  if (world.rank() == 0) {
    const double C = median(tc), M = median(tm), S = median(ts), S0 = median(t0);
    std::printf(
        "overlap: %d ranks, %s, preset %s, %d x %d tokens per rank, %d rounds (medians, "
        "slowest rank)\n",
        world.size(), e.mesh->describe().c_str(), a.preset.c_str(), a.batch, c.context, a.repeats);
    std::printf("  %-28s %10s %12s %14s  %s\n", "", "time_ms", "exposed_ms", "hidden_share",
                "per round: median (range)");
    std::printf("  %-28s %10.1f\n", "compute alone", C * 1e3);
    std::printf("  %-28s %10.1f\n", "communication alone", M * 1e3);
    std::printf("  step, prefetch %-12d %10.1f %12.1f %13.0f%%  %s\n", a.prefetch, S * 1e3,
                median(xs) * 1e3, 100.0 * (1.0 - (S - C) / M), shares(ts).c_str());
    std::printf("  %-28s %10.1f %12.1f %13.0f%%  %s\n", "step, prefetch 0", S0 * 1e3,
                median(x0) * 1e3, 100.0 * (1.0 - (S0 - C) / M), shares(t0).c_str());
    std::printf("  comm / compute = %.2f\n", M / C);
  }
  return 0;
}

int partAlone(const Args& a, hsdp::Comm& world, const gpt::Config& c, const gpt::Corpus& corpus) {
  Local local(c);
  gpt::Model net(c, false);
  std::vector<int32_t> tokens, targets;
  gpt::fillBatch(corpus, c, 1, 0, world.rank() * a.batch, a.batch, &tokens, &targets);
  std::vector<double> tc;
  for (int r = -1; r < a.repeats; ++r) {  // one warm-up
    auto s = slowest(world, [&]() -> hsdp::Status {
      gpt::modelGradients(net, local.units, local.params, a.batch, tokens.data(), targets.data(),
                          1.0f, &local.grads);
      return hsdp::okStatus();
    });
    if (!s.ok()) {
      std::fprintf(stderr, "gpt_bench [rank %d]: %s\n", world.rank(),
                   s.status().toString().c_str());
      return 3;
    }
    if (r >= 0) tc.push_back(*s);
  }
  if (world.rank() == 0)
    std::printf("result compute_alone_ms=%.1f ranks=%d batch=%d repeats=%d\n", median(tc) * 1e3,
                world.size(), a.batch, a.repeats);
  return 0;
}

int partSharding(const Args& a, hsdp::Comm& world, const hsdp::NodeLayout& layout,
                 const gpt::Config& c, const gpt::Corpus& corpus) {
  Engine none, z3;
  const int rpn = layout.ranks_per_node;
  for (auto [e, mode, intra] : {std::tuple{&none, hsdp::ShardMode::kNone, 1},
                                std::tuple{&z3, hsdp::ShardMode::kZero3, rpn}})
    if (hsdp::Status s = makeEngine(world, layout, c, corpus, a, mode, intra, 1, e); !s.ok()) {
      std::fprintf(stderr, "gpt_bench [rank %d]: %s\n", world.rank(), s.toString().c_str());
      return 2;
    }
  int step = 0;
  std::vector<double> tn, tz;
  auto stepOf = [&](Engine& e) {
    return [&]() -> hsdp::Status { return gpt::trainStep(*e.trainer, step++).status(); };
  };
  for (int r = -1; r < a.repeats; ++r) {  // round -1: warm-up
    auto n = slowest(world, stepOf(none));
    auto z = slowest(world, stepOf(z3));
    if (!n.ok() || !z.ok()) world.abortJob(3);
    if (r >= 0) tn.push_back(*n), tz.push_back(*z);
  }
  if (world.rank() == 0) {
    const double tokens = double(a.batch) * world.size() * c.context;
    std::printf(
        "sharding overhead: %d ranks, preset %s, %d x %d tokens per rank, %d rounds "
        "(medians, slowest rank)\n",
        world.size(), a.preset.c_str(), a.batch, c.context, a.repeats);
    std::printf("  %-34s %10s %10s\n", "", "step_ms", "tokens/s");
    std::printf("  %-34s %10.1f %10.0f\n", "mode none (replicated)", median(tn) * 1e3,
                tokens / median(tn));
    const std::string z3_name = "zero3 (intra_shard " + std::to_string(rpn) + ", inter 1)";
    std::printf("  %-34s %10.1f %10.0f\n", z3_name.c_str(), median(tz) * 1e3, tokens / median(tz));
    std::printf("  zero3 / none tokens/s: %.2f\n", median(tn) / median(tz));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto session = hsdp::mpi::Session::init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "gpt_bench: %s\n", session.status().toString().c_str());
    return 2;
  }
  auto world = (*session)->world();
  if (!world.ok()) return 3;
  Args a;
  CLI::App app{"train_gpt's step measured: compute efficiency, overlap, sharding overhead",
               "gpt_bench"};
  app.add_option("--part", a.part, "compute | overlap | alone | sharding")
      ->check(CLI::IsMember({"compute", "overlap", "alone", "sharding"}));
  app.add_option("--preset", a.preset, "tiny | small");
  hsdp::cli::addInt(app, "--batch", a.batch, "Sequences per rank per step", 1, 1 << 16);
  hsdp::cli::addInt(app, "--repeats", a.repeats, "Measured rounds (medians)", 1, 10000);
  hsdp::cli::addInt(app, "--gemm", a.gemm, "Size of the square GEMM (compute)", 1, 1 << 15);
  hsdp::cli::addShardFactorFlags(app, a.intra, a.inter,
                                 {"overlap: intra_shard", "overlap: inter_shard"}, 1 << 16);
  hsdp::cli::addInt(app, "--prefetch", a.prefetch, "overlap: prefetch depth of the measured step",
                    0, 1 << 10);
  app.add_option("--data", a.data, "Corpus");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rank = (*world)->rank();
    return hsdp::cli::reportParseError(app, e, "gpt_bench", rank, rank == 0);
  }
  auto cfg = gpt::preset(a.preset);
  if (!cfg.ok()) {
    std::fprintf(stderr, "gpt_bench: %s\n", cfg.status().toString().c_str());
    return 2;
  }
  auto corpus = gpt::loadCorpus(a.data, cfg->context);
  if (!corpus.ok()) {
    std::fprintf(stderr, "gpt_bench: %s\n", corpus.status().toString().c_str());
    return 2;
  }
  if (a.part == "compute") return (*world)->rank() == 0 ? partCompute(a, *cfg, *corpus) : 0;
  if (a.part == "alone") return partAlone(a, **world, *cfg, *corpus);
  auto layout = hsdp::groupRanksIntoNodes(**world);
  if (!layout.ok()) return 2;
  if (a.part == "overlap") return partOverlap(a, **world, *layout, *cfg, *corpus);
  return partSharding(a, **world, *layout, *cfg, *corpus);
}
