// hsdp.plan(): hsdp-plan from Python. The arithmetic and the JSON are the library's
// (hsdp/plan.h: makePlan, enumeratePlans, rankPlans, planJson, planAutoJson); this file turns
// keyword arguments into a PlanInput exactly as the tool turns its flags into one.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <optional>
#include <tuple>

#include "hsdp/plan.h"
#include "src/common.h"

namespace hsdp::py {

namespace {

struct PyPlan {
  Plan plan;
  uint64_t budget = 0;  // mem_budget given, 0: none
};

struct PyAutoPlan {
  std::vector<Plan> ranked;  // every configuration, rankPlans' order
  uint64_t budget = 0;
  std::vector<PyPlan> fits() const {
    std::vector<PyPlan> out;
    for (const Plan& p : ranked)
      if (p.gpu.total() <= budget) out.push_back({p, budget});
    return out;
  }
};

// A count given as an int, a whole float (7.5e9) or text ("7.5e9", "125M").
uint64_t countArg(const nb::handle& v, const char* what) {
  if (nb::isinstance<nb::str>(v)) return take(parseCount(nb::cast<std::string>(v), what));
  if (nb::isinstance<nb::bool_>(v)) check(invalidArgument(what, " must be a number, not a bool"));
  if (nb::isinstance<nb::int_>(v)) {
    const long long x = nb::cast<long long>(v);  // OverflowError beyond 64 bits
    if (x < 1) check(invalidArgument(what, " ", x, " must be positive"));
    return static_cast<uint64_t>(x);
  }
  if (nb::isinstance<nb::float_>(v)) {
    const double x = nb::cast<double>(v);
    if (!std::isfinite(x) || x < 1 || x != std::floor(x) || x > 1.8e19)
      check(invalidArgument(what, " ", x, " must be a positive whole number"));
    return static_cast<uint64_t>(x);
  }
  check(invalidArgument(what, " must be an int, a float or a string like '7.5e9', not ",
                        nb::cast<std::string>(nb::str(v.type().attr("__name__")))));
  return 0;
}

uint64_t bytesArg(const nb::handle& v, const char* what) {
  if (nb::isinstance<nb::str>(v)) return take(parseByteSize(nb::cast<std::string>(v), what));
  return countArg(v, what);
}

int positive(int64_t v, const char* what) {
  if (v < 1) check(invalidArgument(what, " ", v, " must be positive"));
  if (v > (1 << 20)) check(invalidArgument(what, " ", v, " is too large"));
  return static_cast<int>(v);
}

nb::object plan(nb::object params, nb::object layers_arg, std::optional<int64_t> units,
                int64_t nodes, int64_t gpus_per_node, std::optional<int64_t> intra_shard,
                std::optional<int64_t> inter_shard, std::optional<std::string> mode, bool hpz,
                const std::string& param_dtype, nb::object offload,
                std::optional<std::string> inter_param_wire,
                std::optional<std::string> inter_grad_wire, std::optional<std::string> replica_wire,
                int64_t quant_block, nb::object mem_budget, bool automatic) {
  PlanInput in;
  std::optional<std::string> layers;  // a str or os.PathLike
  if (!layers_arg.is_none())
    layers = nb::cast<std::string>(nb::module_::import_("os").attr("fspath")(layers_arg));
  // ---- the model ----
  if (params.is_none() == !layers.has_value())
    check(invalidArgument("give exactly one of params=N and layers=FILE"));
  if (!params.is_none()) {
    const int64_t n_units = units.value_or(32);
    if (n_units < 1 || n_units > (int64_t{1} << 24))
      check(invalidArgument("units ", n_units, " must be in [1, 16777216]"));
    in.units = take(splitUnits(countArg(params, "params"), n_units));
  } else {
    if (units)
      check(
          invalidArgument("units applies to params only (layers='", *layers, "' lists the units)"));
    in.units = take(readUnitsFile(*layers, &in.unit_uses));
  }
  // ---- the machine and the policy ----
  in.nodes = positive(nodes, "nodes");
  in.gpus_per_node = positive(gpus_per_node, "gpus_per_node");
  auto dt = parsePlanDType(param_dtype);
  if (!dt.ok()) check(invalidArgument("param_dtype: ", dt.status().message()));
  in.param_dtype = *dt;
  if (nb::isinstance<nb::bool_>(offload)) {
    in.offload_cpu = nb::cast<bool>(offload);
  } else if (!offload.is_none()) {
    const std::string o = nb::cast<std::string>(nb::str(offload));
    if (o != "cpu" && o != "none")
      check(invalidArgument("offload '", o, "': expected 'cpu', 'none', True or False"));
    in.offload_cpu = o == "cpu";
  }
  for (auto [text, field, what] :
       {std::tuple{&inter_param_wire, &in.param_wire, "inter_param_wire"},
        std::tuple{&inter_grad_wire, &in.grad_wire, "inter_grad_wire"},
        std::tuple{&replica_wire, &in.replica_wire, "replica_wire"}}) {
    if (!*text) continue;
    auto w = parseWire(**text);
    if (!w.ok()) check(invalidArgument(what, ": ", w.status().message()));
    *field = *w;
  }
  if (quant_block < 16 || quant_block > (1 << 20))
    check(invalidArgument("quant_block ", quant_block, " must be in [16, 1048576]"));
  in.quant_block = static_cast<uint32_t>(quant_block);
  const uint64_t budget = mem_budget.is_none() ? 0 : bytesArg(mem_budget, "mem_budget");

  if (automatic) {
    if (budget == 0) check(invalidArgument("auto=True needs mem_budget (e.g. '80G')"));
    if (intra_shard || inter_shard || mode || hpz)
      check(
          invalidArgument("auto=True tries every factorization and mode itself: drop "
                          "intra_shard, inter_shard, mode and hpz"));
    check(validatePlanInput(in));
    PyAutoPlan a{enumeratePlans(in), budget};
    rankPlans(&a.ranked);
    return nb::cast(std::move(a));
  }
  auto m = parseShardMode(mode.value_or("zero3"));
  if (!m.ok()) check(invalidArgument("mode: ", m.status().message()));
  in.mode = *m;
  // Defaults as hsdp-plan's and train_mlp's: intra = all GPUs of a node (1 in mode none).
  in.intra_shard = intra_shard ? positive(*intra_shard, "intra_shard")
                               : (in.mode == ShardMode::kNone ? 1 : in.gpus_per_node);
  in.inter_shard = inter_shard ? positive(*inter_shard, "inter_shard") : 1;
  in.hpz = hpz;
  return nb::cast(PyPlan{take(makePlan(in)), budget});
}

nb::dict memoryDict(const PlanMemory& g, int blocks) {
  return dictOf(item("params", g.params), item("grads", g.grads), item("optimizer", g.optimizer),
                item("hpz_secondary", g.hpz_secondary),
                item("model_state_total", g.modelStateTotal()),
                item("gathered_peak", g.gathered_peak), item("gathered_blocks", blocks),
                item("comm_buffers_estimate", g.comm_estimate), item("total", g.total()));
}

nb::dict trafficDict(const PlanTraffic& t) {
  return dictOf(item("all_gather", t.all_gather), item("reduce_scatter", t.reduce_scatter),
                item("all_reduce", t.all_reduce), item("total", t.total()));
}

}  // namespace

void bindPlan(nb::module_& m) {
  nb::class_<PyPlan>(m, "Plan",
                     "One sharding configuration's per-GPU memory and cross-node bytes per step "
                     "(hsdp-plan's numbers; to_dict() is hsdp-plan --json).")
      .def_prop_ro("label", [](const PyPlan& p) { return p.plan.label(); })
      .def_prop_ro("world", [](const PyPlan& p) { return p.plan.world; })
      .def_prop_ro("nodes", [](const PyPlan& p) { return p.plan.input.nodes; })
      .def_prop_ro("gpus_per_node", [](const PyPlan& p) { return p.plan.input.gpus_per_node; })
      .def_prop_ro("intra_shard", [](const PyPlan& p) { return p.plan.input.intra_shard; })
      .def_prop_ro("inter_shard", [](const PyPlan& p) { return p.plan.input.inter_shard; })
      .def_prop_ro("shard_group", [](const PyPlan& p) { return p.plan.shard_group; })
      .def_prop_ro("replicas", [](const PyPlan& p) { return p.plan.replicas; })
      .def_prop_ro("mode", [](const PyPlan& p) { return shardModeName(p.plan.input.mode); })
      .def_prop_ro("hpz", [](const PyPlan& p) { return p.plan.input.hpz; })
      .def_prop_ro("param_dtype",
                   [](const PyPlan& p) { return planDTypeName(p.plan.input.param_dtype); })
      .def_prop_ro("offload", [](const PyPlan& p) { return p.plan.input.offload_cpu; })
      .def_prop_ro("total_params", [](const PyPlan& p) { return p.plan.total_params; })
      .def_prop_ro("padded_params", [](const PyPlan& p) { return p.plan.padded_params; })
      .def_prop_ro("shard_params", [](const PyPlan& p) { return p.plan.shard_params; })
      .def_prop_ro(
          "units", [](const PyPlan& p) { return p.plan.input.units; },
          "parameter count of each unit")
      .def_prop_ro(
          "per_gpu_bytes",
          [](const PyPlan& p) { return memoryDict(p.plan.gpu, p.plan.gathered_blocks); },
          "per-GPU bytes by category: params, grads, optimizer, hpz_secondary, "
          "model_state_total, gathered_peak, comm_buffers_estimate, total")
      .def_prop_ro("per_gpu_total", [](const PyPlan& p) { return p.plan.gpu.total(); })
      .def_prop_ro("per_rank_pinned_cpu_bytes",
                   [](const PyPlan& p) { return p.plan.host_pinned_per_rank; })
      .def_prop_ro("per_node_pinned_cpu_bytes",
                   [](const PyPlan& p) { return p.plan.host_pinned_per_node; })
      .def_prop_ro(
          "cross_node_bytes_per_step",
          [](const PyPlan& p) {
            nb::dict d = trafficDict(p.plan.cross_node);
            d["per_node"] = p.plan.crossNodePerNode();
            return d;
          },
          "bytes leaving a node per step, all nodes: all_gather, reduce_scatter, all_reduce, "
          "total, per_node")
      .def_prop_ro(
          "fits",
          [](const PyPlan& p) -> std::optional<bool> {
            if (p.budget == 0) return std::nullopt;
            return p.plan.gpu.total() <= p.budget;
          },
          "whether the per-GPU total is within mem_budget (None without one)")
      .def(
          "to_dict", [](const PyPlan& p) { return loadsJson(planJson(p.plan, p.budget)); },
          "hsdp-plan --json's object")
      .def("__repr__", [](const PyPlan& p) {
        return strCat("<hsdp.Plan ", p.plan.label(), ": ", formatBytes(p.plan.gpu.total()),
                      " per GPU, ", formatBytes(p.plan.cross_node.total()),
                      " across nodes per step>");
      });

  nb::class_<PyAutoPlan>(m, "AutoPlan",
                         "plan(auto=True): every factorization and mode, ranked by cross-node "
                         "bytes per step; those within mem_budget are `fits`.")
      .def_prop_ro("considered", [](const PyAutoPlan& a) { return a.ranked.size(); })
      .def_prop_ro("mem_budget", [](const PyAutoPlan& a) { return a.budget; })
      .def_prop_ro("fits", &PyAutoPlan::fits, "the configurations that fit, best first")
      .def_prop_ro(
          "best",
          [](const PyAutoPlan& a) -> std::optional<PyPlan> {
            auto f = a.fits();
            if (f.empty()) return std::nullopt;
            return f.front();
          },
          "the first of `fits` (the least cross-node traffic), None when nothing fits")
      .def(
          "to_dict",
          [](const PyAutoPlan& a) { return loadsJson(planAutoJson(a.ranked, a.budget)); },
          "hsdp-plan --auto --json's object")
      .def("__repr__", [](const PyAutoPlan& a) {
        return strCat("<hsdp.AutoPlan ", a.fits().size(), " of ", a.ranked.size(),
                      " configurations fit ", formatBytes(a.budget), " per GPU>");
      });

  m.def("plan", &plan, nb::arg("params") = nb::none(), nb::kw_only(),
        nb::arg("layers") = nb::none(), nb::arg("units") = nb::none(), nb::arg("nodes"),
        nb::arg("gpus_per_node"), nb::arg("intra_shard") = nb::none(),
        nb::arg("inter_shard") = nb::none(), nb::arg("mode") = nb::none(), nb::arg("hpz") = false,
        nb::arg("param_dtype") = "bf16", nb::arg("offload") = "none",
        nb::arg("inter_param_wire") = nb::none(), nb::arg("inter_grad_wire") = nb::none(),
        nb::arg("replica_wire") = nb::none(), nb::arg("quant_block") = kDefaultQuantBlock,
        nb::arg("mem_budget") = nb::none(), nb::arg("auto") = false,
        nb::sig("def plan(params: int | float | str | None = None, *, "
                "layers: str | os.PathLike[str] | None = None, units: int | None = None, "
                "nodes: int, gpus_per_node: int, intra_shard: int | None = None, "
                "inter_shard: int | None = None, mode: str | None = None, hpz: bool = False, "
                "param_dtype: str = 'bf16', offload: str | bool = 'none', "
                "inter_param_wire: str | None = None, inter_grad_wire: str | None = None, "
                "replica_wire: str | None = None, quant_block: int = 2048, "
                "mem_budget: int | str | None = None, auto: bool = False) -> Plan | AutoPlan"),
        R"doc(Per-GPU memory and cross-node traffic of a sharding configuration, without running it
(the numbers of ``hsdp-plan --json``; formulas in include/hsdp/plan.h, guide in docs/plan.md).

The model is either ``params`` (a total such as ``7.5e9``, ``"125M"`` or an int, split into
``units`` near-equal units, 32 by default) or ``layers``: a file with one unit per line
(``COUNT`` or ``NAME COUNT``, e.g. docs/units-gpt2-small.txt).

Args:
    nodes, gpus_per_node: the cluster (N nodes of G GPUs, one rank per GPU).
    intra_shard: shard factor inside a node, divides G (default G; 1 in mode "none").
    inter_shard: shard factor across nodes, divides N (default 1).
    mode: "none" | "zero1" | "zero2" | "zero3" (default).
    hpz: zero3 only: keep an intra-node secondary partition for the backward gathers.
    param_dtype: "bf16" (mixed precision, default) or "fp32".
    offload: "cpu" (or True): the optimizer state in pinned host memory.
    inter_param_wire, inter_grad_wire, replica_wire: "fp32" | "bf16" | "int8" | "int4".
    quant_block: elements per int8/int4 scale (a multiple of 16).
    mem_budget: bytes per GPU (an int or "80G", "80GiB", "80GB"); sets ``Plan.fits``.
    auto: try every factorization and mode; returns an AutoPlan ranked by cross-node bytes.

Returns:
    Plan (``to_dict()`` equals hsdp-plan --json), or AutoPlan with auto=True.

Raises:
    InvalidArgumentError (a ValueError) naming the argument and value.

Example:
    >>> p = hsdp.plan(params=7.5e9, nodes=2, gpus_per_node=8, intra_shard=8, mode="zero3")
    >>> p.per_gpu_bytes["total"], p.cross_node_bytes_per_step["total"]
)doc");
}

}  // namespace hsdp::py
