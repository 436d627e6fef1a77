// The Python handles of hsdp's MPI session and mesh, shared by the binding's files: a Mesh keeps
// its Session alive and everything made from a Mesh (Collectives, a ShardedModel) keeps the Mesh
// alive (nb::keep_alive); closing a Session first closes every Mesh made from it, and closing a
// Mesh first releases everything made from it, so no MPI object is freed after MPI_Finalize,
// whatever order Python collects them in.
#pragma once

#include <algorithm>
#include <memory>
#include <vector>

#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "src/common.h"

namespace hsdp::py {

struct PyMesh;

// Something made from a Mesh that must be freed before the Mesh is (Collectives, ShardedModel).
struct MeshChild {
  PyMesh* owner = nullptr;
  // Frees the hsdp object; later calls on the handle raise "closed".
  virtual void release() = 0;
  virtual ~MeshChild();
  void attach(PyMesh& mesh);
};

struct PySession {
  std::unique_ptr<mpi::Session> session;
  std::unique_ptr<Comm> world;
  std::vector<PyMesh*> meshes;
  void close();
  ~PySession() { close(); }
  Comm& live() {
    if (!world) check(failedPrecondition("the hsdp Session is closed"));
    return *world;
  }
};

struct PyMesh {
  PySession* owner = nullptr;
  // A mesh on a CUDA device (cuda_binding.cc): the NCCL world it is built over, which outlives
  // the mesh's communicators (split from it), and its device. Null and -1 on a host mesh.
  std::unique_ptr<Comm> device_world;
  int cuda_device = -1;
  std::unique_ptr<Mesh> mesh;
  std::vector<MeshChild*> children;
  void close() {
    for (MeshChild* c : children) c->release(), c->owner = nullptr;
    children.clear();
    mesh.reset();
    device_world.reset();  // after the mesh: its communicators were split from it
  }
  ~PyMesh() {
    close();
    if (owner) std::erase(owner->meshes, this);
  }
  Mesh& live() {
    if (!mesh) check(failedPrecondition("the hsdp Mesh is closed (its Session was closed)"));
    return *mesh;
  }
};

// CUDA meshes (cuda_binding.cc; a build without CUDA says so, as FailedPrecondition).
// The NCCL world over `world`'s members on CUDA device `device` (-1: HSDP_CUDA_DEVICE, else the
// rank's index on its host modulo the visible devices); collective over `world`. Sets *chosen to
// the device it runs on.
StatusOr<std::unique_ptr<Comm>> cudaWorld(Comm& world, int device, int* chosen);
// Makes `mesh`'s CUDA device current while it lives (the engine allocates on the device current
// at ShardedModel::create); nothing on a host mesh.
class MeshDeviceScope {
 public:
  explicit MeshDeviceScope(const PyMesh& mesh);
  ~MeshDeviceScope();
  MeshDeviceScope(const MeshDeviceScope&) = delete;
  MeshDeviceScope& operator=(const MeshDeviceScope&) = delete;

 private:
  int previous_ = -1;
};

inline MeshChild::~MeshChild() {
  if (owner) std::erase(owner->children, this);
}
inline void MeshChild::attach(PyMesh& mesh) {
  owner = &mesh;
  mesh.children.push_back(this);
}

inline void PySession::close() {
  for (PyMesh* m : meshes) m->close(), m->owner = nullptr;
  meshes.clear();
  world.reset();
  session.reset();  // MPI_Finalize after init(); nothing after attach()
}

}  // namespace hsdp::py
