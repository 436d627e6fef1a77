// The NCCL transport under mpirun with 2-4 ranks (on one GPU each rank runs under
// per_rank_host.sh, so NCCL sees separate hosts): the conformance suite every transport passes
// (tests/collectives/conformance/conformance_suite.h) on the NCCL world and its splits, with the
// buffers in device memory, against MPI's own collectives; and what is particular to NCCL: long
// groups, the caller's stream, splits, host buffers, selection, timeouts. Every test skips
// without a CUDA device.
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "collectives/mpi/mpi_comm.h"
#include "collectives/nccl/cuda_resources.h"
#include "core/host_buffer.h"
#include "hsdp/nccl.h"
#include "hsdp/transport_select.h"
#include "tests/collectives/conformance/conformance_suite.h"
#include "tests/common/gpu_test.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::world;

MPI_Comm raw(Comm& c) { return dynamic_cast<mpi::MpiComm&>(c).raw(); }

// The world over NCCL, built once for the binary (creation is collective and costs ~1 s) and
// destroyed by the environment below on every rank at the same point, before MPI_Finalize (not
// by a static destructor, when the CUDA runtime may already be going away).
std::unique_ptr<Comm> g_nccl_world;
std::vector<std::unique_ptr<Comm>> g_nccl_splits;  // the conformance suite's, freed with it

nccl::NcclComm* ncclWorld() {
  if (!g_nccl_world) {
    auto c = nccl::createNcclComm(world());
    EXPECT_TRUE(c.ok()) << c.status().toString();
    if (!c.ok()) return nullptr;
    g_nccl_world = std::move(*c);
  }
  return dynamic_cast<nccl::NcclComm*>(g_nccl_world.get());
}

class NcclWorldTeardown : public ::testing::Environment {
 public:
  void TearDown() override {
    g_nccl_splits.clear();
    g_nccl_world.reset();
  }
};
const auto* const kTeardown = ::testing::AddGlobalTestEnvironment(new NcclWorldTeardown);

float value(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((rank * 31 + i * 7) % 17) - 8);
}

