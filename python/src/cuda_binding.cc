// The CUDA side of the binding (python/hsdp/torch/_cuda.py drives it): the NCCL world a CUDA
// mesh is built over (Session.mesh(device="cuda")), the device made current while the engine is
// created on it, and `cuda_built`, whether this libhsdp has the CUDA memory space at all. The
// only file of the binding that names CUDA: in a build without CUDA (HSDP_WITH_CUDA=OFF, or no
// toolkit and NCCL at configure time) it compiles to the FailedPrecondition that says so, and the
// rest of the package builds and imports unchanged.
#ifdef HSDP_HAVE_CUDA
#include <cuda_runtime.h>

#include "hsdp/nccl.h"
#endif

#include <memory>

#include "src/common.h"
#include "src/mesh_handles.h"

namespace hsdp::py {

StatusOr<std::unique_ptr<Comm>> cudaWorld(Comm& world, int device, int* chosen) {
#ifdef HSDP_HAVE_CUDA
  HSDP_ASSIGN_OR_RETURN(nccl::NcclOptions options, nccl::NcclOptions::fromEnv());
  if (device >= 0) options.device = device;
  // A duplicate of the session's world as the bootstrap (the NCCL world owns it): the session
  // keeps its own communicator for host traffic.
  HSDP_ASSIGN_OR_RETURN(std::unique_ptr<Comm> bootstrap, world.split(0, world.rank()));
  StatusOr<std::unique_ptr<Comm>> comm = nccl::createNcclComm(std::move(bootstrap), options);
  if (!comm.ok())
    return comm.status().withContext(
        strCat("Session.mesh(device='cuda", device >= 0 ? strCat(":", device) : "", "')"));
  *chosen = static_cast<nccl::NcclComm&>(**comm).device();
  return comm;
#else
  (void)world, (void)device, (void)chosen;
  return failedPrecondition(
      "device='cuda': this hsdp was built without CUDA (HSDP_WITH_CUDA=OFF, or no CUDA toolkit "
      "and NCCL when it was configured); build it with CUDA and NCCL (docs/gpu.md)");
#endif
}

MeshDeviceScope::MeshDeviceScope(const PyMesh& mesh) {
#ifdef HSDP_HAVE_CUDA
  if (mesh.cuda_device < 0) return;
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != mesh.cuda_device) {
    if (cudaError_t e = cudaSetDevice(mesh.cuda_device); e != cudaSuccess)
      check(failedPrecondition("cudaSetDevice(", mesh.cuda_device, "): ", cudaGetErrorName(e), ": ",
                               cudaGetErrorString(e)));
    previous_ = current;
  }
#else
  (void)mesh;
#endif
}

MeshDeviceScope::~MeshDeviceScope() {
#ifdef HSDP_HAVE_CUDA
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
#endif
}

void bindCuda(nb::module_& m) {
#ifdef HSDP_HAVE_CUDA
  m.attr("cuda_built") = true;
#else
  m.attr("cuda_built") = false;
#endif
}

}  // namespace hsdp::py
