#include "common/reference.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "hsdp/dtype.h"
#include "hsdp/status.h"
#include "hsdp/watchdog.h"

namespace examples {

void EigenAdam::step(Eigen::Map<Eigen::ArrayXf> p, const Eigen::ArrayXf& grad, int t) {
  if (m.size() == 0) m = v = Eigen::ArrayXf::Zero(p.size());
  Eigen::ArrayXf g = grad;
  if (cfg.kind == hsdp::OptimizerKind::kAdamW)
    p *= 1.0f - cfg.lr * cfg.weight_decay;
  else
    g += cfg.weight_decay * p;
  m = cfg.beta1 * m + (1.0f - cfg.beta1) * g;
  v = cfg.beta2 * v + (1.0f - cfg.beta2) * g.square();
  const double bc1 = 1.0 - std::pow(double(cfg.beta1), t);
  const double bc2 = 1.0 - std::pow(double(cfg.beta2), t);
  const Eigen::ArrayXf denom = v.sqrt() / float(std::sqrt(bc2)) + cfg.eps;
  p -= float(cfg.lr / bc1) * m / denom;
}

void applyGradReduction(const GradReduction& tree,
                        std::vector<std::vector<std::vector<float>>>* val) {
  for (const GradReduction::Level& level : tree.levels) {
    for (const std::vector<int>& group : level.groups) {
      const float scale = 1.0f / static_cast<float>(group.size());
      for (size_t l = 0; l < (*val)[group[0]].size(); ++l) {
        std::vector<float> mean((*val)[group[0]][l].size());
        for (size_t i = 0; i < mean.size(); ++i) {
          float acc = 0.0f;
          for (int q : group) acc += (*val)[q][l][i];
          mean[i] = level.bf16 ? hsdp::toFloat(hsdp::toBf16(acc * scale)) : acc * scale;
        }
        for (int q : group) (*val)[q][l] = mean;
      }
    }
  }
}

void OuterReference::sync(const std::vector<int>& due,
                          std::vector<std::vector<std::vector<float>>>* replicas) {
  auto& reps = *replicas;
  const float inv = 1.0f / static_cast<float>(reps.size());
  for (int t : due) {
    for (size_t i = 0; i < reps[0][t].size(); ++i) {
      float acc = 0.0f;
      for (auto& r : reps) acc += diloco ? anchor[t][i] - r[t][i] : r[t][i];
      float p = acc * inv;
      if (diloco) {
        const float g = p;
        momentum[t][i] = mu * momentum[t][i] + g;
        p = anchor[t][i] - lr * (g + mu * momentum[t][i]);
        anchor[t][i] = p;
      }
      for (auto& r : reps) r[t][i] = p;
    }
  }
}

void OuterReference::start(const std::vector<int>& due,
                           const std::vector<std::vector<std::vector<float>>>& reps) {
  const float inv = 1.0f / static_cast<float>(reps.size());
  pending.resize(reps[0].size());
  for (int t : due) {
    pending[t].assign(reps[0][t].size(), 0.0f);
    for (size_t i = 0; i < reps[0][t].size(); ++i) {
      float acc = 0.0f;
      for (const auto& r : reps) acc += diloco ? anchor[t][i] - r[t][i] : r[t][i];
      pending[t][i] = acc * inv;
    }
  }
}

void OuterReference::land(const std::vector<int>& due,
                          std::vector<std::vector<std::vector<float>>>* replicas) {
  for (int t : due) {
    for (size_t i = 0; i < pending[t].size(); ++i) {
      float p = pending[t][i];
      if (diloco) {
        const float g = p;
        momentum[t][i] = mu * momentum[t][i] + g;
        p = anchor[t][i] - lr * (g + mu * momentum[t][i]);
        anchor[t][i] = p;
      }
      for (auto& r : *replicas) r[t][i] = p;
    }
  }
}

void clipGradients(float clip_norm, std::vector<std::vector<float>>* grads) {
  double sumsq = 0;
  for (const auto& g : *grads)
    sumsq += Eigen::Map<const Eigen::ArrayXf>(g.data(), g.size()).cast<double>().square().sum();
  const float coef = clip_norm / (static_cast<float>(std::sqrt(sumsq)) + 1e-6f);
  if (coef < 1.0f)
    for (auto& g : *grads) Eigen::Map<Eigen::ArrayXf>(g.data(), g.size()) *= coef;
}

GradReduction meshGradReduction(const hsdp::NodeLayout& layout, const hsdp::MeshShape& shape,
                                bool hierarchical) {
  GradReduction tree;
  tree.ranks = shape.world_size;
  std::vector<hsdp::MeshCoords> at(shape.world_size);
  for (int q = 0; q < shape.world_size; ++q) at[q] = hsdp::meshCoords(layout, shape, q);
  // Groups ranks by `key`, each group ordered by `order` (the rank in that communicator).
  auto level = [&](auto key, auto order, bool bf16) {
    std::map<decltype(key(at[0])), std::vector<int>> groups;
    for (int q = 0; q < shape.world_size; ++q) groups[key(at[q])].push_back(q);
    GradReduction::Level out;
    out.bf16 = bf16;
    for (auto& [k, members] : groups) {
      std::sort(members.begin(), members.end(),
                [&](int a, int b) { return order(at[a]) < order(at[b]); });
      out.groups.push_back(members);
    }
    return out;
  };
  using C = const hsdp::MeshCoords&;
  if (hierarchical) {
    tree.levels.push_back(level([](C c) { return std::make_tuple(c.node, c.intra_group); },
                                [](C c) { return c.intra_idx; }, true));
    tree.levels.push_back(level([](C c) { return std::make_tuple(c.inter_group, c.local_rank); },
                                [](C c) { return c.inter_idx; }, true));
  } else {
    tree.levels.push_back(
        level([](C c) { return c.replica_rank; }, [](C c) { return c.shard_rank; }, true));
  }
  if (shape.replicas() > 1)
    tree.levels.push_back(
        level([](C c) { return c.shard_rank; }, [](C c) { return c.replica_rank; }, false));
  return tree;
}

std::string firstNonFinite(const std::vector<std::vector<float>>& run,
                           const std::vector<std::vector<float>>& ref,
                           const std::vector<std::string>& names) {
  const std::vector<std::vector<float>>* sets[2] = {&run, &ref};
  const char* which[2] = {"the sharded run", "the reference"};
  for (int k = 0; k < 2; ++k)
    for (size_t t = 0; t < sets[k]->size(); ++t)
      for (size_t i = 0; i < (*sets[k])[t].size(); ++i)
        if (const float v = (*sets[k])[t][i]; !std::isfinite(v))
          return hsdp::strCat(t < names.size() ? names[t] : hsdp::strCat("tensor ", t), " element ",
                              i, " is ", std::isnan(v) ? "nan" : "inf", " in ", which[k]);
  return "";
}

double maxRelativeError(const std::vector<std::vector<float>>& a,
                        const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0.0;
  for (size_t t = 0; t < a.size(); ++t) {
    if (a[t].size() != b[t].size()) return INFINITY;
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < a[t].size(); ++i) {
      if (!std::isfinite(a[t][i]) || !std::isfinite(b[t][i])) return INFINITY;
      diff = std::max(diff, std::fabs(double(a[t][i]) - double(b[t][i])));
      scale = std::max(scale, std::fabs(double(b[t][i])));
    }
    if (std::isnan(diff)) return INFINITY;
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

hsdp::Status shareVerdict(hsdp::Comm& world, float verdict[2]) {
  HSDP_ASSIGN_OR_RETURN(hsdp::WorkHandle work,
                        world.iallReduce(verdict, 2, hsdp::DType::kFloat32, hsdp::RedOp::kSum));
  return hsdp::watchdog::waitForPeerWork(*work);
}

}  // namespace examples
