// fault_program: a small MPI program that fails on purpose, for the watchdog and mismatch tests
// (tests/faults/CMakeLists.txt runs it through expect_fault.sh, which checks the lines printed,
// the exit code, the time to exit and that nothing of the job is left).
//
//   fault_program --transport mpi|ucx|nccl --case CASE --rank R [--iters N] [--tag T]
//
// Every rank runs collectives over one communicator of the chosen transport, labelled like the
// engine labels them (unit "fc1" of 1000 floats, unit "fc2" of 333 floats); rank R misbehaves:
//   stop      raises SIGSTOP in the middle of a loop of all-gathers (the watchdog's case)
//   order     starts fc2 before fc1
//   size      starts fc1 with 333 floats
//   dtype     starts fc1 as bf16
//   missing   skips fc1 (starts fc2, then waits at a barrier the others never reach)
//   unshard   the engine: a ShardedModel (zero3 over the whole world as one shard group, the
//             inter level on the chosen transport) with units fc1 (1000 floats) and fc2 (333);
//             rank R skips unshard(fc1) and unshards fc2 first
//   none      nothing: the job must succeed (the tests' control)
// Exit codes: 0 done, 2 bad arguments, 3 a failure reported by a Status, 77 no CUDA device (nccl).
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hsdp/mesh.h"
#include "hsdp/mpi.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"
#include "hsdp/transport_registry.h"
#include "hsdp/watchdog.h"
#if HSDP_HAVE_CUDA
#include "collectives/nccl/cuda_resources.h"
#endif

