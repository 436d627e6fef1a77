// The conformance suite (conformance_suite.h) on the host transports, under mpirun at every
// layout of tests/CMakeLists.txt (HSDP_LAYOUTS):
//   Mpi           the world and every sub-communicator of every valid mesh of the (virtual) node
//                 layout: intra, inter, shard group, replica (each set of members once)
//   Ucx           the same members as UCX communicators, plus the world with the small-message
//                 limit at 0 (ring everywhere) and at 1 GiB (recursive doubling / Bruck
//                 everywhere), so both families of algorithms meet MPI at every size, plus the
//                 world and the replica groups built from worker addresses exchanged out of band
//                 (MPI_Allgather standing in for etcd), with no bootstrap (the replica level's
//                 form, UcxComm::createFromAddresses)
//   Hierarchical  the two-level schedules over every two-level mesh's shard group: one chunk and
//   three
//                 pipelined chunks with the inter level on MPI, three with it on UCX (UCX
//                 builds); their oracle is the flat shard group in shard order
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "collectives/mpi/mpi_comm.h"
#include "hsdp/hier_collectives.h"
#include "hsdp/mesh.h"
#include "hsdp/transport_registry.h"
#include "tests/collectives/conformance/conformance_suite.h"
#include "tests/common/mpi_test_main.h"

#if HSDP_HAVE_UCX
#include "collectives/ucx/ucx_comm.h"
#endif

