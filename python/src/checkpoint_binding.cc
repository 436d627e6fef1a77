// hsdp.checkpoint: a checkpoint's tensors as numpy arrays and hsdp-ckpt's verbs. Everything is the
// library's (hsdp/checkpoint.h): CheckpointReader maps or assembles a tensor, reshardCheckpoint,
// exportCheckpoint, diffCheckpoints and verifyCheckpoint are what hsdp-ckpt runs.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "hsdp/checkpoint.h"
#include "hsdp/files.h"
#include "src/common.h"

namespace hsdp::py {

namespace {

TensorState parseState(const std::string& s) {
  if (s == "param") return TensorState::kParam;
  if (s == "exp_avg") return TensorState::kExpAvg;
  if (s == "exp_avg_sq") return TensorState::kExpAvgSq;
  check(invalidArgument("state '", s, "': expected param, exp_avg or exp_avg_sq"));
  return TensorState::kParam;
}

int indexOf(const CheckpointReader& r, const std::string& name) {
  const int t = r.find(name);
  if (t < 0)
    check(notFound("checkpoint '", r.dir(), "' has no tensor '", name, "' (", r.tensors().size(),
                   " tensors; Checkpoint.names() lists them)"));
  return t;
}

using Array = nb::ndarray<nb::numpy, float>;

// Tensor `name` as a numpy array: the checkpoint's bytes mapped in place (the array owns the
// mapping) when they lie in one run of one file, else numpy's own array filled by the reader
// (numpy's allocator reuses memory and asks for huge pages, which this machine faults in far
// faster than a fresh allocation of small pages).
nb::object tensorArray(CheckpointReader& r, const std::string& name, const std::string& state,
                       bool verify, bool map) {
  const int t = indexOf(r, name);
  const TensorState s = parseState(state);
  std::vector<size_t> shape;
  for (int64_t d : r.tensors()[t].shape) shape.push_back(static_cast<size_t>(d));
  if (map && r.contiguous(t, s)) {
    StatusOr<TensorData> data = [&] {
      nb::gil_scoped_release unlocked;  // the read may take a while; other threads run
      return r.read(t, s, verify, /*map=*/true);
    }();
    auto* owned = new TensorData(take(std::move(data)));
    nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<TensorData*>(p); });
    return nb::cast(Array(owned->data(), shape.size(), shape.data(), owner));
  }
  nb::object arr = nb::module_::import_("numpy").attr("empty")(nb::tuple(nb::cast(shape)),
                                                               nb::arg("dtype") = "float32");
  auto view = nb::cast<nb::ndarray<float, nb::c_contig>>(arr);
  Status st;
  {
    nb::gil_scoped_release unlocked;
    st = r.readInto(t, s, view.data(), verify);
  }
  check(st);
  return arr;
}

}  // namespace