template <typename T>
gpu::DeviceBuffer toDevice(const std::vector<T>& h, size_t extra_elems = 0) {
  auto b = gpu::DeviceBuffer::allocate((h.size() + extra_elems) * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status().toString();
  if (!h.empty())
    EXPECT_EQ(cudaMemcpy(b->data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  return std::move(b).value();
}

template <typename T>
std::vector<T> toHost(const void* d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

template <typename T>
bool sameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// More operations than NCCL documented for one group up to 2.11 (2048) go out as consecutive
// groups under one Work (newer NCCL takes them in one group too, so this checks the results, not
// that the split was needed); a bad operation is named by index before anything starts, and the
// communicator stays usable.
TEST(NcclComm, LongGroupSplitsAndBadOperationIsNamed) {
  HSDP_REQUIRE_GPU();
  nccl::NcclComm* nc = ncclWorld();
  ASSERT_NE(nc, nullptr);
  const int n = nc->size(), r = nc->rank();
  const size_t kOps = 2050, count = 3;
  std::vector<float> in(kOps * count), want(kOps * count * n);
  for (size_t i = 0; i < in.size(); ++i) in[i] = value(r, i);
  gpu::DeviceBuffer send = toDevice(in);
  auto out = gpu::DeviceBuffer::allocate(want.size() * 4);
  ASSERT_TRUE(out.ok());
  std::vector<CollectiveOp> ops;
  for (size_t o = 0; o < kOps; ++o)
    ops.push_back(CollectiveOp::allGather(
        send.as<float>() + o * count, out->as<float>() + o * count * n, count, DType::kFloat32));
  auto w = nc->igroup(ops);
  ASSERT_TRUE(w.ok()) << w.status().toString();
  ASSERT_OK((*w)->wait());
  for (size_t o = 0; o < kOps; ++o)
    ASSERT_EQ(MPI_Allgather(in.data() + o * count, int(count), MPI_FLOAT,
                            want.data() + o * count * n, int(count), MPI_FLOAT, raw(world())),
              MPI_SUCCESS);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(sameBits(toHost<float>(out->data(), want.size()), want));

  std::vector<float> host(16, 1.0f);
  std::vector<CollectiveOp> bad = {
      ops[0], CollectiveOp::allReduce(host.data(), host.size(), DType::kFloat32, RedOp::kSum)};
  auto b = nc->igroup(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("group operation 1 of 2"), std::string::npos)
      << b.status().message();
  EXPECT_NE(b.status().message().find("host memory"), std::string::npos) << b.status().message();
  EXPECT_FALSE(nc->aborted());
  ASSERT_OK(nc->barrier());
}

TEST(NcclComm, CallerStreamOrdersTheCollectiveAfterQueuedWork) {
  HSDP_REQUIRE_GPU();
  nccl::NcclComm* nc = ncclWorld();
  ASSERT_NE(nc, nullptr);
  auto stream = gpu::Stream::create("caller");
  ASSERT_TRUE(stream.ok());
  const size_t count = 1 << 20;
  std::vector<float> ones(count, 1.0f);
  auto pinned = gpu::PinnedBuffer::allocate(count * 4);
  ASSERT_TRUE(pinned.ok());
  std::memcpy(pinned->data(), ones.data(), count * 4);
  auto buf = gpu::DeviceBuffer::allocate(count * 4);
  ASSERT_TRUE(buf.ok());
  ASSERT_EQ(cudaMemsetAsync(buf->data(), 0, count * 4, stream->get()), cudaSuccess);
  // Queued, not waited for: the all-reduce must still see the ones.
  ASSERT_EQ(cudaMemcpyAsync(buf->data(), pinned->data(), count * 4, cudaMemcpyHostToDevice,
                            stream->get()),
            cudaSuccess);
  nc->setCallerStream(stream->get());
  Status s = nc->allReduce(buf->data(), count, DType::kFloat32, RedOp::kSum);
  nc->setCallerStream(nullptr);
  ASSERT_OK(s);
  std::vector<float> got = toHost<float>(buf->data(), count);
  for (size_t i = 0; i < count; i += 4099) ASSERT_EQ(got[i], static_cast<float>(nc->size())) << i;
}

TEST(NcclComm, SplitsMatchMpiSplits) {
  HSDP_REQUIRE_GPU();
  nccl::NcclComm* nc = ncclWorld();
  ASSERT_NE(nc, nullptr);
  const int r = nc->rank();
  // Reversed order inside each color, as the mesh's splits may ask.
  auto sub = nc->split(r % 2, -r);
  ASSERT_TRUE(sub.ok()) << sub.status().toString();
  auto mpi_sub = world().split(r % 2, -r);
  ASSERT_TRUE(mpi_sub.ok());
  EXPECT_STREQ((*sub)->transportName(), "nccl");
  EXPECT_EQ((*sub)->rank(), (*mpi_sub)->rank());
  EXPECT_EQ((*sub)->size(), (*mpi_sub)->size());  // its collectives: Nccl/Conformance
  // A split of a split.
  auto subsub = (*sub)->split(0, (*sub)->rank());
  ASSERT_TRUE(subsub.ok()) << subsub.status().toString();
  EXPECT_EQ((*subsub)->size(), (*sub)->size());
  ASSERT_OK((*subsub)->barrier());
  // By host: MPI's shared-memory groups (one host here, whatever NCCL_HOSTID says).
  auto host = nc->splitByHost();
  ASSERT_TRUE(host.ok()) << host.status().toString();
  auto mpi_host = world().splitByHost();
  ASSERT_TRUE(mpi_host.ok());
  EXPECT_EQ((*host)->rank(), (*mpi_host)->rank());
  EXPECT_EQ((*host)->size(), (*mpi_host)->size());
  EXPECT_EQ(nc->split(-1, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST(NcclComm, HostBufferIsAnErrorAndTheCommunicatorStaysUsable) {
  HSDP_REQUIRE_GPU();
  nccl::NcclComm* nc = ncclWorld();
  ASSERT_NE(nc, nullptr);
  std::vector<float> host(16, 1.0f);
  Status s = nc->allReduce(host.data(), host.size(), DType::kFloat32, RedOp::kSum);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("host memory"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("allReduce"), std::string::npos) << s.message();
  EXPECT_FALSE(nc->aborted());
  ASSERT_OK(nc->barrier());
}

TEST(NcclComm, SelectedThroughTransportSelect) {
  HSDP_REQUIRE_GPU();
  setenv("HSDP_TRANSPORT_INTER", "nccl", 1);
  auto own = world().split(0, world().rank());
  ASSERT_TRUE(own.ok());
  auto c = selectLevelTransport(MeshLevel::kInter, std::move(*own));
  unsetenv("HSDP_TRANSPORT_INTER");
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_STREQ((*c)->transportName(), "nccl");
  EXPECT_EQ((*c)->rank(), world().rank());
  ASSERT_OK((*c)->barrier());
}

// A collective that only rank 0 starts: rank 0 times out, aborts its communicator and gets a
// Status naming the rank, the collective and the timeout; the others abort theirs, but only after
// rank 0 is done (see below). Last test: the job's other communicators are unaffected, but NCCL
// may log about the aborted peers.
TEST(NcclComm, ZMismatchedCollectiveTimesOutAndAborts) {
  HSDP_REQUIRE_GPU();
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks";
  nccl::NcclOptions options;
  options.timeout_s = 3;
  auto own = world().split(0, world().rank());
  ASSERT_TRUE(own.ok());
  auto c = nccl::NcclComm::create(std::move(*own), options);
  ASSERT_TRUE(c.ok()) << c.status().toString();
  nccl::NcclComm& nc = **c;
  auto buf = gpu::DeviceBuffer::allocate(1024 * 4);
  ASSERT_TRUE(buf.ok());
  if (nc.rank() == 0) {
    Status s = nc.allReduce(buf->data(), 1024, DType::kFloat32, RedOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.toString();
    EXPECT_NE(s.message().find("allReduce"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("rank 0 of"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("HSDP_TIMEOUT_S"), std::string::npos) << s.message();
    EXPECT_TRUE(nc.aborted());
    Status later = nc.barrier();
    EXPECT_EQ(later.code(), StatusCode::kFailedPrecondition) << later.toString();
    EXPECT_NE(later.message().find("aborted"), std::string::npos) << later.message();
  }
  // Why the others abort only after this barrier: a peer that aborted first would close its
  // sockets, and rank 0 could then fail with NCCL's remote/system error (connection refused or
  // closed) instead of the timeout this test is about. Alive but idle peers leave rank 0 waiting
  // until the communicator's timeout, deterministically.
  ASSERT_OK(world().barrier());
  if (nc.rank() != 0)
    nc.abort(internalError("test: rank ", nc.rank(), " leaves the collective out"));
  ASSERT_OK(world().barrier());
}

// ---- the conformance suite on NCCL ------------------------------------------------------------

// Device memory. Results are read with an asynchronous copy on a stream of its own, which does
// not wait for NCCL's non-blocking streams: a Work that reported completion before its
// collective finished would let the suite read stale bytes.
class DeviceMemory : public conformance::Memory {
 public:
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess);
    return p;
  }
  void release(void* p) override { EXPECT_EQ(cudaFree(p), cudaSuccess); }
  void upload(void* dst, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void download(void* dst, const void* src, size_t bytes) override {
    cudaStream_t st;
    EXPECT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(st), cudaSuccess);
  }
};

struct NcclBackend : conformance::Contract {
  static const char* name() { return "nccl"; }
  static std::string unavailable() {
    std::string why;
    return gpu_testing::devices(&why) > 0 ? "" : "no CUDA device visible: " + why;
  }
  static conformance::Memory& memory() {
    static DeviceMemory m;
    return m;
  }
  // The NCCL world, the even and odd ranks in reversed order, and the ranks of each host, each
  // with the MPI communicator over the same members as oracle.
  static std::vector<conformance::Case>& cases() {
    static std::vector<conformance::Case>* c = [] {
      auto* v = new std::vector<conformance::Case>();
      nccl::NcclComm* nc = ncclWorld();
      EXPECT_NE(nc, nullptr);
      if (!nc) return v;
      v->push_back({"world", nc, raw(world())});
      const int r = nc->rank();
      auto sub = nc->split(r % 2, -r);
      auto mpi_sub = world().split(r % 2, -r);
      auto host = nc->splitByHost();
      auto mpi_host = world().splitByHost();
      EXPECT_TRUE(sub.ok() && mpi_sub.ok() && host.ok() && mpi_host.ok());
      if (!sub.ok() || !mpi_sub.ok() || !host.ok() || !mpi_host.ok()) return v;
      v->push_back({"half/reversed", sub->get(), raw(**mpi_sub)});
      v->push_back({"host", host->get(), raw(**mpi_host)});
      for (auto* owned : {&*sub, &*mpi_sub, &*host, &*mpi_host})
        g_nccl_splits.push_back(std::move(*owned));
      return v;
    }();
    return *c;
  }
};

}  // namespace

namespace conformance {
INSTANTIATE_TYPED_TEST_SUITE_P(Nccl, Conformance, NcclBackend);
}  // namespace conformance

}  // namespace hsdp
