// hsdp-plan: per-GPU memory and cross-node traffic of a sharding configuration, predicted without
// running anything (the formulas: include/hsdp/plan.h; the guide: docs/plan.md).
//
//   hsdp-plan --params 7.5e9 --nodes 2 --gpus-per-node 8 --intra-shard 8 --inter-shard 1 --mode
//   zero3
//   hsdp-plan --layers units.txt --nodes 4 --gpus-per-node 8 --mode zero3 --intra-shard 8 \
//             --inter-shard 2 --hpz --param-dtype bf16 --offload cpu --json
//   hsdp-plan --params 7.5e9 --units 32 --nodes 2 --gpus-per-node 8 --auto --mem-budget 80G \
//             --svg plan.svg
//   hsdp-plan --params 1e9 --nodes 4 --gpus-per-node 8 --inter-shard 4 --param-dtype fp32 \
//             --inter-param-wire int8 --inter-grad-wire int8 --replica-wire bf16
//
// Exit codes: 0 ok; 1 --auto found no configuration within the budget; 2 bad input (the message
// names the flag, value, file or line).
#include <climits>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "hsdp/cli.h"
#include "hsdp/files.h"
#include "hsdp/flags.h"
#include "hsdp/plan.h"

namespace {

constexpr int kExitNothingFits = 1;
constexpr int kExitBadInput = 2;
constexpr int64_t kDefaultUnits = 32;

struct Options {
  std::string params, layers, mode = "zero3", dtype = "bf16", offload = "none", budget, svg;
  std::string param_wire, grad_wire, replica_wire;  // "": the policy's element type
  uint32_t quant_block = hsdp::kDefaultQuantBlock;
  int64_t units = kDefaultUnits;
  int64_t nodes = 0, gpus = 0;
  int intra = 0, inter = 0;  // 0: the default (G, 1 in mode none; 1)
  bool hpz = false, json = false, automatic = false;
  bool units_given = false;
};

int fail(const hsdp::Status& s) {
  std::fprintf(stderr, "hsdp-plan: error: %s\n", hsdp::files::printable(s.message()).c_str());
  return kExitBadInput;
}

hsdp::StatusOr<int> toInt(int64_t v, const char* flag) {
  if (v < 1) return hsdp::invalidArgument(flag, " ", v, " must be positive");
  if (v > INT_MAX) return hsdp::invalidArgument(flag, " ", v, " is too large");
  return static_cast<int>(v);
}

std::string count(uint64_t v) {  // 7500000000 -> "7,500,000,000"
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

std::string policy(const hsdp::PlanInput& in) {
  return in.param_dtype == hsdp::DType::kBFloat16
             ? "bf16 mixed precision (bf16 params + grads, fp32 master + 2 Adam moments)"
             : "fp32 (fp32 params + grads, 2 fp32 Adam moments; the shard is the master)";
}

// The step's cross-node bytes with all three collectives on each wire in turn.
void printByWire(const hsdp::Plan& p) {
  std::printf(
      "\ncross-node bytes per step by wire (every collective on it; int8/int4: one fp32 "
      "scale per %u elements)\n",
      p.input.quant_block);
  std::printf("  %-6s %14s %14s %14s %14s %8s\n", "wire", "all-gather", "reduce-scatter",
              "all-reduce", "total", "vs fp32");
  const double fp32 = static_cast<double>(p.traffic_by_wire.front().traffic.total());
  for (const hsdp::PlanWireTraffic& w : p.traffic_by_wire)
    std::printf("  %-6s %14s %14s %14s %14s %7.4fx\n", hsdp::wireName(w.wire),
                hsdp::formatBytes(w.traffic.all_gather).c_str(),
                hsdp::formatBytes(w.traffic.reduce_scatter).c_str(),
                hsdp::formatBytes(w.traffic.all_reduce).c_str(),
                hsdp::formatBytes(w.traffic.total()).c_str(),
                fp32 > 0 ? static_cast<double>(w.traffic.total()) / fp32 : 0.0);
}

void printPlan(const hsdp::Plan& p, uint64_t budget) {
  const hsdp::PlanInput& in = p.input;
  std::printf("model: %s parameters in %zu units (largest %s; padded to multiples of %d: %s)\n",
              count(p.total_params).c_str(), in.units.size(), count(p.largest_unit).c_str(),
              p.shard_group, count(p.padded_params).c_str());
  std::printf("policy: %s%s\n", policy(in).c_str(),
              in.offload_cpu ? "; optimizer state offloaded to pinned CPU memory" : "");
  std::printf(
      "mesh: %d GPUs = %d nodes x %d; intra_shard %d x inter_shard %d = shard group %d; "
      "replicas %d; mode %s%s\n\n",
      p.world, in.nodes, in.gpus_per_node, in.intra_shard, in.inter_shard, p.shard_group,
      p.replicas, hsdp::shardModeName(in.mode), in.hpz ? " + hpZ" : "");

  const char* mode = hsdp::shardModeName(in.mode);
  const bool shard_p = in.mode == hsdp::ShardMode::kZero3;
  const bool shard_g = in.mode == hsdp::ShardMode::kZero3 || in.mode == hsdp::ShardMode::kZero2;
  const std::string e = std::to_string(p.elem_bytes), o = std::to_string(p.optim_bytes_per_elem);
  std::printf(
      "%-26s%16s %12s  formula (e=%d bytes, S=%d, Σs=shard elements, ΣP=padded "
      "elements)\n",
      "per-GPU memory", "bytes", "", p.elem_bytes, p.shard_group);
  auto row = [](const char* name, uint64_t v, const std::string& f) {
    std::printf("  %-24s%16s %12s  %s\n", name, count(v).c_str(), hsdp::formatBytes(v).c_str(),
                f.c_str());
  };
  row("params", p.gpu.params, shard_p ? e + "·Σs (sharded)" : e + "·ΣP (replicated)");
  row("grads", p.gpu.grads, shard_g ? e + "·Σs (sharded)" : e + "·ΣP (replicated)");
  row("optimizer", p.gpu.optimizer,
      in.offload_cpu ? std::string("0 on the GPU (offloaded)")
                     : o + "·Σs (" +
                           (in.param_dtype == hsdp::DType::kBFloat16 ? "fp32 master + 2 moments"
                                                                     : "2 fp32 moments") +
                           (in.mode == hsdp::ShardMode::kNone ? ", replicated)" : ", sharded)"));
  if (in.hpz) row("hpz_secondary", p.gpu.hpz_secondary, e + "·ΣP/I (intra-node partition)");
  row("model_state_total", p.gpu.modelStateTotal(), "the sum above");
  row("gathered_peak", p.gpu.gathered_peak,
      hsdp::strCat(p.gathered_blocks, " blocks x ", e, "·P_max (", mode, ")"));
  row("comm_buffers (estimate)", p.gpu.comm_estimate,
      "MPI transport, hierarchical, 1 chunk; depends on the transport");
  row("total", p.gpu.total(), "model state + gathered + comm (no activations)");
  if (budget > 0)
    std::printf("  budget %s: %s\n", hsdp::formatBytes(budget).c_str(),
                p.gpu.total() <= budget ? "fits" : "DOES NOT FIT");
  if (in.offload_cpu) {
    std::printf(
        "\npinned CPU memory (offload)  per rank %s, per node (%d ranks) %s  formula: "
        "Σs·(4 master + 8 moments + 4 fp32 grad%s)\n",
        hsdp::formatBytes(p.host_pinned_per_rank).c_str(), in.gpus_per_node,
        hsdp::formatBytes(p.host_pinned_per_node).c_str(),
        in.param_dtype == hsdp::DType::kBFloat16 ? " + 2 bf16 param copy" : "");
  }

  const std::string J1 = std::to_string(in.inter_shard - 1), R = std::to_string(p.replicas),
                    M1 = std::to_string(p.replica_nodes - 1), N1 = std::to_string(in.nodes - 1);
  std::string ag, rs, ar;
  switch (in.mode) {
    case hsdp::ShardMode::kNone:
      ag = rs = "none in mode none";
      ar = "2·(N-1)·D = 2·" + N1 + "·D (gradients over the world)";
      break;
    case hsdp::ShardMode::kZero1:
    case hsdp::ShardMode::kZero2:
      ag = "R·(J-1)·D = " + R + "·" + J1 + "·D (updated parameters after the step)";
      rs = "R·(J-1)·D = " + R + "·" + J1 + "·D";
      ar = "2·(M-1)·D = 2·" + M1 + "·D (shard over its replicas, M=N/J nodes)";
      break;
    case hsdp::ShardMode::kZero3:
      ag = in.hpz ? "R·(J-1)·D = " + R + "·" + J1 + "·D (forward only; backward stays in the node)"
                  : "2·R·(J-1)·D = 2·" + R + "·" + J1 + "·D (forward + backward)";
      rs = "R·(J-1)·D = " + R + "·" + J1 + "·D";
      ar = "2·(M-1)·D = 2·" + M1 + "·D (shard over its replicas, M=N/J nodes)";
      break;
  }
  std::printf("\n%-26s%16s %12s  formula (D = %s·ΣP = %s; bytes leaving a node, all nodes)\n",
              "cross-node bytes per step", "bytes", "", e.c_str(),
              hsdp::formatBytes(uint64_t(p.elem_bytes) * p.padded_params).c_str());
  row("all-gather", p.cross_node.all_gather, ag);
  row("reduce-scatter", p.cross_node.reduce_scatter, rs);
  row("all-reduce", p.cross_node.all_reduce, ar);
  row("total", p.cross_node.total(), "all-gather + reduce-scatter + all-reduce");
  row("per node", p.crossNodePerNode(), "total / N");
  const bool z3 = in.mode == hsdp::ShardMode::kZero3;
  const std::string g_intra = z3 ? "3" : "2", g_inter = z3 && !in.hpz ? "3" : "2";
  std::printf("\n%-26s%16s %12s  formula (sent by every rank on the level's communicators)\n",
              "bytes per level per step", "bytes", "");
  row("intra", p.per_level.intra,
      in.mode == hsdp::ShardMode::kNone ? "none in mode none" : g_intra + "·R·J·(I-1)·D");
  row("inter", p.per_level.inter,
      in.mode == hsdp::ShardMode::kNone ? "none in mode none" : g_inter + "·R·(J-1)·D");
  row("replica", p.per_level.replica,
      in.mode == hsdp::ShardMode::kNone ? "2·(W-1)·D (the world)" : "2·(R-1)·D");
  printByWire(p);
}

void printAuto(const std::vector<hsdp::Plan>& fits, size_t considered, uint64_t budget) {
  std::printf("%zu of %zu configurations fit %s per GPU, ranked by cross-node bytes per step:\n\n",
              fits.size(), considered, hsdp::formatBytes(budget).c_str());
  const bool offload = !fits.empty() && fits[0].input.offload_cpu;
  std::printf("%4s %5s %5s %5s %8s  %-10s %12s %12s %12s %12s %12s %14s %12s%s\n", "#", "intra",
              "inter", "shard", "replicas", "mode", "params", "grads", "optimizer", "model_state",
              "gathered", "total/GPU", "xnode/step", offload ? "  pinned CPU/node" : "");
  int rank = 0;
  for (const hsdp::Plan& p : fits) {
    const std::string mode =
        std::string(hsdp::shardModeName(p.input.mode)) + (p.input.hpz ? "+hpz" : "");
    std::printf("%4d %5d %5d %5d %8d  %-10s %12s %12s %12s %12s %12s %14s %12s", ++rank,
                p.input.intra_shard, p.input.inter_shard, p.shard_group, p.replicas, mode.c_str(),
                hsdp::formatBytes(p.gpu.params).c_str(), hsdp::formatBytes(p.gpu.grads).c_str(),
                hsdp::formatBytes(p.gpu.optimizer).c_str(),
                hsdp::formatBytes(p.gpu.modelStateTotal()).c_str(),
                hsdp::formatBytes(p.gpu.gathered_peak).c_str(),
                hsdp::formatBytes(p.gpu.total()).c_str(),
                hsdp::formatBytes(p.cross_node.total()).c_str());
    if (offload) std::printf("  %15s", hsdp::formatBytes(p.host_pinned_per_node).c_str());
    std::printf("\n");
  }
}

int run(const Options& opt, bool intra_given, bool inter_given, bool mode_given) {
  // ---- the model ----
  if (opt.params.empty() == opt.layers.empty())
    return fail(hsdp::invalidArgument("give exactly one of --params N and --layers FILE"));
  hsdp::PlanInput in;
  if (!opt.params.empty()) {
    auto total = hsdp::parseCount(opt.params, "--params");
    if (!total.ok()) return fail(total.status());
    auto units = hsdp::splitUnits(*total, opt.units);
    if (!units.ok()) return fail(units.status());
    in.units = std::move(*units);
  } else {
    if (opt.units_given)
      return fail(hsdp::invalidArgument("--units applies to --params only (--layers '", opt.layers,
                                        "' lists the units)"));
    auto units = hsdp::readUnitsFile(opt.layers, &in.unit_uses);
    if (!units.ok()) return fail(units.status());
    in.units = std::move(*units);
  }
  // ---- the machine and the policy ----
  auto nodes = toInt(opt.nodes, "--nodes");
  if (!nodes.ok()) return fail(nodes.status());
  auto gpus = toInt(opt.gpus, "--gpus-per-node");
  if (!gpus.ok()) return fail(gpus.status());
  in.nodes = *nodes;
  in.gpus_per_node = *gpus;
  auto dtype = hsdp::parsePlanDType(opt.dtype);
  if (!dtype.ok()) return fail(hsdp::invalidArgument("--param-dtype: ", dtype.status().message()));
  in.param_dtype = *dtype;
  if (opt.offload != "cpu" && opt.offload != "none")
    return fail(hsdp::invalidArgument("--offload '", opt.offload, "': expected cpu (or none)"));
  in.offload_cpu = opt.offload == "cpu";
  for (auto [text, field, flag] :
       {std::tuple{&opt.param_wire, &in.param_wire, "--inter-param-wire"},
        std::tuple{&opt.grad_wire, &in.grad_wire, "--inter-grad-wire"},
        std::tuple{&opt.replica_wire, &in.replica_wire, "--replica-wire"}}) {
    if (text->empty()) continue;
    auto w = hsdp::parseWire(*text);
    if (!w.ok()) return fail(hsdp::invalidArgument(flag, ": ", w.status().message()));
    *field = *w;
  }
  in.quant_block = opt.quant_block;
  uint64_t budget = 0;
  if (!opt.budget.empty()) {
    auto b = hsdp::parseByteSize(opt.budget, "--mem-budget");
    if (!b.ok()) return fail(b.status());
    budget = *b;
  }

  std::vector<hsdp::Plan> chart;
  int rc = 0;
  if (opt.automatic) {
    if (budget == 0)
      return fail(hsdp::invalidArgument("--auto needs --mem-budget BYTES (e.g. 80G)"));
    if (intra_given || inter_given || mode_given || opt.hpz)
      return fail(hsdp::invalidArgument(
          "--auto tries every factorization and mode itself: drop --intra-shard, --inter-shard, "
          "--mode and --hpz"));
    std::vector<hsdp::Plan> all = hsdp::enumeratePlans(in);
    hsdp::rankPlans(&all);
    std::vector<hsdp::Plan> fits;
    for (const hsdp::Plan& p : all)
      if (p.gpu.total() <= budget) fits.push_back(p);
    if (fits.empty()) rc = kExitNothingFits;
    if (opt.json) {
      std::printf("%s", hsdp::planAutoJson(all, budget).c_str());
    } else {
      std::printf("model: %s parameters in %zu units; %d nodes x %d GPUs; policy: %s%s\n",
                  count(all.empty() ? 0 : all[0].total_params).c_str(), in.units.size(), in.nodes,
                  in.gpus_per_node, policy(in).c_str(),
                  in.offload_cpu ? "; optimizer offloaded to CPU" : "");
      printAuto(fits, all.size(), budget);
      if (fits.empty()) {
        uint64_t least = UINT64_MAX;
        std::string which;
        for (const hsdp::Plan& p : all)
          if (p.gpu.total() < least) least = p.gpu.total(), which = p.label();
        std::printf("\nnothing fits: the smallest configuration (%s) needs %s per GPU\n",
                    which.c_str(), hsdp::formatBytes(least).c_str());
      }
    }
    chart = std::move(all);
  } else {
    // In [1, 2^20] when given (hsdp/flags.h).
    if (intra_given) in.intra_shard = opt.intra;
    if (inter_given) in.inter_shard = opt.inter;
    auto mode = hsdp::parseShardMode(opt.mode);
    if (!mode.ok()) return fail(hsdp::invalidArgument("--mode: ", mode.status().message()));
    in.mode = *mode;
    // Defaults as train_mlp's: intra = all GPUs of a node (1 in mode none), inter = 1.
    if (!intra_given) in.intra_shard = in.mode == hsdp::ShardMode::kNone ? 1 : in.gpus_per_node;
    in.hpz = opt.hpz;
    auto plan = hsdp::makePlan(in);
    if (!plan.ok()) return fail(plan.status());
    if (opt.json) {
      std::printf("%s", hsdp::planJson(*plan, budget).c_str());
    } else {
      printPlan(*plan, budget);
    }
    if (!opt.svg.empty()) {
      // The chart compares every factorization of this mode.
      for (hsdp::Plan& p : hsdp::enumeratePlans(in))
        if (p.input.mode == in.mode && p.input.hpz == in.hpz) chart.push_back(std::move(p));
      if (chart.empty()) chart.push_back(*plan);
      hsdp::rankPlans(&chart);
    }
  }
  if (!opt.svg.empty()) {
    const std::string title =
        hsdp::strCat("hsdp-plan: ", count(chart.empty() ? 0 : chart[0].total_params),
                     " parameters, ", in.nodes, " nodes x ", in.gpus_per_node, " GPUs, ",
                     hsdp::planDTypeName(in.param_dtype), in.offload_cpu ? ", offload cpu" : "");
    // Never through a link, onto a device, FIFO or directory, or over the --layers input
    // (hsdp/files.h); a failing disk is a runtime failure (exit 3), the rest bad input.
    std::vector<std::string> inputs;
    if (!opt.layers.empty()) inputs.push_back(opt.layers);
    hsdp::Status s = hsdp::files::checkOutputTarget(opt.svg, {}, inputs);
    if (s.ok())
      s = hsdp::files::writeFileAtomically(opt.svg, hsdp::planChartSvg(chart, budget, title));
    if (!s.ok()) {
      fail(hsdp::invalidArgument("--svg: cannot write '", hsdp::files::quote(opt.svg),
                                 "': ", s.message()));
      return hsdp::cli::exitCodeOf(s);
    }
    if (!opt.json) std::printf("\nchart: %s (%zu configurations)\n", opt.svg.c_str(), chart.size());
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "hsdp-plan: per-GPU memory and cross-node traffic of a sharding configuration, "
      "without running it (formulas: include/hsdp/plan.h, guide: docs/plan.md)"};
  app.add_option("--params", opt.params, "total parameter count (7500000000 or 7.5e9)");
  auto* units = hsdp::cli::addInt(app, "--units", opt.units,
                                  "with --params: split into this many equal units (default 32)",
                                  int64_t{1}, int64_t{1} << 24);
  app.add_option("--layers", opt.layers,
                 "file: one unit per line, 'COUNT', 'NAME COUNT' or 'NAME COUNT USES' (USES: times "
                 "used in one forward, e.g. 2 for a tied embedding)");
  constexpr int64_t kMax = 1 << 20;  // nodes, GPUs per node
  hsdp::cli::addInt(app, "--nodes", opt.nodes, "nodes N", int64_t{1}, kMax)->required();
  hsdp::cli::addInt(app, "--gpus-per-node", opt.gpus, "GPUs (ranks) per node G", int64_t{1}, kMax)
      ->required();
  // The shared flags in the planner's words; run() checks their names (the planner's messages:
  // "--mode: ...", "--offload 'x': expected cpu (or none)").
  const hsdp::cli::ShardFactorOptions factors = hsdp::cli::addShardFactorFlags(
      app, opt.intra, opt.inter,
      {"shard factor inside a node, divides G (default G; 1 in mode none)",
       "shard factor across nodes, divides N (default 1)"});
  auto* mode =
      hsdp::cli::addModeFlag(app, opt.mode, "none | zero1 | zero2 | zero3 (default zero3)", false);
  hsdp::cli::addHpzFlag(app, opt.hpz, "zero3: keep an intra-node secondary partition for backward");
  hsdp::cli::addParamDtypeFlag(app, opt.dtype, "bf16 (mixed precision, default) | fp32", false);
  hsdp::cli::addOffloadFlag(app, opt.offload, "cpu: optimizer state in pinned host memory", false);
  app.add_option("--inter-param-wire", opt.param_wire,
                 "wire of parameter all-gathers across nodes: fp32 | bf16 | int8 | int4 "
                 "(default: the --param-dtype's)");
  app.add_option("--inter-grad-wire", opt.grad_wire,
                 "wire of gradient reduce-scatters across nodes (default: the --param-dtype's)");
  app.add_option("--replica-wire", opt.replica_wire,
                 "wire of the replica all-reduce (default: the --param-dtype's)");
  hsdp::cli::addInt(app, "--quant-block", opt.quant_block,
                    "elements per scale of int8/int4 (2048; a multiple of 16)", uint32_t{16},
                    uint32_t{1} << 20);
  app.add_flag("--json", opt.json, "print JSON");
  app.add_flag("--auto", opt.automatic,
               "list every factorization x mode that fits --mem-budget, by cross-node bytes");
  app.add_option("--mem-budget", opt.budget, "bytes per GPU: 80G, 80GiB (binary), 80GB (decimal)");
  app.add_option("--svg", opt.svg, "write an SVG chart of memory and cross-node traffic");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, "hsdp-plan");
  }
  opt.units_given = units->count() > 0;
  return run(opt, factors.intra->count() > 0, factors.inter->count() > 0, mode->count() > 0);
}
