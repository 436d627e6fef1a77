// hsdp-plan --json: a plan (or --auto's ranked list) as JSON. One implementation for the tool and
// the Python binding (hsdp.plan(...).to_dict()), so both print the same numbers.
#include <nlohmann/json.hpp>

#include "hsdp/plan.h"

namespace hsdp {

namespace {

using json = nlohmann::json;

json memoryJson(const Plan& p) {
  return {{"params", p.gpu.params},
          {"grads", p.gpu.grads},
          {"optimizer", p.gpu.optimizer},
          {"hpz_secondary", p.gpu.hpz_secondary},
          {"model_state_total", p.gpu.modelStateTotal()},
          {"gathered_peak", p.gpu.gathered_peak},
          {"gathered_blocks", p.gathered_blocks},
          {"comm_buffers_estimate", p.gpu.comm_estimate},
          {"total", p.gpu.total()}};
}

json trafficJson(const PlanTraffic& t) {
  return {{"all_gather", t.all_gather},
          {"reduce_scatter", t.reduce_scatter},
          {"all_reduce", t.all_reduce},
          {"total", t.total()}};
}

json planObject(const Plan& p) {
  const PlanInput& in = p.input;
  json cross = trafficJson(p.cross_node);
  cross["per_node"] = p.crossNodePerNode();
  json j = {{"label", p.label()},
            {"nodes", in.nodes},
            {"gpus_per_node", in.gpus_per_node},
            {"world", p.world},
            {"intra_shard", in.intra_shard},
            {"inter_shard", in.inter_shard},
            {"shard_group", p.shard_group},
            {"replicas", p.replicas},
            {"mode", shardModeName(in.mode)},
            {"hpz", in.hpz},
            {"param_dtype", planDTypeName(in.param_dtype)},
            {"offload", in.offload_cpu ? "cpu" : "none"},
            {"units", in.units.size()},
            {"total_params", p.total_params},
            {"padded_params", p.padded_params},
            {"shard_params", p.shard_params},
            {"largest_unit", p.largest_unit},
            {"largest_padded_unit", p.largest_padded},
            {"per_gpu_bytes", memoryJson(p)},
            {"per_node_pinned_cpu_bytes", p.host_pinned_per_node},
            {"per_rank_pinned_cpu_bytes", p.host_pinned_per_rank},
            {"cross_node_bytes_per_step", cross}};
  auto wireOr = [&](const std::optional<Wire>& w) {
    return w ? std::string(wireName(*w)) : std::string(planDTypeName(in.param_dtype));
  };
  j["wires"] = {{"param", wireOr(in.param_wire)},
                {"grad", wireOr(in.grad_wire)},
                {"replica", wireOr(in.replica_wire)},
                {"quant_block", in.quant_block}};
  json by = json::object();
  for (const PlanWireTraffic& w : p.traffic_by_wire) by[wireName(w.wire)] = trafficJson(w.traffic);
  j["cross_node_bytes_per_step_by_wire"] = by;
  j["level_bytes_per_step"] = {{"intra", p.per_level.intra},
                               {"inter", p.per_level.inter},
                               {"replica", p.per_level.replica},
                               {"total", p.per_level.total()}};
  return j;
}

}  // namespace

std::string planJson(const Plan& plan, uint64_t budget) {
  json j = planObject(plan);
  if (budget > 0) j["mem_budget"] = budget, j["fits"] = plan.gpu.total() <= budget;
  return j.dump(2) + "\n";
}

std::string planAutoJson(const std::vector<Plan>& ranked, uint64_t budget) {
  json j = {{"mem_budget", budget}, {"considered", ranked.size()}, {"fits", json::array()}};
  for (const Plan& p : ranked)
    if (p.gpu.total() <= budget) j["fits"].push_back(planObject(p));
  return j.dump(2) + "\n";
}

}  // namespace hsdp