namespace {

struct Args {
  std::string transport = "mpi";
  std::string fault = "none";
  int rank = 1;
  int iters = 200;
};

int fail(int rank, const hsdp::Status& s) {
  std::fprintf(stderr, "fault_program [rank %d]: error: %s\n", rank, s.toString().c_str());
  return 3;
}

// Buffers for both units, in the memory the transport moves (host, or device for NCCL).
struct Buffers {
  void* send = nullptr;
  void* recv = nullptr;
  std::vector<float> host_send, host_recv;
#if HSDP_HAVE_CUDA
  hsdp::gpu::DeviceBuffer dsend, drecv;
#endif
};

hsdp::Status allocate(const Args& a, int n, Buffers* b) {
  const size_t elems = 1000;
  if (a.transport == "nccl") {
#if HSDP_HAVE_CUDA
    HSDP_ASSIGN_OR_RETURN(b->dsend, hsdp::gpu::DeviceBuffer::allocate(elems * sizeof(float)));
    HSDP_ASSIGN_OR_RETURN(b->drecv, hsdp::gpu::DeviceBuffer::allocate(n * elems * sizeof(float)));
    b->send = b->dsend.data();
    b->recv = b->drecv.data();
    return hsdp::okStatus();
#else
    return hsdp::failedPrecondition("built without CUDA");
#endif
  }
  b->host_send.assign(elems, 1.0f);
  b->host_recv.assign(n * elems, 0.0f);
  b->send = b->host_send.data();
  b->recv = b->host_recv.data();
  return hsdp::okStatus();
}

// One all-gather of `unit` (count elements of dtype), started and waited for.
hsdp::Status gather(hsdp::Comm& c, const Buffers& b, const char* unit, size_t count,
                    hsdp::DType dtype) {
  hsdp::watchdog::Label label(unit, "test group");
  HSDP_ASSIGN_OR_RETURN(hsdp::WorkHandle w, c.iallGather(b.send, b.recv, count, dtype));
  hsdp::watchdog::WaitScope wait("test wait", unit);
  return w->wait();
}

// The engine's own labels: the hierarchical gather's sub-collectives carry the unit's name.
int runEngine(const Args& a, hsdp::Comm& world) {
  const int me = world.rank();
  if (a.transport != "mpi") setenv("HSDP_TRANSPORT_INTER", a.transport.c_str(), 1);
  auto layout = hsdp::groupRanksIntoNodes(world);
  if (!layout.ok()) return fail(me, layout.status());
  auto mesh = hsdp::Mesh::create(world, *layout, {0, layout->num_nodes});
  if (!mesh.ok()) return fail(me, mesh.status());
  auto model_or = hsdp::ShardedModel::create(**mesh, hsdp::EngineConfig{});
  if (!model_or.ok()) return fail(me, model_or.status());
  hsdp::ShardedModel& model = **model_or;
  hsdp::Status s = model.addUnit("fc1", {{"weight", {1000}}}).status();
  if (s.ok()) s = model.addUnit("fc2", {{"weight", {333}}}).status();
  if (s.ok()) s = model.finalize();
  for (int u : me == a.rank ? std::vector<int>{1, 0} : std::vector<int>{0, 1}) {
    if (s.ok()) s = model.unshard(u);
    if (s.ok()) s = model.waitForUnshard(u);
    if (s.ok()) s = model.reshard(u);
  }
  if (!s.ok()) return fail(me, s);
  if (me == 0) std::printf("fault_program: unshard on %s done\n", a.transport.c_str());
  return 0;
}

int run(const Args& a, hsdp::Comm& world) {
  const int me = world.rank();
  if (a.fault == "unshard") return runEngine(a, world);
  auto own = world.split(0, me);
  if (!own.ok()) return fail(me, own.status());
  auto comm_or = hsdp::createTransport(a.transport, std::move(*own));
  if (!comm_or.ok()) return fail(me, comm_or.status());
  hsdp::Comm& c = **comm_or;
  c.setName("test comm");
  Buffers b;
  if (hsdp::Status s = allocate(a, c.size(), &b); !s.ok()) return fail(me, s);
  const bool odd = me == a.rank;
  const hsdp::DType f32 = hsdp::DType::kFloat32;
  hsdp::Status s;
  if (a.fault == "stop" || a.fault == "none") {
    for (int i = 0; i < a.iters && s.ok(); ++i) {
      if (odd && a.fault == "stop" && i == a.iters / 2) {
        timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        std::fprintf(stderr, "fault_program [rank %d]: stopping at %.3f\n", me,
                     now.tv_sec + now.tv_nsec * 1e-9);
        std::fflush(stderr);
        raise(SIGSTOP);
      }
      s = gather(c, b, "fc1", 1000, f32);
    }
  } else if (a.fault == "order") {
    s = gather(c, b, odd ? "fc2" : "fc1", odd ? 333 : 1000, f32);
    if (s.ok()) s = gather(c, b, odd ? "fc1" : "fc2", odd ? 1000 : 333, f32);
  } else if (a.fault == "size") {
    s = gather(c, b, "fc1", odd ? 333 : 1000, f32);
  } else if (a.fault == "dtype") {
    s = gather(c, b, "fc1", 1000, odd ? hsdp::DType::kBFloat16 : f32);
  } else if (a.fault == "missing") {
    // Same count, so an unchecked transport matches the calls up silently; the others then wait
    // in fc2 for a rank that went on to the barrier.
    if (!odd) s = gather(c, b, "fc1", 1000, f32);
    if (s.ok()) s = gather(c, b, "fc2", 1000, f32);
  } else {
    std::fprintf(stderr, "fault_program: unknown --case %s\n", a.fault.c_str());
    return 2;
  }
  if (s.ok()) s = c.barrier();
  if (!s.ok()) return fail(me, s);
  if (me == 0) std::printf("fault_program: %s on %s done\n", a.fault.c_str(), a.transport.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--transport")
      a.transport = v;
    else if (k == "--case")
      a.fault = v;
    else if (k == "--rank")
      a.rank = std::atoi(v.c_str());
    else if (k == "--iters")
      a.iters = std::atoi(v.c_str());
    else if (k == "--tag")
      continue;  // names the job's processes for the test (pgrep)
    else {
      std::fprintf(stderr, "fault_program: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
#if HSDP_HAVE_CUDA
  if (a.transport == "nccl" && hsdp::gpu::deviceCount() == 0) {
    std::printf("fault_program: no CUDA device, skipped\n");
    return 77;
  }
#else
  if (a.transport == "nccl") {
    std::printf("fault_program: built without CUDA, skipped\n");
    return 77;
  }
#endif
  auto session = hsdp::mpi::Session::init(&argc, &argv);
  if (!session.ok()) return fail(hsdp::mpi::Session::worldRank(), session.status());
  int rc = 0;
  {
    auto world = (*session)->world();
    if (!world.ok()) return fail(hsdp::mpi::Session::worldRank(), world.status());
    rc = run(a, **world);
    if (rc != 0) (*world)->abortJob(rc);
  }
  return rc;
}
