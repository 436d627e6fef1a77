// Shared by the checkpoint tests under mpirun: a small model of odd sizes (so shards and pieces
// do not divide), a deterministic training step whose gradient depends on the parameters, the
// step and the rank, and a scratch directory shared by every rank.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "hsdp/mesh.h"
#include "hsdp/schedule.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"

namespace hsdp::ckpttest {

inline std::vector<std::pair<std::string, std::vector<ParamSpec>>> testUnits() {
  return {{"emb", {{"weight", {37, 11}, false}, {"bias", {37}}}},
          {"h.0", {{"ln_1.weight", {5}}, {"attn.w", {64, 37}}}},
          {"head", {{"weight", {3, 64}}, {"bias", {3}, false}}}};
}

// Builds, finalizes and initialises the test model (values from `seed`).
inline StatusOr<std::unique_ptr<ShardedModel>> buildModel(const Mesh& mesh, EngineConfig cfg,
                                                          float seed) {
  HSDP_ASSIGN_OR_RETURN(auto model, ShardedModel::create(mesh, cfg));
  for (auto& [name, params] : testUnits())
    HSDP_RETURN_IF_ERROR(model->addUnit(name, params).status());
  HSDP_RETURN_IF_ERROR(model->finalize());
  for (int u = 0; u < model->numUnits(); ++u)
    for (const ParamSpec& p : model->layout(u).params()) {
      std::vector<float> v(p.numel());
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = 0.1f * std::sin(seed + 0.7f * float(i) + float(u) + float(p.name.size()));
      HSDP_RETURN_IF_ERROR(model->setParameter(u, p.name, v.data(), v.size()));
    }
  return model;
}

// One optimizer step of `accum` micro-steps: forward (gathers), backward writing
// g = 0.05 p + 0.01 sin(0.37 i + step + micro) (1 + rank % 3), reductions, step().
inline Status trainStep(ShardedModel& model, int rank, int64_t step, int accum) {
  std::vector<int> order;
  for (int u = 0; u < model.numUnits(); ++u) order.push_back(u);
  for (int micro = 0; micro < accum; ++micro) {
    HSDP_RETURN_IF_ERROR(forwardUnits(model, order, [&](int) { return okStatus(); }));
    HSDP_RETURN_IF_ERROR(backwardUnits(
        model, order,
        [&](int u) -> Status {
          for (const ParamSpec& p : model.layout(u).params()) {
            HSDP_ASSIGN_OR_RETURN(ParamView w, model.param(u, p.name));
            HSDP_ASSIGN_OR_RETURN(ParamView g, model.grad(u, p.name));
            for (size_t i = 0; i < g.numel; ++i)
              g.data[i] += 0.05f * w.data[i] +
                           0.01f * std::sin(0.37f * float(i) + float(step) + float(micro)) *
                               float(1 + rank % 3);
          }
          return okStatus();
        },
        /*reduce_grads=*/micro + 1 == accum));
  }
  return model.step();
}

// A fresh directory every rank sees (rank 0 makes it, broadcast by name).
std::string sharedTempDir(Comm& world);

}  // namespace hsdp::ckpttest
