// A fault in the middle of a save, for tests/checkpoint/ckpt_kill.sh on the emulated cluster.
//   ckpt_kill save ROOT [FAULT]
//                         train 2 steps, save (committed), train 1, start an async save and,
//                         while it is being written, the last rank (on the last node):
//                           kill  kills itself (SIGKILL; the default)
//                           stop  stops itself (SIGSTOP: a hung rank; the others' wait for the
//                                 save times out, HSDP_TIMEOUT_S)
//                           cut   takes its node's link down (ip link set eth0 down, in the
//                                 node's network namespace: every rank there is cut off)
//   ckpt_kill load ROOT   a new job: load ROOT (its `latest`) and compare the parameters bit for
//                         bit with training straight to the loaded step in this job
#include <signal.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "hsdp/mpi.h"
#include "tests/checkpoint/ckpt_test_util.h"

using namespace hsdp;

namespace {

// The test model plus one large unit, so that each rank's data file takes a while to write.
StatusOr<std::unique_ptr<ShardedModel>> build(const Mesh& mesh) {
  EngineConfig cfg;
  cfg.mode = ShardMode::kZero3;
  cfg.adam.lr = 0.01f;
  HSDP_ASSIGN_OR_RETURN(auto model, ShardedModel::create(mesh, cfg));
  for (auto& [name, params] : ckpttest::testUnits())
    HSDP_RETURN_IF_ERROR(model->addUnit(name, params).status());
  HSDP_RETURN_IF_ERROR(model->addUnit("big", {{"weight", {2048, 2048}}}).status());
  HSDP_RETURN_IF_ERROR(model->finalize());
  for (int u = 0; u < model->numUnits(); ++u)
    for (const ParamSpec& p : model->layout(u).params()) {
      std::vector<float> v(p.numel());
      for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * float(int(i % 201) - 100) + float(u);
      HSDP_RETURN_IF_ERROR(model->setParameter(u, p.name, v.data(), v.size()));
    }
  return model;
}

int run(const std::string& phase, const std::string& root, const std::string& fault, Comm& world) {
  auto layout = groupRanksIntoNodes(world);
  if (!layout.ok()) return 2;
  auto mesh = Mesh::create(world, *layout, {});
  if (!mesh.ok()) return 2;
  auto model = build(**mesh);
  if (!model.ok()) {
    std::fprintf(stderr, "build: %s\n", model.status().toString().c_str());
    return 2;
  }
  ShardedModel& m = **model;
  const int rank = world.rank();
  auto check = [&](const Status& s, const char* what) {
    if (s.ok()) return true;
    std::fprintf(stderr, "ckpt_kill [rank %d]: %s: %s\n", rank, what, s.toString().c_str());
    return false;
  };
  if (phase == "save") {
    for (int s = 0; s < 2; ++s)
      if (!check(ckpttest::trainStep(m, rank, s, 1), "train")) return 3;
    if (!check(m.save(root).status(), "save")) return 3;
    if (!check(ckpttest::trainStep(m, rank, 2, 1), "train")) return 3;
    if (!check(m.saveAsync(root), "saveAsync")) return 3;
    if (rank == world.size() - 1) {
      std::printf("ckpt_kill: rank %d: %s while step 3 is being saved\n", rank,
                  fault == "kill"   ? "kills itself"
                  : fault == "stop" ? "stops itself"
                                    : "takes its node's link down");
      std::fflush(stdout);
      if (fault == "kill") raise(SIGKILL);
      if (fault == "stop") raise(SIGSTOP);
      if (fault == "cut" && std::system("ip link set dev eth0 down") != 0) {
        std::fprintf(stderr, "ckpt_kill [rank %d]: ip link set dev eth0 down failed\n", rank);
        return 4;
      }
    }
    // Does not complete: the job ends through mpirun (kill) or the watchdog (stop, cut), or the
    // save committed before the fault reached it and the job ends on the next wait.
    if (!check(m.waitForSave().status(), "waitForSave")) return 3;
    if (!check(ckpttest::trainStep(m, rank, 3, 1), "train")) return 3;
    return 0;
  }
  auto r = m.load(root);
  if (!check(r.status(), "load")) return 3;
  auto ref = build(**mesh);
  if (!ref.ok()) return 3;
  for (int s = 0; s < r->step; ++s)
    if (!check(ckpttest::trainStep(**ref, rank, s, 1), "train")) return 3;
  int bad = 0;
  for (int u = 0; u < m.numUnits(); ++u) {
    std::vector<float> a, b;
    if (!check(m.gatherFullParameters(u, &a), "gather") ||
        !check((*ref)->gatherFullParameters(u, &b), "gather"))
      return 3;
    if (a != b) ++bad;
  }
  if (rank == 0)
    std::printf("ckpt_kill: loaded %s at step %lld: %s\n", r->dir.c_str(),
                static_cast<long long>(r->step),
                bad ? "DIFFERS from training straight" : "equals training straight, bit for bit");
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto session = mpi::Session::init(&argc, &argv);
  if (!session.ok() || argc < 3 || argc > 4) return 2;
  const std::string fault = argc == 4 ? argv[3] : "kill";
  if (fault != "kill" && fault != "stop" && fault != "cut") return 2;
  auto world = (*session)->world();
  if (!world.ok()) return 2;
  int rc = run(argv[1], argv[2], fault, **world);
  world->reset();
  return rc;
}