void bindCheckpoint(nb::module_& m) {
  nb::class_<CheckpointTensor>(m, "CheckpointTensor", "One parameter of a checkpoint")
      .def_ro("name", &CheckpointTensor::name, "'<unit>.<param>', as the safetensors export")
      .def_ro("unit", &CheckpointTensor::unit)
      .def_ro("param", &CheckpointTensor::param)
      .def_ro("shape", &CheckpointTensor::shape)
      .def_ro("numel", &CheckpointTensor::numel)
      .def_ro("has_moments", &CheckpointTensor::has_moments,
              "False in a frozen unit (no Adam state)")
      .def_prop_ro("dtype", [](const CheckpointTensor&) { return "float32"; })
      .def("__repr__", [](const CheckpointTensor& t) {
        std::string shape;
        for (int64_t d : t.shape) shape += strCat(shape.empty() ? "" : ", ", d);
        return strCat("<CheckpointTensor ", files::quote(t.name), " (", shape, ") float32>");
      });

  nb::class_<CheckpointReader>(m, "CheckpointReader",
                               "The C++ reader behind hsdp.checkpoint.Checkpoint")
      .def_static(
          "open", [](const std::string& path) { return take(CheckpointReader::open(path)); },
          nb::arg("path"))
      .def_prop_ro("dir", &CheckpointReader::dir)
      .def_prop_ro("step", &CheckpointReader::step)
      .def_prop_ro("tensors", &CheckpointReader::tensors)
      .def("find", &CheckpointReader::find, nb::arg("name"))
      .def(
          "summary",
          [](const CheckpointReader& r, bool checksums) {
            StatusOr<std::string> j = [&] {
              nb::gil_scoped_release unlocked;
              return r.summaryJson(checksums);
            }();
            return loadsJson(take(std::move(j)));
          },
          nb::arg("checksums") = false)
      .def("verify",
           [](const CheckpointReader& r) {
             Status s;
             {
               nb::gil_scoped_release unlocked;
               s = r.verify();
             }
             check(s);
           })
      .def(
          "contiguous",
          [](const CheckpointReader& r, const std::string& name, const std::string& state) {
            return r.contiguous(indexOf(r, name), parseState(state));
          },
          nb::arg("name"), nb::arg("state") = "param")
      .def("tensor", &tensorArray, nb::arg("name"), nb::arg("state") = "param",
           nb::arg("verify") = true, nb::arg("mmap") = true);

  m.def(
      "_inspect",
      [](const std::string& path, bool checksums) {
        auto r = take(CheckpointReader::open(path));
        StatusOr<std::string> j = [&] {
          nb::gil_scoped_release unlocked;
          return r->summaryJson(checksums);
        }();
        return loadsJson(take(std::move(j)));
      },
      nb::arg("path"), nb::arg("checksums") = true);
  m.def(
      "_verify",
      [](const std::string& path) {
        Status s;
        {
          nb::gil_scoped_release unlocked;
          s = verifyCheckpoint(path);
        }
        check(s);
      },
      nb::arg("path"));
  m.def(
      "_reshard",
      [](const std::string& src, const std::string& dst, int world, int ranks_per_node,
         int intra_shard, int inter_shard, const std::string& mode) {
        MeshTarget t;
        t.world_size = world;
        t.ranks_per_node = ranks_per_node;
        t.intra_shard = intra_shard;
        t.inter_shard = inter_shard;
        t.mode = take(parseShardMode(mode));
        for (auto [v, what] : {std::pair{world, "world"},
                               {ranks_per_node, "ranks_per_node"},
                               {intra_shard, "intra_shard"},
                               {inter_shard, "inter_shard"}})
          if (v < 1 || v > (1 << 20)) check(invalidArgument(what, " ", v, " must be in [1, 2^20]"));
        Status s;
        {
          nb::gil_scoped_release unlocked;
          s = reshardCheckpoint(src, dst, t);
        }
        check(s);
      },
      nb::arg("src"), nb::arg("dst"), nb::arg("world"), nb::arg("ranks_per_node"),
      nb::arg("intra_shard"), nb::arg("inter_shard"), nb::arg("mode"));
  m.def(
      "_export_safetensors",
      [](const std::string& src, const std::string& out, const std::string& dtype,
         uint64_t max_shard_bytes) {
        ExportOptions o;
        if (dtype == "fp32" || dtype == "float32") {
          o.dtype = DType::kFloat32;
        } else if (dtype == "bf16" || dtype == "bfloat16") {
          o.dtype = DType::kBFloat16;
        } else {
          check(invalidArgument("dtype '", dtype, "': expected fp32 or bf16"));
        }
        if (max_shard_bytes < 1) check(invalidArgument("max_shard_bytes must be positive"));
        o.max_shard_bytes = max_shard_bytes;
        StatusOr<std::vector<std::string>> files = [&] {
          nb::gil_scoped_release unlocked;
          return exportCheckpoint(src, out, o);
        }();
        return take(std::move(files));
      },
      nb::arg("src"), nb::arg("out"), nb::arg("dtype"), nb::arg("max_shard_bytes"));

  nb::class_<TensorDiff>(m, "TensorDiff", "One tensor's difference between two checkpoints")
      .def_ro("name", &TensorDiff::name, "'fc0.weight', 'fc0.weight (exp_avg)'")
      .def_ro("max_abs", &TensorDiff::max_abs)
      .def_ro("max_rel", &TensorDiff::max_rel, "max |a - b| / max |b|")
      .def("__repr__", [](const TensorDiff& d) {
        return strCat("<TensorDiff ", files::quote(d.name), " max_abs=", d.max_abs,
                      " max_rel=", d.max_rel, ">");
      });
  nb::class_<CheckpointDiff>(m, "CheckpointDiff", "diff(a, b): per tensor, parameters and moments")
      .def_ro("step_a", &CheckpointDiff::step_a)
      .def_ro("step_b", &CheckpointDiff::step_b)
      .def_ro("tensors", &CheckpointDiff::tensors)
      .def_prop_ro("identical", &CheckpointDiff::identical, "same step, every difference 0")
      .def(
          "__bool__", [](const CheckpointDiff& d) { return !d.identical(); },
          "True when the checkpoints differ");
  m.def(
      "_diff",
      [](const std::string& a, const std::string& b) {
        StatusOr<CheckpointDiff> d = [&] {
          nb::gil_scoped_release unlocked;
          return diffCheckpoints(a, b);
        }();
        return take(std::move(d));
      },
      nb::arg("a"), nb::arg("b"));
}

}  // namespace hsdp::py