namespace hsdp::conformance {
namespace {

using hsdp::testing::world;

MPI_Comm raw(Comm& c) { return dynamic_cast<mpi::MpiComm&>(c).raw(); }

// HSDP_TEST_CONFORMANCE_CASES=world,shard (a setting of this test only, for the slow emulated
// cluster, whose cluster.sh forwards HSDP_* variables to the ranks): only the
// communicators whose names start with one of these; unset, all of them.
bool wanted(const std::string& name) {
  const char* v = std::getenv("HSDP_TEST_CONFORMANCE_CASES");
  if (v == nullptr || *v == 0) return true;
  std::string list = v;
  for (size_t b = 0; b <= list.size();) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    if (e > b && name.compare(0, e - b, list, b, e - b) == 0) return true;
    b = e + 1;
  }
  return false;
}

// Adds `comm` unless, on every rank, one already in `comms` has the same members in the same
// order (meshes share many groups: every intra[1xJ] is a single rank). The verdict is agreed over
// the world, so every rank runs the same cases.
void addUnlessSeen(std::vector<std::pair<std::string, Comm*>>& comms, std::string name,
                   Comm* comm) {
  if (!wanted(name)) return;
  int seen = 0;
  for (auto& [other, c] : comms) {
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(raw(*c), raw(*comm), &cmp);
    if (cmp == MPI_IDENT || cmp == MPI_CONGRUENT) seen = 1;
  }
  int everywhere = 0;
  MPI_Allreduce(&seen, &everywhere, 1, MPI_INT, MPI_LAND, raw(world()));
  if (!everywhere) comms.push_back({std::move(name), comm});
}

// Every valid mesh of the job's node layout, built once.
struct Meshes {
  std::vector<std::unique_ptr<Mesh>> all;
  std::vector<std::pair<std::string, Comm*>> comms;  // world and every mesh's sub-communicators
};

std::unique_ptr<Meshes> g_meshes;
// The communicators the backends build over the meshes' (UCX, schedules), freed before them.
std::vector<std::unique_ptr<Comm>> g_owned;

// Everything goes on every rank at the same point, before MPI_Finalize (not in static
// destructors, after MPI's and UCX's own teardown): the cases, then the communicators.
class Teardown : public ::testing::Environment {
 public:
  void TearDown() override {
    g_owned.clear();
    g_meshes.reset();
  }
};
const auto* const kTeardown = ::testing::AddGlobalTestEnvironment(new Teardown);

Meshes& meshes() {
  if (!g_meshes)
    g_meshes = [] {
      auto fx = std::make_unique<Meshes>();
      auto layout = groupRanksIntoNodes(world());
      EXPECT_TRUE(layout.ok()) << layout.status().toString();
      addUnlessSeen(fx->comms, "world", &world());
      for (int I = 1; I <= layout->ranks_per_node; ++I) {
        if (layout->ranks_per_node % I) continue;
        for (int J = 1; J <= layout->num_nodes; ++J) {
          if (layout->num_nodes % J) continue;
          auto mesh = Mesh::create(world(), *layout, {I, J});
          EXPECT_TRUE(mesh.ok()) << mesh.status().toString();
          const std::string tag = strCat("[", I, "x", J, "]");
          for (auto [name, comm] : {std::pair<const char*, Comm*>{"intra", &(*mesh)->intraShard()},
                                    {"inter", &(*mesh)->interShard()},
                                    {"shard", &(*mesh)->shardGroup()},
                                    {"replica", &(*mesh)->replica()}})
            addUnlessSeen(fx->comms, name + tag, comm);
          fx->all.push_back(std::move(*mesh));
        }
      }
      return fx;
    }();
  return *g_meshes;
}

// What the host backends share: host memory, available in every build, and the reduce-scatter
// of runs (the default packs on the host); the rest of the contract unless a backend says.
struct HostBackend : Contract {
  static constexpr bool kRuns = true;
  static std::string unavailable() { return ""; }
  static Memory& memory() {
    static HostMemory m;
    return m;
  }
};

struct MpiBackend : HostBackend {
  static const char* name() { return "mpi"; }
  static std::vector<Case>& cases() {
    static std::vector<Case>* c = [] {
      auto* v = new std::vector<Case>();
      for (auto& [name, comm] : meshes().comms) v->push_back({name, comm, raw(*comm)});
      return v;
    }();
    return *c;
  }
};

#if HSDP_HAVE_UCX
std::unique_ptr<Comm> ucxOver(Comm& members, const ucx::UcxOptions* options = nullptr) {
  auto dup = members.split(0, members.rank());
  EXPECT_TRUE(dup.ok()) << dup.status().toString();
  auto c = options ? ucx::createUcxComm(std::move(*dup), *options)
                   : createTransport("ucx", std::move(*dup));
  EXPECT_TRUE(c.ok()) << c.status().toString();
  if (!c.ok()) return nullptr;
  EXPECT_STREQ((*c)->transportName(), "ucx");
  EXPECT_EQ((*c)->rank(), members.rank());
  return std::move(*c);
}

// The members' worker addresses through MPI_Allgather (only as the out-of-band channel: the
// communicator keeps nothing of it), then a communicator built from them alone.
std::unique_ptr<Comm> ucxFromAddresses(Comm& members, uint64_t id) {
  auto mine = ucx::UcxWorkerAddress::acquire();
  EXPECT_TRUE(mine.ok()) << mine.status().toString();
  if (!mine.ok()) return nullptr;
  const int n = members.size();
  int len = static_cast<int>(mine->bytes().size());
  std::vector<int> lens(n);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, raw(members));
  const int width = *std::max_element(lens.begin(), lens.end());
  std::vector<uint8_t> padded(width), all(static_cast<size_t>(n) * width);
  std::copy(mine->bytes().begin(), mine->bytes().end(), padded.begin());
  MPI_Allgather(padded.data(), width, MPI_BYTE, all.data(), width, MPI_BYTE, raw(members));
  ucx::UcxMembers m;
  m.self = members.rank();
  m.id = id;
  m.timeout_ms = 120000;  // a bound for a hang, far above any case's time on a loaded machine
  for (int p = 0; p < n; ++p)
    m.addresses.emplace_back(all.begin() + p * width, all.begin() + p * width + lens[p]);
  auto c = ucx::UcxComm::createFromAddresses(m, ucx::UcxOptions{});
  EXPECT_TRUE(c.ok()) << c.status().toString();
  if (!c.ok()) return nullptr;
  EXPECT_EQ((*c)->rank(), members.rank());
  return std::move(*c);
}
#endif

struct UcxBackend : HostBackend {
  static const char* name() { return "ucx"; }
  static std::string unavailable() {
    return hasTransport("ucx") ? "" : "this hsdp was built without UCX";
  }
  static std::vector<Case>& cases() {
    static std::vector<Case>* c = [] {
      auto* v = new std::vector<Case>();
#if HSDP_HAVE_UCX
      auto& owned = g_owned;
      auto add = [&](const std::string& name, Comm& members, const ucx::UcxOptions* o,
                     uint64_t address_id = 0) {
        owned.push_back(address_id ? ucxFromAddresses(members, address_id) : ucxOver(members, o));
        if (!owned.back()) return;
        // The suite's largest block (100003 elements of up to 8 bytes): no growth on the hot path.
        Status s = owned.back()->reserveScratch(100003 * sizeof(int64_t));
        EXPECT_TRUE(s.ok()) << s.toString();
        v->push_back({name, owned.back().get(), raw(members)});
      };
      ucx::UcxOptions ring, small;
      ring.small_bytes = 0;
      small.small_bytes = size_t(1) << 30;
      if (wanted("world/ring")) add("world/ring", world(), &ring);
      if (wanted("world/small")) add("world/small", world(), &small);
      for (auto& [name, comm] : meshes().comms) add(name, *comm, nullptr);
      // From addresses: the world, and every replica group (ids agreed by construction).
      uint64_t id = 1;
      if (wanted("world/addresses")) add("world/addresses", world(), nullptr, id++);
      for (auto& [name, comm] : meshes().comms)
        if (name.rfind("replica", 0) == 0) add(name + "/addresses", *comm, nullptr, id++);
#endif
      return v;
    }();
    return *c;
  }
};

