// Shared by the MPI GoogleTest binaries that run a test on every mesh of the job: every valid
// factor pair (intra I divides the ranks per node, inter J divides the nodes) of the job's node
// layout, each under a SCOPED_TRACE naming the mesh.
#pragma once

#include <gtest/gtest.h>

#include "hsdp/mesh.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp::testing {

template <typename F>
void forEachMesh(F f) {
  auto l = groupRanksIntoNodes(world());
  ASSERT_TRUE(l.ok());
  for (int I = 1; I <= l->ranks_per_node; ++I) {
    if (l->ranks_per_node % I) continue;
    for (int J = 1; J <= l->num_nodes; ++J) {
      if (l->num_nodes % J) continue;
      auto mesh = Mesh::create(world(), *l, {I, J});
      ASSERT_TRUE(mesh.ok());
      SCOPED_TRACE((*mesh)->describe());
      f(**mesh);
    }
  }
}

}  // namespace hsdp::testing
