// hsdp._hsdp: the extension behind the hsdp package (python/hsdp/__init__.py re-exports it).
// Each part binds one public header of libhsdp: plan_binding.cc hsdp/plan.h, topology_binding.cc
// hsdp/topology_report.h, checkpoint_binding.cc hsdp/checkpoint.h, collectives_binding.cc
// hsdp/mpi.h, mesh.h and hier_collectives.h, sharded_binding.cc hsdp/sharded_model.h,
// cuda_binding.cc hsdp/nccl.h (CUDA meshes; in a CUDA build only).
#include "hsdp/version.h"
#include "src/common.h"

namespace nb = nanobind;

NB_MODULE(_hsdp, m) {
  m.doc() = "libhsdp from Python: the planner, topology, checkpoints and hierarchical collectives";
  m.attr("__version__") = HSDP_VERSION_STRING;
  // A torch model sharded by hsdp.torch holds its engine through hooks and closures (a reference
  // cycle through the model) until the interpreter tears down, which does not collect cycles:
  // nanobind's shutdown report would list them as leaks.
  nb::set_leak_warnings(false);
  hsdp::py::registerErrors(m);
  hsdp::py::bindPlan(m);
  hsdp::py::bindTopology(m);
  hsdp::py::bindCheckpoint(m);
  hsdp::py::bindCollectives(m);
  hsdp::py::bindShardedModel(m);
  hsdp::py::bindCuda(m);
}