// The hierarchical schedules behind the Comm interface, for the suite: rank() is the shard index
// (the shard group's rank), the collectives are the schedules', and what a schedule does not
// have (broadcast, barrier, split) is not part of its conformance.
class HierComm : public Comm {
 public:
  HierComm(Comm& intra, Comm& inter, HierOptions options) : h_(intra, inter, options) {
    Status s = h_.reserve(100003, DType::kFloat32);
    EXPECT_TRUE(s.ok()) << s.toString();
  }
  int rank() const override { return h_.shardIndex(); }
  int size() const override { return h_.groupSize(); }
  const char* transportName() const override { return "hier"; }
  StatusOr<std::unique_ptr<Comm>> split(int, int) override { return unimplemented("hier split"); }
  StatusOr<std::unique_ptr<Comm>> splitByHost() override { return unimplemented("hier split"); }
  Status reserveScratch(size_t) override { return okStatus(); }
  size_t scratchBytes() const override { return h_.scratchBytes(); }
  [[noreturn]] void abortJob(int code) override {
    world().abortJob(code);
    std::abort();  // not reached
  }

 protected:
  StatusOr<WorkHandle> startAllGather(const void* send, void* recv, size_t count,
                                      DType dtype) override {
    return h_.iallGather(send, recv, count, dtype);
  }
  StatusOr<WorkHandle> startReduceScatter(const void* send, void* recv, size_t count, DType dtype,
                                          RedOp op) override {
    return h_.ireduceScatter(send, recv, count, dtype, op);
  }
  StatusOr<WorkHandle> startAllReduce(void* buf, size_t count, DType dtype, RedOp op) override {
    return h_.iallReduce(buf, count, dtype, op);
  }
  Status runBroadcast(void*, size_t, DType, int) override {
    return unimplemented("hier broadcast");
  }
  Status runBarrier() override { return unimplemented("hier barrier"); }

 private:
  HierarchicalCollectives h_;
};

struct HierarchicalBackend : HostBackend {
  static const char* name() { return "hier"; }
  static constexpr bool kBroadcast = false;
  static constexpr bool kRejectsBadArguments = false;
  static constexpr bool kAllToAll = false;
  static std::vector<Case>& cases() {
    static std::vector<Case>* c = [] {
      auto* v = new std::vector<Case>();
      auto& owned = g_owned;
      for (auto& mesh : meshes().all) {
        // Both levels wider than one rank: otherwise the schedules hand the whole operation to
        // the one level there is, which the Mpi and Ucx cases already cover; the first mesh
        // stays as the check of that hand-over.
        const bool two_level = mesh->intraShard().size() > 1 && mesh->interShard().size() > 1;
        if (!two_level && mesh != meshes().all.front()) continue;
        std::vector<std::pair<std::string, Comm*>> inters = {{"mpi", &mesh->interShard()}};
#if HSDP_HAVE_UCX
        owned.push_back(ucxOver(mesh->interShard()));
        if (owned.back()) inters.push_back({"ucx", owned.back().get()});
#endif
        for (auto& [inter_name, inter] : inters) {
          // Pipelined on both inter transports; one chunk (the two-phase schedules) on MPI.
          for (int chunks : {1, 3}) {
            if (chunks == 1 && inter_name != std::string("mpi")) continue;
            owned.push_back(
                std::make_unique<HierComm>(mesh->intraShard(), *inter, HierOptions{chunks}));
            v->push_back({strCat(mesh->describe(), " inter=", inter_name, " chunks=", chunks),
                          owned.back().get(), raw(mesh->shardGroup())});
          }
        }
      }
      return v;
    }();
    return *c;
  }
};

}  // namespace

INSTANTIATE_TYPED_TEST_SUITE_P(Mpi, Conformance, MpiBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(Ucx, Conformance, UcxBackend);
INSTANTIATE_TYPED_TEST_SUITE_P(Hierarchical, Conformance, HierarchicalBackend);

}  // namespace hsdp::conformance
