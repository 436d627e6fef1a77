// hsdp.Session, Mesh and Collectives: hsdp's MPI session (hsdp/mpi.h), the two-level mesh
// (hsdp/mesh.h) and the hierarchical all-gather / reduce-scatter / all-reduce
// (hsdp/hier_collectives.h) on host arrays (numpy, or anything with DLPack or the buffer
// protocol). python/hsdp/collectives.py allocates default outputs and closes sessions at exit.
//
// Lifetimes: src/mesh_handles.h.
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "src/common.h"
#include "src/mesh_handles.h"

namespace hsdp::py {

namespace {

struct PyCollectives : MeshChild {
  std::unique_ptr<HierarchicalCollectives> h;
  void release() override { h.reset(); }
  HierarchicalCollectives& live() {
    if (!h) check(failedPrecondition("the hsdp Collectives are closed (their Session was closed)"));
    return *h;
  }
};

std::unique_ptr<PySession> makeSession(bool attach) {
  auto s = std::make_unique<PySession>();
  s->session = take(attach ? mpi::Session::attach() : mpi::Session::init(nullptr, nullptr));
  s->world = take(s->session->world());
  return s;
}

WireFormat wireArg(const std::string& name, uint32_t block, const char* what) {
  auto w = parseWire(name);
  if (!w.ok()) check(invalidArgument(what, ": ", w.status().message()));
  WireFormat f{*w, block};
  check(validate(f));
  return f;
}

RedOp opArg(const std::string& op) {
  if (op == "sum") return RedOp::kSum;
  if (op == "avg" || op == "mean") return RedOp::kAvg;
  check(invalidArgument("op '", op, "': expected sum or avg"));
  return RedOp::kSum;
}

using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;

std::string dtypeText(nb::dlpack::dtype d) {
  const char* kind = d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float)    ? "float"
                     : d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int)    ? "int"
                     : d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt)   ? "uint"
                     : d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) ? "bfloat"
                                                                                      : "other";
  return strCat(kind, static_cast<int>(d.bits));
}

// The hsdp DType of a host array, with its element count; errors name the argument.
template <typename A>
DType arrayDType(const A& a, const char* what) {
  if (a.device_type() != nb::device::cpu::value)
    check(invalidArgument(what, ": a host (CPU) array is needed; this one lives on device type ",
                          a.device_type()));
  // C-contiguous: strides (in elements) of a row-major array of its shape.
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect)
      check(invalidArgument(what,
                            ": the array is not contiguous (make it with "
                            "numpy.ascontiguousarray)"));
    expect *= static_cast<int64_t>(a.shape(i));
  }
  const nb::dlpack::dtype d = a.dtype();
  if (d == nb::dtype<float>()) return DType::kFloat32;
  if (d == nb::dtype<int32_t>()) return DType::kInt32;
  if (d == nb::dtype<int64_t>()) return DType::kInt64;
  if (d == nb::dtype<uint8_t>()) return DType::kUInt8;
  if (d.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && d.bits == 16 &&
      d.lanes == 1)
    return DType::kBFloat16;
  check(invalidArgument(what, ": dtype ", dtypeText(d),
                        " is not supported (float32, bfloat16, int32, int64 or uint8)"));
  return DType::kFloat32;
}

void sameDType(DType a, DType b, const char* what) {
  if (a != b)
    check(invalidArgument(what, ": dtype ", dtypeName(b), " differs from the input's ",
                          dtypeName(a)));
}

nb::dict shapeDict(const Mesh& m) {
  const MeshShape& s = m.shape();
  return dictOf(item("world", s.world_size), item("nodes", s.num_nodes),
                item("ranks_per_node", s.ranks_per_node), item("intra_shard", s.intra_shard),
                item("inter_shard", s.inter_shard), item("shard_group", s.shardGroupSize()),
                item("replicas", s.replicas()));
}

nb::dict coordsDict(const Mesh& m) {
  const MeshCoords& c = m.coords();
  return dictOf(item("world_rank", c.world_rank), item("node", c.node),
                item("local_rank", c.local_rank), item("intra_group", c.intra_group),
                item("intra_idx", c.intra_idx), item("inter_group", c.inter_group),
                item("inter_idx", c.inter_idx), item("shard_rank", c.shard_rank),
                item("replica_rank", c.replica_rank));
}

}  // namespace

