// An application that owns MPI (it calls MPI_Init_thread and MPI_Finalize itself, as a framework
// that uses MPI for its own purposes would) and attaches hsdp to it. Checks, against MPI itself:
//  - Session::init refuses an initialised MPI and names attach(); Session::attach changes
//    nothing in the process: MPI_COMM_WORLD keeps the application's error handler, no OMPI_MCA_*
//    variable appears, MPI stays initialised after the Session is gone;
//  - hsdp's world over an application communicator (mpi::adopt of a split) runs collectives
//    equal to MPI's own on that communicator, while the application's own traffic on the same
//    communicator is in flight (hsdp works on a duplicate, so messages never mix);
//  - a ShardedModel trains on the adopted world: one AdamW step, compared with its closed form.
//
//   mpirun -np 4 attach_app
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"

namespace {

int g_rank = 0;

int fail(const std::string& what) {
  std::fprintf(stderr, "attach_app [rank %d]: FAIL: %s\n", g_rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);

  // hsdp may not initialise an MPI the application owns.
  auto refused = hsdp::mpi::Session::init(&argc, &argv);
  if (refused.ok() || refused.status().code() != hsdp::StatusCode::kFailedPrecondition ||
      refused.status().message().find("attach") == std::string::npos)
    return fail("Session::init on an initialised MPI: " + refused.status().toString());

  {
    auto session = hsdp::mpi::Session::attach();
    if (!session.ok()) return fail(session.status().toString());
    if ((*session)->ownsMpi()) return fail("an attached session claims to own MPI");
    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
    if (eh != MPI_ERRORS_ARE_FATAL) return fail("attach changed MPI_COMM_WORLD's error handler");
    if (eh != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&eh);
    for (const char* v : {"OMPI_MCA_btl_tcp_eager_limit", "OMPI_MCA_btl_tcp_links"})
      if (std::getenv(v)) return fail(std::string("attach set ") + v);

    // The application's own communicator: even and odd world ranks.
    MPI_Comm app;
    MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &app);
    int app_rank = 0, app_size = 0;
    MPI_Comm_rank(app, &app_rank);
    MPI_Comm_size(app, &app_size);
    auto comm = hsdp::mpi::adopt(app);
    if (!comm.ok()) return fail(comm.status().toString());
    if ((*comm)->rank() != app_rank || (*comm)->size() != app_size)
      return fail("adopted communicator has another rank order");

    // hsdp's all-gather in flight while the application broadcasts on `app` itself.
    const size_t n = 1001;
    std::vector<float> mine(n), gathered(n * app_size), mpi_gathered(n * app_size);
    for (size_t i = 0; i < n; ++i) mine[i] = float(g_rank * 10000 + i) * 0.5f;
    auto work = (*comm)->iallGather(mine.data(), gathered.data(), n, hsdp::DType::kFloat32);
    if (!work.ok()) return fail(work.status().toString());
    int token = app_rank == 0 ? 4242 : 0;
    MPI_Bcast(&token, 1, MPI_INT, 0, app);
    if (auto s = (*work)->wait(); !s.ok()) return fail(s.toString());
    MPI_Allgather(mine.data(), int(n), MPI_FLOAT, mpi_gathered.data(), int(n), MPI_FLOAT, app);
    if (token != 4242 || gathered != mpi_gathered) return fail("all-gather differs from MPI's");

    std::vector<float> sum(n), mpi_sum(n);
    for (size_t i = 0; i < n; ++i) sum[i] = std::sin(float(i + g_rank));
    MPI_Allreduce(sum.data(), mpi_sum.data(), int(n), MPI_FLOAT, MPI_SUM, app);
    if (auto s = (*comm)->allReduce(sum.data(), n, hsdp::DType::kFloat32, hsdp::RedOp::kSum);
        !s.ok())
      return fail(s.toString());
    for (size_t i = 0; i < n; ++i)
      if (std::fabs(sum[i] - mpi_sum[i]) > 1e-5f * (1 + std::fabs(mpi_sum[i])))
        return fail("all-reduce differs from MPI's at " + std::to_string(i));
    comm->reset();
    MPI_Comm_free(&app);

    // The engine on hsdp's duplicate of the application's world.
    auto world = (*session)->world();
    if (!world.ok()) return fail(world.status().toString());
    auto layout = hsdp::groupRanksIntoNodes(**world);
    if (!layout.ok()) return fail(layout.status().toString());
    auto mesh = hsdp::Mesh::create(**world, *layout, {});
    if (!mesh.ok()) return fail(mesh.status().toString());
    hsdp::EngineConfig cfg;
    cfg.adam = {hsdp::OptimizerKind::kAdamW, 0.01f, 0.9f, 0.999f, 1e-8f, 0.0f};
    auto model = hsdp::ShardedModel::create(**mesh, cfg);
    if (!model.ok()) return fail(model.status().toString());
    const size_t m = 17;
    if (!(*model)->addUnit("u", {{"p", {int64_t(m)}}}).ok()) return fail("addUnit");
    if (auto s = (*model)->finalize(); !s.ok()) return fail(s.toString());
    std::vector<float> init(m);
    for (size_t i = 0; i < m; ++i) init[i] = 1.0f + 0.125f * float(i);
    if (auto s = (*model)->setParameter(0, "p", init.data(), m); !s.ok()) return fail(s.toString());
    if (auto s = (*model)->unshard(0); !s.ok()) return fail(s.toString());
    if (auto s = (*model)->waitForUnshard(0); !s.ok()) return fail(s.toString());
    auto g = (*model)->grad(0, "p");
    if (!g.ok()) return fail(g.status().toString());
    // Rank r's gradient of element i: (i % 3 - 1) * (r + 1); the mean's sign is (i % 3 - 1).
    for (size_t i = 0; i < m; ++i) g->data[i] = float((int(i % 3) - 1) * (g_rank + 1));
    if (auto s = (*model)->reduceGrad(0); !s.ok()) return fail(s.toString());
    if (auto s = (*model)->reshard(0); !s.ok()) return fail(s.toString());
    if (auto s = (*model)->step(); !s.ok()) return fail(s.toString());
    std::vector<float> full;
    if (auto s = (*model)->gatherFullParameters(0, &full); !s.ok()) return fail(s.toString());
    for (size_t i = 0; i < m; ++i) {
      // Adam's first step with bias correction: p - lr * g / (|g| + eps), g the world mean.
      const double gm = (int(i % 3) - 1) * (world_size + 1) / 2.0;
      const double want = init[i] - 0.01 * gm / (std::fabs(gm) + 1e-8);
      if (std::fabs(full[i] - want) > 1e-6) return fail("parameter " + std::to_string(i));
    }
  }
  // hsdp is gone; MPI is still the application's.
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (finalized) return fail("the attached session finalized MPI");
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0)
    std::printf("attach_app: %d ranks, thread level %d: PASS\n", world_size, provided);
  MPI_Finalize();
  return 0;
}
