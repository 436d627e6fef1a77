// The world of the MPI GoogleTest binaries (tests/common/mpi_test_main.h): started by their main()
// (mpi_test_main.cc, and gpu_test_main.cc for the GPU programs of several ranks).
#include <cstdio>
#include <memory>

#include "hsdp/mpi.h"
#include "tests/common/mpi_test_main.h"
#include "tests/common/rank_report.h"

namespace hsdp::testing {
namespace {

std::unique_ptr<mpi::Session> g_session;
std::unique_ptr<Comm> g_world;

}  // namespace

Comm& world() { return *g_world; }

bool startWorld(int* argc, char*** argv) {
  auto session = mpi::Session::init(argc, argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().toString().c_str());
    return false;
  }
  g_session = std::move(*session);
  auto world = g_session->world();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.status().toString().c_str());
    g_session.reset();
    return false;
  }
  g_world = std::move(*world);
  reportFailuresOnlyOffRankZero(g_world->rank());
  return true;
}

void stopWorld() {
  g_world.reset();  // free the communicator before MPI_Finalize
  g_session.reset();
}

}  // namespace hsdp::testing