void bindCollectives(nb::module_& m) {
  nb::class_<PySession>(m, "Session", nb::is_weak_referenceable(),
                        "hsdp inside an MPI job (run under mpirun). init() starts MPI (and "
                        "finalizes it on close()); attach() joins an MPI the application "
                        "started, e.g. with mpi4py, and never finalizes it.")
      .def_static(
          "init", [] { return makeSession(false); },
          "Initialise MPI for hsdp (MPI_Init_thread, hsdp's process tuning). "
          "FailedPreconditionError when MPI is already initialised: use attach().")
      .def_static(
          "attach", [] { return makeSession(true); },
          "Join the MPI the application initialised (mpi4py). hsdp's traffic runs on a "
          "duplicate of MPI_COMM_WORLD, never mixing with the application's.")
      .def_prop_ro("rank", [](PySession& s) { return s.live().rank(); })
      .def_prop_ro("size", [](PySession& s) { return s.live().size(); })
      .def_prop_ro("owns_mpi",
                   [](PySession& s) {
                     if (!s.session) check(failedPrecondition("the hsdp Session is closed"));
                     return s.session->ownsMpi();
                   })
      .def_prop_ro("closed", [](const PySession& s) { return !s.world; })
      .def("barrier",
           [](PySession& s) {
             Comm& w = s.live();
             nb::gil_scoped_release unlocked;
             check(w.barrier());
           })
      .def(
          "_mesh",
          [](PySession& s, int intra_shard, int inter_shard, int ranks_per_node,
             const std::string& intra_transport, const std::string& inter_transport,
             const std::string& device, int device_index) {
            Comm& w = s.live();
            if (device != "cpu" && device != "cuda")
              check(invalidArgument("device '", device, "': expected cpu or cuda"));
            NodeLayout layout = ranks_per_node > 0
                                    ? take(virtualNodeLayout(w.size(), ranks_per_node))
                                    : take(groupRanksIntoNodes(w));
            MeshSpec spec;
            spec.intra_shard = intra_shard;
            spec.inter_shard = inter_shard;
            spec.intra_transport = intra_transport;
            spec.inter_transport = inter_transport;
            auto pm = std::make_unique<PyMesh>();
            {
              nb::gil_scoped_release unlocked;
              // A CUDA mesh: every level on NCCL over an NCCL world (the engine's CUDA memory
              // space runs its collectives there), the layout still the MPI world's hosts.
              StatusOr<std::unique_ptr<Mesh>> made = [&]() -> StatusOr<std::unique_ptr<Mesh>> {
                if (device == "cpu") return Mesh::create(w, layout, spec);
                HSDP_ASSIGN_OR_RETURN(pm->device_world,
                                      cudaWorld(w, device_index, &pm->cuda_device));
                if (spec.intra_transport.empty()) spec.intra_transport = "nccl";
                if (spec.inter_transport.empty()) spec.inter_transport = "nccl";
                return Mesh::create(*pm->device_world, layout, spec);
              }();
              if (!made.ok()) {
                nb::gil_scoped_acquire locked;
                check(made.status());
              }
              pm->mesh = std::move(*made);
            }
            pm->owner = &s;
            s.meshes.push_back(pm.get());
            return pm;
          },
          nb::arg("intra_shard"), nb::arg("inter_shard"), nb::arg("ranks_per_node"),
          nb::arg("intra_transport"), nb::arg("inter_transport"), nb::arg("device") = "cpu",
          nb::arg("device_index") = -1, nb::keep_alive<0, 1>())
      .def("close", &PySession::close,
           "Free hsdp's MPI objects (every Mesh and Collectives made from this Session) and, "
           "after init(), finalize MPI. Idempotent.");

  nb::class_<PyMesh>(m, "Mesh",
                     "The two-level mesh: shard groups of intra_shard ranks on each "
                     "of inter_shard nodes, replicated over the rest")
      .def_prop_ro("shape", [](PyMesh& p) { return shapeDict(p.live()); })
      .def_prop_ro("coords", [](PyMesh& p) { return coordsDict(p.live()); })
      .def_prop_ro("device",
                   [](PyMesh& p) {
                     p.live();
                     return p.cuda_device < 0 ? std::string("cpu") : strCat("cuda:", p.cuda_device);
                   })
      .def("describe", [](PyMesh& p) { return p.live().describe(); })
      .def(
          "_collectives",
          [](PyMesh& p, const std::string& level, int chunks, const std::string& gather_wire,
             const std::string& reduce_wire, const std::string& allreduce_wire,
             uint32_t quant_block) {
            Mesh& mesh = p.live();
            HierOptions o;
            o.chunks = chunks;
            o.gather_wire = wireArg(gather_wire, quant_block, "gather_wire");
            o.reduce_wire = wireArg(reduce_wire, quant_block, "reduce_wire");
            o.allreduce_wire = wireArg(allreduce_wire, quant_block, "allreduce_wire");
            if (chunks < 1) check(invalidArgument("chunks ", chunks, " must be >= 1"));
            auto pc = std::make_unique<PyCollectives>();
            if (level == "shard") {
              pc->h = std::make_unique<HierarchicalCollectives>(mesh.intraShard(),
                                                                mesh.interShard(), o);
            } else {
              check(invalidArgument("level '", level, "': expected shard"));
            }
            pc->attach(p);
            return pc;
          },
          nb::arg("level"), nb::arg("chunks"), nb::arg("gather_wire"), nb::arg("reduce_wire"),
          nb::arg("allreduce_wire"), nb::arg("quant_block"), nb::keep_alive<0, 1>());

  nb::class_<PyCollectives>(m, "Collectives",
                            "Hierarchical all-gather / reduce-scatter / all-reduce over a mesh's "
                            "shard group (inter-node phase, then intra-node)")
      .def_prop_ro("group_size", [](PyCollectives& c) { return c.live().groupSize(); })
      .def_prop_ro("shard_index", [](PyCollectives& c) { return c.live().shardIndex(); })
      .def(
          "_all_gather",
          [](PyCollectives& c, In shard, Out full, std::optional<std::string> wire) {
            HierarchicalCollectives& h = c.live();
            const DType dt = arrayDType(shard, "shard");
            sameDType(dt, arrayDType(full, "out"), "out");
            const size_t n = shard.size();
            if (full.size() != n * static_cast<size_t>(h.groupSize()))
              check(invalidArgument("out has ", full.size(), " elements; the all-gather of ", n,
                                    " per rank over ", h.groupSize(), " ranks needs ",
                                    n * h.groupSize()));
            std::optional<WireFormat> w;
            if (wire) w = wireArg(*wire, h.options().gather_wire.block, "wire");
            nb::gil_scoped_release unlocked;
            Status s;
            if (w) {
              StatusOr<WorkHandle> work = h.iallGather(shard.data(), full.data(), n, dt, *w);
              s = work.ok() ? (*work)->wait() : work.status();
            } else {
              s = h.allGather(shard.data(), full.data(), n, dt);
            }
            nb::gil_scoped_acquire locked;
            check(s);
          },
          nb::arg("shard"), nb::arg("out"), nb::arg("wire") = nb::none())
      .def(
          "_reduce_scatter",
          [](PyCollectives& c, In full, Out shard, const std::string& op) {
            HierarchicalCollectives& h = c.live();
            const DType dt = arrayDType(full, "full");
            sameDType(dt, arrayDType(shard, "out"), "out");
            const size_t g = static_cast<size_t>(h.groupSize());
            if (full.size() % g != 0)
              check(invalidArgument("the reduce-scatter's input has ", full.size(),
                                    " elements, not a multiple of the group's ", g, " ranks"));
            if (shard.size() != full.size() / g)
              check(invalidArgument("out has ", shard.size(), " elements; the reduce-scatter of ",
                                    full.size(), " over ", g, " ranks gives ", full.size() / g));
            const RedOp r = opArg(op);
            nb::gil_scoped_release unlocked;
            Status s = h.reduceScatter(full.data(), shard.data(), shard.size(), dt, r);
            nb::gil_scoped_acquire locked;
            check(s);
          },
          nb::arg("full"), nb::arg("out"), nb::arg("op"))
      .def(
          "_all_reduce",
          [](PyCollectives& c, Out buf, const std::string& op) {
            HierarchicalCollectives& h = c.live();
            const DType dt = arrayDType(buf, "buf");
            const RedOp r = opArg(op);
            nb::gil_scoped_release unlocked;
            Status s = h.allReduce(buf.data(), buf.size(), dt, r);
            nb::gil_scoped_acquire locked;
            check(s);
          },
          nb::arg("buf"), nb::arg("op"));
}

}  // namespace hsdp::py
