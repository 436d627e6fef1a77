#include "mlp/reference.h"

#include <algorithm>
#include <cmath>

#include "hsdp/dtype.h"

namespace mlp {

namespace {

// Forward and backward of `batch` through `compute` (the parameters the math sees): the mean
// gradient over the batch into `grads` (zeroed here); returns the loss.
float gradients(const Spec& spec, const std::vector<std::vector<float>>& compute,
                const Batch& batch, std::vector<std::vector<float>>* grads) {
  const int L = spec.layers();
  std::vector<Matrix> acts(L + 1);
  acts[0] = batch.x;
  for (int l = 0; l < L; ++l) {
    const int in = spec.dims[l], out = spec.dims[l + 1];
    const float* p = compute[l].data();
    Matrix z;
    linearForward(p, p + static_cast<size_t>(out) * in, out, in, acts[l], &z);
    acts[l + 1] = l + 1 < L ? Matrix(z.array().tanh()) : z;
  }
  Matrix dz;
  const float loss = crossEntropy(acts[L], batch.labels, &dz);
  grads->resize(L);
  for (int l = L - 1; l >= 0; --l) {
    const int in = spec.dims[l], out = spec.dims[l + 1];
    (*grads)[l].assign(compute[l].size(), 0.0f);
    Matrix dx;
    linearBackward(compute[l].data(), out, in, acts[l], dz, (*grads)[l].data(),
                   (*grads)[l].data() + static_cast<size_t>(out) * in, l > 0 ? &dx : nullptr);
    if (l > 0) dz = (dx.array() * (1.0f - acts[l].array().square())).matrix();
  }
  return loss;
}

}  // namespace

ReferenceResult trainReference(const Spec& spec, const hsdp::AdamConfig& adam, int steps,
                               int global_batch, float clip_norm, bool bf16_params,
                               const examples::GradReduction* bf16_grads, int accum,
                               const Membership* membership) {
  auto round16 = [](std::vector<float>& v) {
    for (float& x : v) x = hsdp::toFloat(hsdp::toBf16(x));
  };
  const int L = spec.layers();
  ReferenceResult r;
  r.params.resize(L);
  std::vector<examples::EigenAdam> opt(L, examples::EigenAdam{adam, {}, {}});
  for (int l = 0; l < L; ++l) {
    std::vector<float> w, b;
    initLayer(spec, l, &w, &b);
    r.params[l] = w;
    r.params[l].insert(r.params[l].end(), b.begin(), b.end());
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> compute = r.params;  // what forward/backward see
    if (bf16_params)
      for (auto& p : compute) round16(p);
    std::vector<std::vector<float>> grads(L);
    if (membership != nullptr) {
      // Elastic: the mean of the present groups' mean gradients over their own slices.
      const std::vector<int>& present = membership->present.at(step);
      const int slice = global_batch / membership->slices(step);
      double loss = 0.0;
      for (int l = 0; l < L; ++l) grads[l].assign(r.params[l].size(), 0.0f);
      for (int g : present) {
        std::vector<std::vector<float>> gg;
        loss += gradients(spec, compute, makeBatch(spec, step, g * slice, slice), &gg);
        for (int l = 0; l < L; ++l)
          for (size_t i = 0; i < gg[l].size(); ++i) grads[l][i] += gg[l][i] / float(present.size());
      }
      r.losses.push_back(static_cast<float>(loss / present.size()));
    } else if (bf16_grads == nullptr) {
      // The whole batch at once: the exact mean gradient, rounded once per element in float.
      r.losses.push_back(gradients(spec, compute, makeBatch(spec, step, 0, global_batch), &grads));
    } else {
      // Every rank's own gradient, rounded to bf16 (what it puts on the wire) ...
      const int ranks = bf16_grads->ranks;
      const int micro = global_batch / accum, per_rank = micro / ranks;
      std::vector<std::vector<std::vector<float>>> val(ranks, std::vector<std::vector<float>>(L));
      double loss = 0.0;
      for (int q = 0; q < ranks; ++q) {
        std::vector<std::vector<float>> g;
        for (int l = 0; l < L; ++l) val[q][l].assign(r.params[l].size(), 0.0f);
        for (int k = 0; k < accum; ++k) {
          loss += gradients(spec, compute,
                            makeBatch(spec, step, k * micro + q * per_rank, per_rank), &g);
          for (int l = 0; l < L; ++l)
            for (size_t i = 0; i < g[l].size(); ++i) val[q][l][i] += g[l][i] / float(accum);
        }
        for (int l = 0; l < L; ++l) round16(val[q][l]);
      }
      r.losses.push_back(static_cast<float>(loss / (ranks * accum)));
      // ... then the tree, level by level: a float sum in member order, times float(1/n), rounded
      // to bf16 on the bf16 levels, held by every member.
      examples::applyGradReduction(*bf16_grads, &val);
      grads = std::move(val[0]);  // a complete tree leaves every rank the same value
    }
    if (clip_norm > 0) examples::clipGradients(clip_norm, &grads);
    for (int l = 0; l < L; ++l) {
      Eigen::Map<Eigen::ArrayXf> p(r.params[l].data(), r.params[l].size());
      opt[l].step(p, Eigen::Map<Eigen::ArrayXf>(grads[l].data(), grads[l].size()), step + 1);
    }
  }
  return r;
}

ReplicaReferenceResult trainReplicaReference(const Spec& spec, const hsdp::AdamConfig& adam,
                                             int steps, int global_batch, float clip_norm,
                                             int accum, int world,
                                             const std::vector<std::vector<int>>& replica_ranks,
                                             const hsdp::ReplicaSyncPolicy& policy,
                                             bool bf16_params) {
  const int L = spec.layers(), R = static_cast<int>(replica_ranks.size());
  const int micro = global_batch / accum, per_rank = micro / world;
  std::vector<std::vector<float>> init(L);
  for (int l = 0; l < L; ++l) {
    std::vector<float> w, b;
    initLayer(spec, l, &w, &b);
    init[l] = w;
    init[l].insert(init[l].end(), b.begin(), b.end());
  }
  ReplicaReferenceResult r;
  r.params.assign(R, init);
  r.outer.diloco = policy.policy == hsdp::ReplicaPolicy::kDiloco;
  r.outer.lr = policy.outer_lr;
  r.outer.mu = policy.outer_momentum;
  r.outer.anchor = init;
  for (int l = 0; l < L; ++l) r.outer.momentum.emplace_back(init[l].size(), 0.0f);
  std::vector<std::vector<examples::EigenAdam>> opt(
      R, std::vector<examples::EigenAdam>(L, examples::EigenAdam{adam, {}, {}}));
  const int64_t H = policy.sync_every, F = policy.fragments;
  for (int step = 0; step < steps; ++step) {
    for (int g = 0; g < R; ++g) {
      // The replica's gradient: each rank's mean over its micro-steps, averaged over the ranks.
      const std::vector<int>& ranks = replica_ranks[g];
      std::vector<std::vector<float>> compute = r.params[g];  // what forward/backward see
      if (bf16_params)
        for (auto& p : compute)
          for (float& x : p) x = hsdp::toFloat(hsdp::toBf16(x));
      std::vector<std::vector<float>> grads(L);
      for (int l = 0; l < L; ++l) grads[l].assign(init[l].size(), 0.0f);
      for (int q : ranks) {
        std::vector<std::vector<float>> acc(L), gq;
        for (int l = 0; l < L; ++l) acc[l].assign(init[l].size(), 0.0f);
        for (int k = 0; k < accum; ++k) {
          gradients(spec, compute, makeBatch(spec, step, k * micro + q * per_rank, per_rank), &gq);
          for (int l = 0; l < L; ++l)
            for (size_t i = 0; i < gq[l].size(); ++i) acc[l][i] += gq[l][i] / float(accum);
        }
        for (int l = 0; l < L; ++l)
          for (size_t i = 0; i < acc[l].size(); ++i) grads[l][i] += acc[l][i];
      }
      const float inv = 1.0f / static_cast<float>(ranks.size());
      for (auto& t : grads)
        for (float& x : t) x *= inv;
      if (clip_norm > 0) examples::clipGradients(clip_norm, &grads);
      for (int l = 0; l < L; ++l) {
        Eigen::Map<Eigen::ArrayXf> p(r.params[g][l].data(), r.params[g][l].size());
        opt[g][l].step(p, Eigen::Map<Eigen::ArrayXf>(grads[l].data(), grads[l].size()), step + 1);
      }
    }
    // The layers whose fragment is due after inner step t (outer_step.h's schedule); with a
    // delay tau, those started after t - tau land first, then those due start.
    const int64_t t = step + 1, tau = policy.sync_delay;
    auto dueAfter = [&](int64_t s) {
      std::vector<int> due;
      for (int l = 0; l < L; ++l) {
        const int64_t off = (int64_t{l} * F / L) * H / F;
        if (s >= 1 && s >= off && (s - off) % H == 0) due.push_back(l);
      }
      return due;
    };
    if (tau == 0) {
      r.outer.sync(dueAfter(t), &r.params);
    } else {
      r.outer.land(dueAfter(t - tau), &r.params);
      r.outer.start(dueAfter(t), r.params);
    }
  }
  return r;
}

}  // namespace mlp
