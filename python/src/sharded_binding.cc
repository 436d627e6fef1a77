// hsdp._hsdp.ShardedModel: the engine (hsdp/sharded_model.h) over a Mesh of hsdp.Session, for
// python/hsdp/torch (PyTorch modules on hsdp). The engine keeps the shards, the gathered units and
// the full gradients; params_view() and grads_view() hand out numpy arrays over the engine's own
// memory (no copy), which torch.from_numpy turns into tensors that view it. A view is valid while
// its unit is gathered (params) or until reduce_grad (grads): python/hsdp/torch rebinds the
// module's parameters at every unshard and detaches them at every reshard.
//
// Blocking calls (waits, reductions, the step, checkpoints) run without the GIL.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "hsdp/sharded_model.h"
#include "src/common.h"
#include "src/mesh_handles.h"

namespace hsdp::py {

namespace {

struct PyModel : MeshChild {
  std::unique_ptr<ShardedModel> model;
  void release() override { model.reset(); }
  ShardedModel& live() {
    if (!model)
      check(failedPrecondition("the hsdp ShardedModel is closed (its Mesh or Session was closed)"));
    return *model;
  }
};

// Runs f() without the GIL and raises its error with the GIL held again.
template <typename F>
void unlocked(F&& f) {
  Status s;
  {
    nb::gil_scoped_release released;
    s = f();
  }
  check(s);
}

// Runs f() (a StatusOr) without the GIL; its value, or its error raised with the GIL held again.
template <typename F>
auto takeUnlocked(F&& f) {
  std::optional<decltype(f())> r;
  {
    nb::gil_scoped_release released;
    r.emplace(f());
  }
  return take(std::move(*r));
}

template <typename T, typename P>
T parsed(StatusOr<T> v, const char* what, const P& value) {
  if (!v.ok()) check(invalidArgument(what, " '", value, "': ", v.status().message()));
  return *v;
}

struct Settings {
  std::string mode = "zero3", optimizer = "adamw";
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  float clip_norm = 0.0f;
  bool hpz = false, offload_cpu = false;
  std::string param_dtype = "float32", reduce_dtype = "float32";
  std::optional<std::string> inter_param_wire, inter_grad_wire, replica_wire;
  std::optional<uint32_t> quant_block;
  std::optional<int> adam_threads, chunks;
  std::optional<bool> hierarchical;
  std::optional<double> timeout_s;
  int max_gathered_units = 0;
  std::optional<std::string> elastic_data;  // keep | redistribute (elastic mode's data slot)
};

EngineConfig engineConfig(const Settings& s) {
  EngineConfig c;
  c.mode = parsed(parseShardMode(s.mode), "mode", s.mode);
  c.adam.kind = parsed(parseOptimizerKind(s.optimizer), "optimizer kind", s.optimizer);
  c.adam.lr = s.lr;
  c.adam.beta1 = s.beta1;
  c.adam.beta2 = s.beta2;
  c.adam.eps = s.eps;
  c.adam.weight_decay = s.weight_decay;
  check(validate(c.adam));
  c.clip_norm = s.clip_norm;
  c.hpz = s.hpz;
  c.precision.param_dtype = parsed(parseDType(s.param_dtype), "param_dtype", s.param_dtype);
  c.precision.reduce_dtype = parsed(parseDType(s.reduce_dtype), "reduce_dtype", s.reduce_dtype);
  if (s.inter_param_wire)
    c.wires.inter_param_wire =
        parsed(parseWire(*s.inter_param_wire), "inter_param_wire", *s.inter_param_wire);
  if (s.inter_grad_wire)
    c.wires.inter_grad_wire =
        parsed(parseWire(*s.inter_grad_wire), "inter_grad_wire", *s.inter_grad_wire);
  if (s.replica_wire)
    c.wires.replica_wire = parsed(parseWire(*s.replica_wire), "replica_wire", *s.replica_wire);
  c.wires.quant_block = s.quant_block;
  c.offload.cpu = s.offload_cpu;
  c.offload.adam_threads = s.adam_threads;
  c.pipeline.chunks = s.chunks;
  c.pipeline.hierarchical = s.hierarchical;
  c.pipeline.max_gathered_units = s.max_gathered_units;
  c.failure.timeout_s = s.timeout_s;
  if (s.elastic_data)
    c.elastic.data = parsed(parseElasticData(*s.elastic_data), "elastic_data", *s.elastic_data);
  return c;
}

using FlatView = nb::ndarray<nb::numpy, float, nb::ndim<1>, nb::c_contig>;

using ViewOf = StatusOr<ParamView> (ShardedModel::*)(int, std::string_view);

// The view (`view`: ShardedModel::param or grad) of unit `unit`'s first parameter: offset 0 of
// the unit's whole flat buffer.
ParamView firstView(ShardedModel& model, int unit, ViewOf view) {
  if (unit < 0 || unit >= model.numUnits())
    check(outOfRange("unit ", unit, " of ", model.numUnits()));
  return take((model.*view)(unit, model.layout(unit).params()[0].name));
}

// The unit's whole flat buffer of parameters or gradients as a numpy array kept alive by the
// model's Python object.
FlatView flatView(PyModel& pm, int unit, ViewOf view) {
  ShardedModel& model = pm.live();
  const ParamView first = firstView(model, unit, view);
  // A numpy array over device memory would crash the first reader.
  if (model.device() != Device::kHost)
    check(failedPrecondition("params_view, grads_view: the engine keeps unit '",
                             model.unitName(unit), "' in device memory (device views)"));
  return FlatView(first.data, {model.layout(unit).numel()}, nb::find(&pm));
}

// On a CUDA mesh: the same flat buffer as a torch tensor on the mesh's device (DLPack, no copy),
// kept alive by the model's Python object. python/hsdp/torch/_cuda.py uses it as the CPU path
// uses flatView through torch.from_numpy.
using DeviceView = nb::ndarray<nb::pytorch, float, nb::ndim<1>, nb::c_contig, nb::device::cuda>;

DeviceView deviceView(PyModel& pm, int unit, ViewOf view) {
  ShardedModel& model = pm.live();
  const ParamView first = firstView(model, unit, view);
  if (model.device() != Device::kCuda || pm.owner == nullptr)
    check(failedPrecondition("device views: the engine keeps unit '", model.unitName(unit),
                             "' in host memory (params_view, grads_view)"));
  return DeviceView(first.data, {model.layout(unit).numel()}, nb::find(&pm), {}, nb::dtype<float>(),
                    nb::device::cuda::value, pm.owner->cuda_device);
}

nb::dict memoryDict(const MemoryReport& r) {
  return dictOf(item("param_bytes", r.param_bytes), item("grad_bytes", r.grad_bytes),
                item("optim_bytes", r.optim_bytes),
                item("gathered_peak_bytes", r.gathered_peak_bytes),
                item("gathered_capacity_bytes", r.gathered_capacity_bytes),
                item("comm_bytes", r.comm_bytes), item("offload_host_bytes", r.offload_host_bytes),
                item("hpz_bytes", r.hpz_bytes), item("total", r.total()));
}

nb::dict stepStartDict(const StepStart& s) {
  nb::dict d;
  d["step"] = s.step;
  d["attempt"] = s.attempt;
  d["group"] = s.group;
  d["present"] = s.present;
  d["slot"] = s.slot;
  d["slots"] = s.slots;
  d["healed"] = s.healed;
  d["healed_from"] = s.healed_from;
  d["heal_bytes"] = s.heal_bytes;
  d["heal_seconds"] = s.heal_seconds;
  return d;
}

using ParamTuple = std::tuple<std::string, std::vector<int64_t>, bool>;

std::unique_ptr<PyModel> create(PyMesh& mesh, const Settings& s) {
  EngineConfig cfg = engineConfig(s);
  // A CUDA mesh puts the engine's state on its device (created with that device current).
  if (mesh.cuda_device >= 0) cfg.device = Device::kCuda;
  MeshDeviceScope on_device(mesh);
  auto pm = std::make_unique<PyModel>();
  pm->model = take(ShardedModel::create(mesh.live(), cfg));
  pm->attach(mesh);
  return pm;
}

}  // namespace

void bindShardedModel(nb::module_& m) {
  nb::class_<Settings>(m, "EngineSettings", "ShardedModel.create's settings (EngineConfig)")
      .def(nb::init<>())
      .def_rw("mode", &Settings::mode)
      .def_rw("optimizer", &Settings::optimizer)
      .def_rw("lr", &Settings::lr)
      .def_rw("beta1", &Settings::beta1)
      .def_rw("beta2", &Settings::beta2)
      .def_rw("eps", &Settings::eps)
      .def_rw("weight_decay", &Settings::weight_decay)
      .def_rw("clip_norm", &Settings::clip_norm)
      .def_rw("hpz", &Settings::hpz)
      .def_rw("offload_cpu", &Settings::offload_cpu)
      .def_rw("param_dtype", &Settings::param_dtype)
      .def_rw("reduce_dtype", &Settings::reduce_dtype)
      .def_rw("inter_param_wire", &Settings::inter_param_wire, nb::arg().none())
      .def_rw("inter_grad_wire", &Settings::inter_grad_wire, nb::arg().none())
      .def_rw("replica_wire", &Settings::replica_wire, nb::arg().none())
      .def_rw("quant_block", &Settings::quant_block, nb::arg().none())
      .def_rw("adam_threads", &Settings::adam_threads, nb::arg().none())
      .def_rw("chunks", &Settings::chunks, nb::arg().none())
      .def_rw("hierarchical", &Settings::hierarchical, nb::arg().none())
      .def_rw("timeout_s", &Settings::timeout_s, nb::arg().none())
      .def_rw("max_gathered_units", &Settings::max_gathered_units)
      .def_rw("elastic_data", &Settings::elastic_data, nb::arg().none());

  auto cls = nb::class_<PyModel>(m, "ShardedModel",
                                 "hsdp's sharding engine on a Mesh (hsdp/sharded_model.h); "
                                 "python/hsdp/torch drives it from nn.Module hooks");
  cls.def_static("create", &create, nb::arg("mesh"), nb::arg("settings"), nb::keep_alive<0, 1>())
      .def(
          "add_unit",
          [](PyModel& pm, std::string name, const std::vector<ParamTuple>& params, bool frozen) {
            std::vector<ParamSpec> specs;
            for (const auto& [pname, shape, decay] : params)
              specs.push_back(ParamSpec{pname, shape, decay});
            return take(pm.live().addUnit(std::move(name), std::move(specs), {frozen}));
          },
          nb::arg("name"), nb::arg("params"), nb::arg("frozen") = false)
      .def("finalize", [](PyModel& pm) { unlocked([&] { return pm.live().finalize(); }); })
      .def(
          "set_parameter",
          [](PyModel& pm, int unit, const std::string& name,
             nb::ndarray<const float, nb::c_contig, nb::device::cpu> full) {
            ShardedModel& model = pm.live();
            unlocked([&] { return model.setParameter(unit, name, full.data(), full.size()); });
          },
          nb::arg("unit"), nb::arg("name"), nb::arg("full"))
      .def("unshard", [](PyModel& pm, int u) { unlocked([&] { return pm.live().unshard(u); }); })
      .def("wait_for_unshard",
           [](PyModel& pm, int u) { unlocked([&] { return pm.live().waitForUnshard(u); }); })
      .def("reshard", [](PyModel& pm, int u) { unlocked([&] { return pm.live().reshard(u); }); })
      .def("reduce_grad",
           [](PyModel& pm, int u) { unlocked([&] { return pm.live().reduceGrad(u); }); })
      .def("step", [](PyModel& pm) { unlocked([&] { return pm.live().step(); }); })
      .def(
          "params_view", [](PyModel& pm, int u) { return flatView(pm, u, &ShardedModel::param); },
          nb::arg("unit"),
          "The unit's gathered parameters, flat (a view of the engine's buffer, valid until "
          "reshard)")
      .def(
          "grads_view", [](PyModel& pm, int u) { return flatView(pm, u, &ShardedModel::grad); },
          nb::arg("unit"),
          "The unit's full gradient, flat (zeroed at its first use in a step; a view of the "
          "engine's buffer, valid until reduce_grad)")
      .def(
          "unit_params",
          [](PyModel& pm, int u) {
            const FlatLayout& l = pm.live().layout(u);
            std::vector<std::tuple<std::string, std::vector<int64_t>, size_t>> out;
            for (size_t i = 0; i < l.params().size(); ++i)
              out.emplace_back(l.params()[i].name, l.params()[i].shape, l.offset(i));
            return out;
          },
          nb::arg("unit"), "(name, shape, flat offset) of each parameter of the unit")
      .def_prop_ro("num_units", [](PyModel& pm) { return pm.live().numUnits(); })
      .def("unit_name", [](PyModel& pm, int u) { return pm.live().unitName(u); })
      .def("set_lr",
           [](PyModel& pm, float lr) { unlocked([&] { return pm.live().setLearningRate(lr); }); })
      .def_prop_ro("lr", [](PyModel& pm) { return pm.live().learningRate(); })
      .def("set_clip_norm",
           [](PyModel& pm, float c) { unlocked([&] { return pm.live().setClipNorm(c); }); })
      .def_prop_ro("last_grad_norm", [](PyModel& pm) { return pm.live().lastGradNorm(); })
      .def(
          "grad_norm",
          [](PyModel& pm) {
            float norm = 0;
            unlocked([&]() -> Status {
              HSDP_ASSIGN_OR_RETURN(norm, pm.live().gradNorm());
              return okStatus();
            });
            return norm;
          },
          "Collective: waits for the reductions; the global gradient norm the next step clips "
          "(elastic mode: after the quorum committed the step; AbortedError when it did not)")
      // Elastic mode (docs/elastic.md): hsdp-elastic's HSDP_ELASTIC_* variables turn it on.
      .def_prop_ro("elastic", [](PyModel& pm) { return pm.live().elastic(); })
      .def(
          "begin_step",
          [](PyModel& pm) {
            ShardedModel& model = pm.live();  // without the GIL: it waits for the quorum, heals
            return stepStartDict(takeUnlocked([&] { return model.beginStep(); }));
          },
          "Collective over the group: the step's quorum, ring and heal; the step to run and "
          "the data slot (without elastic mode: step_count, slot 0 of 1)")
      .def(
          "elastic_membership",
          [](PyModel& pm, int64_t steps) {
            ShardedModel& model = pm.live();
            return takeUnlocked([&] { return model.elasticMembership(steps); });
          },
          nb::arg("steps"),
          "Collective over the group: the group indexes of the quorum that committed each step")
      .def_prop_ro("step_count", [](PyModel& pm) { return pm.live().stepCount(); })
      .def_prop_ro("shard_count", [](PyModel& pm) { return pm.live().shardCount(); })
      .def_prop_ro("mode", [](PyModel& pm) { return shardModeName(pm.live().mode()); })
      .def("take_exposed_comm_seconds",
           [](PyModel& pm) { return pm.live().takeExposedCommSeconds(); })
      .def("take_optimizer_seconds",
           [](PyModel& pm) {
             double total = 0, exposed = 0;
             pm.live().takeOptimizerSeconds(&total, &exposed);
             return std::make_pair(total, exposed);
           })
      .def("memory_report", [](PyModel& pm) { return memoryDict(pm.live().memoryReport()); })
      .def(
          "gather_full",
          [](PyModel& pm, int u) {
            ShardedModel& model = pm.live();
            auto* v = new std::vector<float>();
            nb::capsule owner(v,
                              [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            unlocked([&] { return model.gatherFullParameters(u, v); });
            return nb::ndarray<nb::numpy, float, nb::ndim<1>>(v->data(), {v->size()}, owner);
          },
          nb::arg("unit"), "Collective over the shard group: the unit's whole flat parameters")
      .def(
          "agree_digests",
          [](PyModel& pm, const std::vector<int64_t>& mine) {
            // Collective over the world: for each digest, the first rank whose value differs
            // from rank 0's (-1: every rank agrees). Every rank passes as many digests.
            pm.live();
            Comm& world = pm.owner->live().control();
            const size_t n = mine.size(), ranks = static_cast<size_t>(world.size());
            std::vector<int64_t> all(n * ranks);
            unlocked([&] { return world.allGather(mine.data(), all.data(), n, DType::kInt64); });
            std::vector<int> first(n, -1);
            for (size_t i = 0; i < n; ++i)
              for (size_t r = 1; r < ranks && first[i] < 0; ++r)
                if (all[r * n + i] != all[i]) first[i] = static_cast<int>(r);
            return first;
          },
          nb::arg("digests"))
      .def(
          "save",
          [](PyModel& pm, const std::string& root, const std::string& name, int keep_last) {
            SaveOptions o;
            o.name = name;
            o.keep_last = keep_last;
            ShardedModel& model = pm.live();
            const SaveResult r = takeUnlocked([&] { return model.save(root, o); });
            // written / writer_group: elastic mode, where one group writes (docs/elastic.md).
            return dictOf(item("dir", r.dir), item("step", r.step), item("bytes", r.bytes),
                          item("seconds", r.seconds), item("written", r.written),
                          item("writer_group", r.writer_group));
          },
          nb::arg("root"), nb::arg("name") = "", nb::arg("keep_last") = 0)
      .def(
          "load",
          [](PyModel& pm, const std::string& path, bool optimizer_state) {
            LoadOptions o;
            o.optimizer_state = optimizer_state;
            ShardedModel& model = pm.live();
            const LoadResult r = takeUnlocked([&] { return model.load(path, o); });
            return dictOf(item("dir", r.dir), item("step", r.step),
                          item("bytes_read", r.bytes_read));
          },
          nb::arg("path"), nb::arg("optimizer_state") = true)
      .def(
          "export_safetensors",
          [](PyModel& pm, const std::string& out, const std::string& dtype) {
            ExportOptions o;
            o.dtype = parsed(parseDType(dtype), "dtype", dtype);
            ShardedModel& model = pm.live();
            return takeUnlocked([&] { return model.exportSafetensors(out, o); });
          },
          nb::arg("out"), nb::arg("dtype") = "float32")
      .def("close", &PyModel::release, "Free the engine's memory. Idempotent.")
      .def_prop_ro("closed", [](PyModel& pm) { return !pm.model; });

  // The engine on a CUDA mesh (python/hsdp/torch/_cuda.py): its buffers as torch tensors on the
  // device, and torch's current stream as its compute stream.
  cls.def(
         "device_params_view",
         [](PyModel& pm, int u) { return deviceView(pm, u, &ShardedModel::param); },
         nb::arg("unit"),
         "params_view on a CUDA mesh: a torch tensor on the device (valid until reshard)")
      .def(
          "device_grads_view",
          [](PyModel& pm, int u) { return deviceView(pm, u, &ShardedModel::grad); },
          nb::arg("unit"),
          "grads_view on a CUDA mesh: a torch tensor on the device (valid until reduce_grad)")
      .def(
          "set_compute_stream",
          [](PyModel& pm, uintptr_t stream) {
            pm.live().setComputeStream(reinterpret_cast<void*>(stream));
          },
          nb::arg("stream"),
          "The cudaStream_t (an integer; 0: the legacy default stream) the model's kernels run "
          "on: the engine orders its gathers, reductions and step against it with events. "
          "Between steps only (no unit gathered).");
}

}  // namespace hsdp::py
