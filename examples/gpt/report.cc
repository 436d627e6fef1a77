#include "gpt/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/report.h"
#include "hsdp/dtype.h"

namespace gpt {

void printHeader(const char* program, const hsdp::Comm& world, const hsdp::Mesh& mesh,
                 const Setup& setup, const Options& opt, const Corpus& corpus) {
  if (world.rank() != 0) return;
  const Config& m = setup.model;
  const TrainSettings& t = setup.train;
  const hsdp::EngineConfig& e = setup.engine;
  examples::printNodeMap(program, world, mesh);
  std::printf(
      "model: GPT-2 %s, %d layers, d %d, %d heads, context %d, vocab %d (bytes): %.2f M "
      "parameters in %d units, LM head tied to wte\n",
      opt.preset.c_str(), m.layers, m.d_model, m.heads, m.context, m.vocab, m.paramCount() / 1e6,
      m.layers + 3);
  std::printf("data: %s: %d files, %.2f MB training text (%zu entries), %.2f MB validation (%zu)\n",
              corpus.source.c_str(), corpus.files, corpus.train.size() / 1e6, corpus.train_entries,
              corpus.val.size() / 1e6, corpus.val_entries);
  std::printf(
      "mode %s, %s lr %g (warm-up %d steps, cosine to %g) betas %g/%g wd %g (matrices only), "
      "clip %g; global batch %d x %d tokens (%d per rank), accum %d; prefetch %d, activation "
      "checkpointing %s\n",
      hsdp::shardModeName(e.mode), hsdp::optimizerName(e.adam.kind), t.schedule.lr,
      t.schedule.warmup, t.schedule.min_lr, e.adam.beta1, e.adam.beta2, e.adam.weight_decay,
      t.clip_norm, t.batch, m.context, t.batch / world.size(), t.accum, opt.prefetch,
      t.checkpoint ? "on" : "off");
  examples::printReplicaPolicy(e);
  std::printf("\n%9s %9s %8s %9s %9s %9s %10s %7s", "step", "lr", "loss", "grad_norm", "time_ms",
              "tokens/s", "exposed_ms", "comm%");
  if (e.offload.cpu) std::printf(" %8s", "adam_hid");
  std::printf(" %7s\n", "eta_s");
  std::fflush(stdout);
}

hsdp::StatusOr<StepRow> gatherStepRow(hsdp::Comm& world, const hsdp::ShardedModel& model,
                                      const StepStats& s) {
  constexpr int kStats = 5;
  float mine[kStats] = {s.loss, s.time_ms, s.exposed_comm_ms, s.optim_ms, s.optim_exposed_ms};
  std::vector<float> all(kStats * world.size());
  HSDP_RETURN_IF_ERROR(world.allGather(mine, all.data(), kStats, hsdp::DType::kFloat32));
  StepRow row;
  row.lr = s.lr;
  for (int q = 0; q < world.size(); ++q) {
    const float* v = &all[kStats * q];
    row.loss += v[0] / world.size();
    row.ms = std::max<double>(row.ms, v[1]);
    row.exposed_ms = std::max<double>(row.exposed_ms, v[2]);
    row.optim_ms += v[3];
    row.optim_exposed_ms += v[4];
  }
  row.grad_norm = model.lastGradNorm();
  return row;
}

void printStepRow(const hsdp::Comm& world, const Setup& setup, int step, const StepRow& row) {
  if (world.rank() != 0) return;
  const TrainSettings& t = setup.train;
  const double tokens = double(t.batch) * setup.model.context, ms = row.ms;
  char progress[32];
  std::snprintf(progress, sizeof progress, "%d/%d", step + 1, t.steps);
  std::printf("%9s %9.2e %8.4f %9.4f %9.1f %9.0f %10.1f %6.1f%%", progress, row.lr, row.loss,
              row.grad_norm, ms, tokens / (ms / 1e3), row.exposed_ms,
              ms > 0 ? 100.0 * row.exposed_ms / ms : 0.0);
  if (setup.engine.offload.cpu) {
    const double optim = row.optim_ms, optim_exposed = row.optim_exposed_ms;
    std::printf(" %7.0f%%", optim > 0 ? 100.0 * (1.0 - std::min(1.0, optim_exposed / optim)) : 0.0);
  }
  std::printf(" %7.0f\n", (t.steps - step - 1) * ms / 1e3);
  std::fflush(stdout);
}

std::string generate(const Config& cfg, const std::vector<std::vector<float>>& params,
                     const std::string& prompt, int n, float temperature, uint64_t seed) {
  const std::vector<UnitInfo> us = units(cfg);
  const std::vector<int> order = unitOrder(cfg);
  Model model(cfg, false);
  std::vector<int32_t> text(prompt.begin(), prompt.end());
  for (int32_t& b : text) b &= 0xff;
  std::string out;
  uint64_t draws = 0;
  for (int k = 0; k < n; ++k) {
    const int T = std::min<int>(cfg.context, static_cast<int>(text.size()));
    const int32_t* window = text.data() + text.size() - T;
    model.setBatch(1, T, window, nullptr);
    for (size_t pos = 0; pos < order.size(); ++pos)
      model.forward(static_cast<int>(pos), paramPointers(us[order[pos]], params[order[pos]]));
    const Eigen::VectorXf logit = model.logits().col(T - 1) / temperature;
    Eigen::VectorXf p = (logit.array() - logit.maxCoeff()).exp();
    p /= p.sum();
    // splitmix64 as the generator: the same draw on every platform.
    const double u = (splitmix64(seed + ++draws) >> 11) * (1.0 / 9007199254740992.0);
    int next = cfg.vocab - 1;
    double acc = 0;
    for (int v = 0; v < cfg.vocab; ++v) {
      acc += p(v);
      if (u < acc) {
        next = v;
        break;
      }
    }
    text.push_back(next);
    out.push_back(static_cast<char>(next));
  }
  return out;
}

std::string printable(const std::string& text) {
  std::string out = text;
  for (char& ch : out) {
    const unsigned char b = static_cast<unsigned char>(ch);
    if ((b < 32 && b != '\n' && b != '\t') || b >= 127) ch = '?';
  }
  return out;
}

double referenceError(const hsdp::Mesh& mesh, const hsdp::ShardedModel& model, const Setup& setup,
                      const Corpus& corpus, const std::vector<std::vector<float>>& mine,
                      const Membership* membership) {
  // The engine rounds to bf16 only over a shard group larger than one (mode none reduces in
  // float); a bf16 reduction is modelled on the mesh's own tree (examples::meshGradReduction).
  const bool sharded = model.shardCount() > 1;
  examples::GradReduction tree;
  if (sharded && setup.engine.precision.reduce_dtype == hsdp::DType::kBFloat16)
    tree = examples::meshGradReduction(mesh.layout(), mesh.shape(), model.hierarchical());
  const ReferenceResult ref =
      trainReference(setup.model, corpus, setup.train,
                     sharded && setup.engine.precision.param_dtype == hsdp::DType::kBFloat16,
                     tree.levels.empty() ? nullptr : &tree, membership);
  const std::vector<UnitInfo> us = units(setup.model);
  return examples::maxRelativeError(perTensor(us, mine), perTensor(us, ref.params));
}

}  // namespace gpt
