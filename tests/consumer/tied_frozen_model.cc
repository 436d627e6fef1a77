// A user's model on the installed hsdp, checked against a closed form. Three units:
//   "embed"  {table: 5 x 7}           used twice per step (input embedding and tied output head)
//   "frozen" {f: 13}                  frozen: gathered for forward, never reduced or stepped
//   "head"   {w: 3 x 11, b: 11}       b without weight decay
// The gradients are constants chosen per rank, so the optimizer has a closed form: with a
// constant gradient g, Adam's bias-corrected moments are exactly g and g^2, and every AdamW step
// is p <- p * (1 - lr * wd) - lr * g / (|g| + eps). The forward pass checks the gathered values
// against that recurrence every step; the end compares every unit's full parameters.
//
//   mpirun -np 3 tied_frozen_model [--mode zero3|zero2|zero1|none] [--inter-shard J] [--steps K]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hsdp/config.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"
#include "hsdp/version.h"

namespace {

constexpr float kLr = 0.01f, kWd = 0.1f, kEps = 1e-8f;

struct Param {
  int unit;
  std::string name;
  size_t numel;
  bool decay;
};

// The initial value of element i of a parameter, the same on every rank.
double init(const Param& p, size_t i) {
  return 0.5 * std::sin(0.3 * (i + 1) + p.numel) + 0.1 * p.unit;
}

// What rank r adds to the gradient of element i: `use` 0 and 1 are the two uses of the tied table.
double rankGrad(const Param& p, size_t i, int r, int use) {
  if (p.unit == 0) return use == 0 ? (r + 1) * std::sin(i + 1.0) : std::cos(double(i));
  return (r - 1.5) * 0.25 + 0.1 * double(i % 5) - 0.2;
}

// The averaged gradient over `world` ranks (what reduceGrad leaves in the shard).
double meanGrad(const Param& p, size_t i, int world) {
  double s = 0;
  for (int r = 0; r < world; ++r)
    s += rankGrad(p, i, r, 0) + (p.unit == 0 ? rankGrad(p, i, r, 1) : 0);
  return s / world;
}

// Element i after `steps` AdamW steps (the closed form above, in double).
double expected(const Param& p, size_t i, int world, int steps, bool frozen) {
  double v = init(p, i);
  if (frozen) return v;
  const double g = meanGrad(p, i, world);
  for (int t = 0; t < steps; ++t) {
    if (p.decay) v *= 1.0 - double(kLr) * kWd;
    v -= double(kLr) * g / (std::fabs(g) + kEps);
  }
  return v;
}

bool close(double got, double want) {
  return std::fabs(got - want) <= 2e-5 + 1e-5 * std::fabs(want);
}

int fail(int rank, const std::string& what) {
  std::fprintf(stderr, "tied_frozen_model [rank %d]: FAIL: %s\n", rank, what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto session = hsdp::mpi::Session::init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "tied_frozen_model: error: %s\n", session.status().toString().c_str());
    return 2;
  }
  std::string mode_name = "zero3";
  int inter = 0, steps = 4;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (!std::strcmp(argv[a], "--mode"))
      mode_name = argv[a + 1];
    else if (!std::strcmp(argv[a], "--inter-shard"))
      inter = std::atoi(argv[a + 1]);
    else if (!std::strcmp(argv[a], "--steps"))
      steps = std::atoi(argv[a + 1]);
  }
  auto world = (*session)->world();
  if (!world.ok()) return fail(-1, world.status().toString());
  const int rank = (*world)->rank(), W = (*world)->size();
  auto die = [&](const hsdp::Status& s) { return fail(rank, s.toString()); };

  auto layout = hsdp::groupRanksIntoNodes(**world);
  if (!layout.ok()) return die(layout.status());
  auto mode = hsdp::parseShardMode(mode_name);
  if (!mode.ok()) return die(mode.status());
  hsdp::MeshSpec spec;
  if (*mode == hsdp::ShardMode::kNone)
    spec = {1, 1};
  else
    spec.inter_shard = inter;
  auto mesh = hsdp::Mesh::create(**world, *layout, spec);
  if (!mesh.ok()) return die(mesh.status());

  hsdp::EngineConfig cfg;
  cfg.mode = *mode;
  cfg.adam = {hsdp::OptimizerKind::kAdamW, kLr, 0.9f, 0.999f, kEps, kWd};
  auto made = hsdp::ShardedModel::create(**mesh, cfg);
  if (!made.ok()) return die(made.status());
  hsdp::ShardedModel& model = **made;

  const std::vector<Param> params = {
      {0, "table", 35, false}, {1, "f", 13, true}, {2, "w", 33, true}, {2, "b", 11, false}};
  auto embed = model.addUnit("embed", {{"table", {5, 7}, false}});
  auto frozen = model.addUnit("frozen", {{"f", {13}, true}}, {.frozen = true});
  auto head = model.addUnit("head", {{"w", {3, 11}, true}, {"b", {11}, false}});
  if (!embed.ok() || !frozen.ok() || !head.ok()) return fail(rank, "addUnit failed");
  if (auto s = model.finalize(); !s.ok()) return die(s);
  for (const Param& p : params) {
    std::vector<float> v(p.numel);
    for (size_t i = 0; i < p.numel; ++i) v[i] = float(init(p, i));
    if (auto s = model.setParameter(p.unit, p.name, v.data(), v.size()); !s.ok()) return die(s);
  }
  auto isFrozen = [&](int unit) { return unit == *frozen; };

  // Input embedding, the frozen unit, the head, then the output head tied to the embedding.
  const std::vector<int> order = {*embed, *frozen, *head, *embed};
  int bad = 0;
  for (int step = 0; step < steps; ++step) {
    auto s = hsdp::forwardUnits(model, order, [&](int unit) -> hsdp::Status {
      for (const Param& p : params) {
        if (p.unit != unit) continue;
        HSDP_ASSIGN_OR_RETURN(hsdp::ParamView v, model.param(unit, p.name));
        for (size_t i = 0; i < p.numel; ++i)
          if (!close(v.data[i], expected(p, i, W, step, isFrozen(unit))) && bad++ < 5)
            std::fprintf(stderr, "rank %d step %d: %s[%zu] = %.7g, closed form %.7g\n", rank, step,
                         p.name.c_str(), i, v.data[i], expected(p, i, W, step, isFrozen(unit)));
      }
      return hsdp::okStatus();
    });
    if (!s.ok()) return die(s);
    int embed_uses = 0;  // backward meets the tied head first (use 1), then the embedding (use 0)
    s = hsdp::backwardUnits(
        model, order,
        [&](int unit) -> hsdp::Status {
          if (isFrozen(unit)) {
            if (model.grad(unit, "f").ok()) return hsdp::internalError("grad() of a frozen unit");
            return hsdp::okStatus();
          }
          const int use = unit == *embed ? 1 - embed_uses++ : 0;
          for (const Param& p : params) {
            if (p.unit != unit) continue;
            HSDP_ASSIGN_OR_RETURN(hsdp::ParamView g, model.grad(unit, p.name));
            for (size_t i = 0; i < p.numel; ++i) g.data[i] += float(rankGrad(p, i, rank, use));
          }
          return hsdp::okStatus();
        },
        /*reduce_grads=*/true);
    if (!s.ok()) return die(s);
    if (s = model.step(); !s.ok()) return die(s);
  }

  for (int unit : {*embed, *frozen, *head}) {
    std::vector<float> full;
    if (auto s = model.gatherFullParameters(unit, &full); !s.ok()) return die(s);
    size_t off = 0;
    for (const Param& p : params) {
      if (p.unit != unit) continue;
      for (size_t i = 0; i < p.numel; ++i)
        if (!close(full[off + i], expected(p, i, W, steps, isFrozen(unit))) && bad++ < 10)
          std::fprintf(stderr, "rank %d final: %s[%zu] = %.7g, closed form %.7g\n", rank,
                       p.name.c_str(), i, full[off + i], expected(p, i, W, steps, isFrozen(unit)));
      off += p.numel;
    }
  }
  const hsdp::MemoryReport mem = model.memoryReport();
  // The frozen unit holds no gradient or optimizer state: only embed's and head's shards count.
  const size_t stepped = model.layout(*embed).shardNumel() + model.layout(*head).shardNumel();
  if (*mode != hsdp::ShardMode::kNone && mem.optim_bytes != 2 * sizeof(float) * stepped)
    return fail(rank, "optimizer bytes " + std::to_string(mem.optim_bytes) + ", expected " +
                          std::to_string(2 * sizeof(float) * stepped));
  if (bad) return fail(rank, std::to_string(bad) + " values differ from the closed form");
  if (rank == 0)
    std::printf("tied_frozen_model: hsdp %s, %s, %s, %d steps: PASS\n", hsdp::version(),
                (*mesh)->describe().c_str(), hsdp::shardModeName(*mode), steps);
  return 0;
}
