#include "gpt/reference.h"

#include <cmath>

#include "hsdp/dtype.h"

namespace gpt {

float LrSchedule::at(int step) const {
  if (warmup > 0 && step < warmup) return lr * static_cast<float>(step + 1) / warmup;
  const double span = std::max(1, steps - warmup);
  const double progress = std::min(1.0, (step - warmup) / span);
  return static_cast<float>(min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress)));
}

void fillBatch(const Corpus& corpus, const Config& cfg, uint64_t seed, int64_t step, int64_t first,
               int count, std::vector<int32_t>* tokens, std::vector<int32_t>* targets) {
  const int T = cfg.context;
  tokens->resize(static_cast<size_t>(count) * T);
  targets->resize(tokens->size());
  for (int s = 0; s < count; ++s)
    trainSequence(corpus, seed, step, first + s, T, tokens->data() + s * T,
                  targets->data() + s * T);
}

std::vector<const float*> paramPointers(const UnitInfo& unit, const std::vector<float>& flat) {
  std::vector<const float*> p;
  size_t off = 0;
  for (const hsdp::ParamSpec& s : unit.params) p.push_back(flat.data() + off), off += s.numel();
  return p;
}

std::vector<float*> gradPointers(const UnitInfo& unit, std::vector<float>* flat) {
  std::vector<float*> p;
  size_t off = 0;
  for (const hsdp::ParamSpec& s : unit.params) p.push_back(flat->data() + off), off += s.numel();
  return p;
}

float modelGradients(Model& model, const std::vector<UnitInfo>& units,
                     const std::vector<std::vector<float>>& params, int B, const int32_t* tokens,
                     const int32_t* targets, float grad_scale,
                     std::vector<std::vector<float>>* grads) {
  const std::vector<int> order = unitOrder(model.config());
  model.setBatch(B, model.config().context, tokens, targets, grad_scale);
  for (size_t pos = 0; pos < order.size(); ++pos)
    model.forward(static_cast<int>(pos), paramPointers(units[order[pos]], params[order[pos]]));
  for (size_t pos = order.size(); pos-- > 0;) {
    const int u = order[pos];
    model.backward(static_cast<int>(pos), paramPointers(units[u], params[u]),
                   gradPointers(units[u], &(*grads)[u]));
  }
  return model.loss();
}

std::vector<std::vector<float>> perTensor(const std::vector<UnitInfo>& units,
                                          const std::vector<std::vector<float>>& flat) {
  std::vector<std::vector<float>> out;
  for (size_t u = 0; u < units.size() && u < flat.size(); ++u) {
    size_t off = 0;
    for (const hsdp::ParamSpec& s : units[u].params) {
      const size_t end = std::min(flat[u].size(), off + s.numel());
      out.emplace_back(flat[u].begin() + std::min(off, end), flat[u].begin() + end);
      off += s.numel();
    }
  }
  return out;
}

ReferenceResult trainReference(const Config& cfg, const Corpus& corpus, const TrainSettings& s,
                               bool bf16_params, const examples::GradReduction* bf16_grads,
                               const Membership* membership) {
  const std::vector<UnitInfo> us = units(cfg);
  const size_t U = us.size();
  ReferenceResult r;
  std::vector<std::vector<examples::EigenAdam>> opt(U);
  for (size_t u = 0; u < U; ++u) {
    r.params.push_back(initUnit(cfg, static_cast<int>(u)));
    for (const hsdp::ParamSpec& p : us[u].params) {
      examples::EigenAdam a{s.adam, {}, {}};
      if (!p.weight_decay) a.cfg.weight_decay = 0.0f;
      opt[u].push_back(a);
    }
  }
  auto zeros = [&] {
    std::vector<std::vector<float>> g(U);
    for (size_t u = 0; u < U; ++u) g[u].assign(r.params[u].size(), 0.0f);
    return g;
  };
  auto round16 = [](std::vector<float>& v) {
    for (float& x : v) x = hsdp::toFloat(hsdp::toBf16(x));
  };
  Model model(cfg, s.checkpoint);
  std::vector<int32_t> tokens, targets;
  for (int step = 0; step < s.steps; ++step) {
    std::vector<std::vector<float>> compute = r.params;  // what forward and backward see
    if (bf16_params)
      for (auto& p : compute) round16(p);
    std::vector<std::vector<float>> grads = zeros();
    if (membership != nullptr) {
      // Elastic, each group on its own slice: the mean over the groups present of each group's
      // mean gradient over its slice.
      const std::vector<int>& present = membership->present.at(step);
      const int slice = s.batch / membership->slices(step);
      const float share = 1.0f / static_cast<float>(present.size());
      double loss = 0.0;
      for (int g : present) {
        fillBatch(corpus, cfg, s.data_seed, step, int64_t(g) * slice, slice, &tokens, &targets);
        loss +=
            modelGradients(model, us, compute, slice, tokens.data(), targets.data(), share, &grads);
      }
      r.losses.push_back(static_cast<float>(loss / present.size()));
    } else if (bf16_grads == nullptr) {
      // The whole global batch at once: the exact mean gradient.
      fillBatch(corpus, cfg, s.data_seed, step, 0, s.batch, &tokens, &targets);
      r.losses.push_back(
          modelGradients(model, us, compute, s.batch, tokens.data(), targets.data(), 1.0f, &grads));
    } else {
      // Each rank's gradient as the engine forms it (micro-steps added at 1/accum each), rounded
      // to bf16, then the mesh's reduction tree.
      const int ranks = bf16_grads->ranks;
      const int micro = s.batch / s.accum, per_rank = micro / ranks;
      std::vector<std::vector<std::vector<float>>> val(ranks);
      double loss = 0.0;
      for (int q = 0; q < ranks; ++q) {
        val[q] = zeros();
        for (int k = 0; k < s.accum; ++k) {
          fillBatch(corpus, cfg, s.data_seed, step, int64_t(k) * micro + q * per_rank, per_rank,
                    &tokens, &targets);
          loss += modelGradients(model, us, compute, per_rank, tokens.data(), targets.data(),
                                 1.0f / s.accum, &val[q]);
        }
        for (auto& g : val[q]) round16(g);
      }
      r.losses.push_back(static_cast<float>(loss / (ranks * s.accum)));
      examples::applyGradReduction(*bf16_grads, &val);
      grads = std::move(val[0]);  // a complete tree leaves every rank the same value
    }
    if (s.clip_norm > 0) examples::clipGradients(s.clip_norm, &grads);
    const float lr = s.schedule.at(step);
    for (size_t u = 0; u < U; ++u) {
      size_t off = 0;
      for (size_t i = 0; i < us[u].params.size(); ++i) {
        const size_t n = us[u].params[i].numel();
        opt[u][i].cfg.lr = lr;
        opt[u][i].step(Eigen::Map<Eigen::ArrayXf>(r.params[u].data() + off, n),
                       Eigen::Map<Eigen::ArrayXf>(grads[u].data() + off, n), step + 1);
        off += n;
      }
    }
  }
  return r;
}

}  // namespace gpt
