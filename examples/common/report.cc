#include "common/report.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "hsdp/plan.h"

namespace examples {
namespace {

std::string bytesStr(size_t b) {
  char buf[32];
  if (b >= (1u << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

}  // namespace

void printReplicaPolicy(const hsdp::EngineConfig& cfg) {
  const hsdp::ReplicaSyncPolicy& rs = cfg.replica_sync;
  if (rs.policy == hsdp::ReplicaPolicy::kSync) return;
  std::printf("replica policy %s: sync every %d steps, outer lr %g momentum %g, %d fragments\n",
              hsdp::replicaPolicyName(rs.policy), rs.sync_every, rs.outer_lr, rs.outer_momentum,
              rs.fragments);
  if (rs.sync_delay > 0)
    std::printf("sync delay %d steps: a fragment's outer all-reduce overlaps %d inner steps\n",
                rs.sync_delay, rs.sync_delay);
}

void printNodeMap(const char* program, const hsdp::Comm& world, const hsdp::Mesh& mesh) {
  const hsdp::NodeLayout& nl = mesh.layout();
  std::printf("hsdp %s: %d ranks on %d %snodes (", program, world.size(), nl.num_nodes,
              nl.virtual_nodes ? "virtual " : "");
  for (int n = 0; n < nl.num_nodes; ++n)
    std::printf("%s%s", n ? ", " : "", nl.node_names[n].c_str());
  std::printf(")\nmesh: %s\n", mesh.describe().c_str());
}

void printOffloadSummary(const hsdp::Comm& world, const hsdp::EngineConfig& cfg, int steps,
                         double optim_total, double optim_exposed) {
  if (!cfg.offload.cpu || world.rank() != 0) return;
  std::printf(
      "\noffloaded optimizer (rank 0): %.2f ms of CPU Adam per step, %.2f ms of it "
      "waited for in step() -> %.0f%% hidden behind backward\n",
      steps ? optim_total * 1e3 / steps : 0.0, steps ? optim_exposed * 1e3 / steps : 0.0,
      optim_total > 0 ? 100.0 * (1.0 - std::min(1.0, optim_exposed / optim_total)) : 0.0);
}

hsdp::Status printMemory(hsdp::Comm& world, const hsdp::Mesh& mesh, const hsdp::ShardedModel& model,
                         const std::vector<uint64_t>& unit_numels, const hsdp::EngineConfig& cfg,
                         const std::vector<uint32_t>& unit_uses) {
  const hsdp::MemoryReport r = model.memoryReport();
  // `gathered` is what the engine allocated for gathered units and full gradients (the blocks of
  // its pool: the same on every rank of a role, and what `total` counts); how many of them were
  // in use at once depends on timing (how far prefetches ran ahead), so it is reported apart.
  constexpr int kFields = 8;
  int64_t mine[kFields] = {int64_t(r.param_bytes + r.hpz_bytes),
                           int64_t(r.grad_bytes),
                           int64_t(r.optim_bytes),
                           int64_t(r.gathered_capacity_bytes),
                           int64_t(r.comm_bytes),
                           int64_t(r.total()),
                           mesh.coords().node,
                           int64_t(r.gathered_peak_bytes)};
  std::vector<int64_t> all(kFields * world.size());
  HSDP_RETURN_IF_ERROR(world.allGather(mine, all.data(), kFields, hsdp::DType::kInt64));
  if (world.rank() != 0) return hsdp::okStatus();
  std::printf("\nper-rank memory held by model state (engine allocations):\n");
  std::printf("%5s %5s %12s %12s %12s %12s %12s %12s\n", "rank", "node", "params", "grads", "optim",
              "gathered", "comm", "total");
  int64_t peak_lo = INT64_MAX, peak_hi = 0;
  for (int q = 0; q < world.size(); ++q) {
    const int64_t* v = &all[kFields * q];
    std::printf("%5d %5lld %12s %12s %12s %12s %12s %12s\n", q, (long long)v[6],
                bytesStr(v[0]).c_str(), bytesStr(v[1]).c_str(), bytesStr(v[2]).c_str(),
                bytesStr(v[3]).c_str(), bytesStr(v[4]).c_str(), bytesStr(v[5]).c_str());
    peak_lo = std::min(peak_lo, v[7]);
    peak_hi = std::max(peak_hi, v[7]);
  }
  std::printf(
      "gathered in use at the peak: %s to %s over the ranks (of the allocated `gathered`; "
      "depends on how far prefetches ran ahead)\n",
      bytesStr(peak_lo).c_str(), bytesStr(peak_hi).c_str());
  // hsdp-plan's prediction for this very configuration (fp32 policy; the plan models what
  // the engine allocates), beside what rank 0 measured.
  hsdp::PlanInput in;
  in.units = unit_numels;
  in.unit_uses = unit_uses;
  in.nodes = mesh.shape().num_nodes;
  in.gpus_per_node = mesh.shape().ranks_per_node;
  in.intra_shard = mesh.shape().intra_shard;
  in.inter_shard = mesh.shape().inter_shard;
  in.mode = static_cast<hsdp::ShardMode>(static_cast<int>(cfg.mode));
  in.param_dtype = hsdp::DType::kFloat32;
  in.offload_cpu = cfg.offload.cpu;
  in.hpz = cfg.hpz;
  if (auto plan = hsdp::makePlan(in);
      plan.ok() && cfg.precision.param_dtype == hsdp::DType::kFloat32) {
    const hsdp::PlanMemory& g = plan->gpu;
    const int64_t* v = &all[0];
    std::printf(
        "hsdp-plan prediction (rank 0): params%s %s (measured %s), grads %s (%s), optim "
        "%s (%s), gathered %s (%s), comm %s estimate (%s)\n",
        cfg.hpz ? "+hpz" : "", bytesStr(g.params + g.hpz_secondary).c_str(), bytesStr(v[0]).c_str(),
        bytesStr(g.grads).c_str(), bytesStr(v[1]).c_str(), bytesStr(g.optimizer).c_str(),
        bytesStr(v[2]).c_str(), bytesStr(g.gathered_peak).c_str(), bytesStr(v[3]).c_str(),
        bytesStr(g.comm_estimate).c_str(), bytesStr(v[4]).c_str());
    // The bytes each level sends in one step, all ranks together: the step rows' "bytes:" line
    // counts them (Comm::bytesSent), so a reader (bench/step_bench.sh) sets the two side by side.
    std::printf("hsdp-plan bytes per step: intra %llu inter %llu replica %llu (all ranks)\n",
                static_cast<unsigned long long>(plan->per_level.intra),
                static_cast<unsigned long long>(plan->per_level.inter),
                static_cast<unsigned long long>(plan->per_level.replica));
  }
  // Unsharded data parallel holds fp32 params + grads + two Adam moments on every rank.
  uint64_t param_count = 0;
  for (uint64_t n : unit_numels) param_count += n;
  const size_t replicated = param_count * 4 * sizeof(float);
  std::printf(
      "model state per rank: %s sharded vs %s replicated (params+grads+optim: %.2fx less)\n",
      bytesStr(r.param_bytes + r.grad_bytes + r.optim_bytes).c_str(), bytesStr(replicated).c_str(),
      double(replicated) / double(r.param_bytes + r.grad_bytes + r.optim_bytes));
  return hsdp::okStatus();
}

void printStepStart(const hsdp::Comm& world, const hsdp::StepStart& start) {
  static std::vector<int> last_present;  // the groups of the last step printed
  if (world.rank() != 0 || (start.slots == 1 && start.present.size() == 1 && !start.healed)) return;
  if (start.healed) {
    const double gbs = start.heal_seconds > 0 ? start.heal_bytes / start.heal_seconds / 1e9 : 0;
    std::printf(
        "elastic: group %d healed to step %lld from group %d: %zu bytes per rank in "
        "%.3f s (%.2f GB/s)\n",
        start.group, static_cast<long long>(start.step), start.healed_from, start.heal_bytes,
        start.heal_seconds, gbs);
  }
  // Also every retried attempt (attempt > 0): after an abort that dropped nobody (a stalled
  // group back before its lease ended) the line says who runs the step again.
  if (start.present != last_present || start.attempt > 0) {
    std::string groups;
    for (int g : start.present) groups += (groups.empty() ? "" : ",") + std::to_string(g);
    std::printf("elastic: step %lld attempt %lld: groups %s present (this is group %d)\n",
                static_cast<long long>(start.step), static_cast<long long>(start.attempt),
                groups.c_str(), start.group);
    last_present = start.present;
  }
  std::fflush(stdout);
}

void printAbortedStep(const hsdp::Comm& world, const hsdp::StepStart& start,
                      const hsdp::Status& why) {
  if (world.rank() != 0) return;
  std::printf("elastic: step %lld attempt %lld not committed; running it again (%s)\n",
              static_cast<long long>(start.step), static_cast<long long>(start.attempt),
              why.message().c_str());
  std::fflush(stdout);
}

}  // namespace examples
