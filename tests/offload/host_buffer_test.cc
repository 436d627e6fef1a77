// HostBuffer: the heap path (allocate) and the NUMA path (allocateNuma), against the kernel's
// own view of the pages (mincore for residency, hwloc_get_area_memlocation for placement).
#include "core/host_buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace hsdp {
namespace {

TEST(HostBuffer, PageAlignedZeroedAndMovable) {
  auto b = HostBuffer::allocate(10000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
  EXPECT_EQ(b->size(), 10000u);
  const unsigned char* p = b->as<unsigned char>();
  for (size_t i = 0; i < b->size(); ++i) ASSERT_EQ(p[i], 0) << i;
  void* raw = b->data();
  HostBuffer moved = std::move(*b);
  EXPECT_EQ(moved.data(), raw);
  EXPECT_EQ(b->data(), nullptr);
  EXPECT_EQ(HostBuffer::allocate(0)->data(), nullptr);
  EXPECT_TRUE(moved.numaNodes().empty());
}

// Every page of [p, p + bytes) is resident (pre-faulted).
size_t nonResidentPages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  if (mincore(const_cast<void*>(p), bytes, vec.data()) != 0) return vec.size();
  return static_cast<size_t>(
      std::count_if(vec.begin(), vec.end(), [](unsigned char c) { return (c & 1) == 0; }));
}

class Numa : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = NumaTopology::load();
    ASSERT_TRUE(t.ok()) << t.status().toString();
    topo_ = std::move(*t);
  }
  NumaTopology topo_;
};

TEST_F(Numa, TopologyAnswers) {
  ASSERT_GE(topo_.numNodes(), 1);
  EXPECT_EQ(static_cast<int>(topo_.nodes().size()), topo_.numNodes());
  auto cpus = topo_.callerCpus();
  ASSERT_TRUE(cpus.ok());
  ASSERT_FALSE(cpus->empty());
  auto near = topo_.nodesNear(*cpus);
  ASSERT_TRUE(near.ok()) << near.status().toString();
  ASSERT_FALSE(near->empty());
  const std::vector<int> all = topo_.nodes();
  for (int n : *near) EXPECT_NE(std::find(all.begin(), all.end(), n), all.end()) << n;
  std::printf("[ numa ] %d node(s); caller CPUs %zu; nodes near them: %d%s\n", topo_.numNodes(),
              cpus->size(), near->front(), near->size() > 1 ? " ..." : "");

  auto bad_cpu = topo_.nodesNear({100000});
  ASSERT_FALSE(bad_cpu.ok());
  EXPECT_EQ(bad_cpu.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_cpu.status().message().find("CPU 100000"), std::string::npos);
  EXPECT_FALSE(topo_.nodesNear({}).ok());

  NumaTopology empty;
  EXPECT_EQ(empty.callerCpus().status().code(), StatusCode::kFailedPrecondition);
  NumaTopology moved = std::move(topo_);
  EXPECT_GE(moved.numNodes(), 1);
  EXPECT_EQ(topo_.numNodes(), 0);
}

TEST_F(Numa, BoundPreFaultedZeroedAndAligned) {
  for (size_t bytes : {size_t{1}, size_t{10000}, size_t{5} << 20}) {
    for (bool huge : {false, true}) {
      SCOPED_TRACE(strCat("bytes=", bytes, " huge=", huge));
      HostMemoryOptions opt;
      opt.huge_pages = huge;
      auto b = HostBuffer::allocateNuma(bytes, topo_, opt);
      ASSERT_TRUE(b.ok()) << b.status().toString();
      EXPECT_EQ(b->size(), bytes);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
      EXPECT_EQ(nonResidentPages(b->data(), bytes), 0u);
      const unsigned char* p = b->as<unsigned char>();
      for (size_t i = 0; i < bytes; i += 61) ASSERT_EQ(p[i], 0) << i;
      // Bound where asked (the nodes near the caller), and the pages are there.
      const std::vector<int> want = *topo_.nodesNear(*topo_.callerCpus());
      if (b->numaNodes().empty()) {
        GTEST_SKIP() << "the kernel refused the NUMA binding here (see the warning)";
      }
      EXPECT_EQ(b->numaNodes(), want);
      auto where = topo_.nodesHolding(b->data(), bytes);
      ASSERT_TRUE(where.ok()) << where.status().toString();
      for (int n : *where)
        EXPECT_NE(std::find(want.begin(), want.end(), n), want.end()) << "page on node " << n;
      // Usable, and movable with its mapping.
      b->as<float>()[bytes / 4 > 0 ? bytes / 4 - 1 : 0] = 1.0f;
      HostBuffer moved = std::move(*b);
      EXPECT_EQ(b->data(), nullptr);
      EXPECT_EQ(moved.numaNodes(), want);
      moved = HostBuffer();  // unmaps
    }
  }
}

// Huge-page buffers start at successive cache colours (multiples of 68 KiB into a 2 MiB-aligned
// mapping), so arrays streamed together do not share cache sets; without colouring they start
// 2 MiB aligned.
TEST_F(Numa, HugePageBuffersGetDistinctCacheColours) {
  constexpr uintptr_t k2M = uintptr_t{2} << 20;
  std::vector<HostBuffer> bufs;
  std::vector<uintptr_t> colours;
  for (int i = 0; i < 4; ++i) {
    auto b = HostBuffer::allocateNuma(size_t{3} << 20, topo_);
    ASSERT_TRUE(b.ok()) << b.status().toString();
    const uintptr_t c = reinterpret_cast<uintptr_t>(b->data()) % k2M;
    EXPECT_EQ(c % (17 * 4096), 0u) << c;
    colours.push_back(c);
    bufs.push_back(std::move(*b));
  }
  std::sort(colours.begin(), colours.end());
  EXPECT_EQ(std::unique(colours.begin(), colours.end()), colours.end()) << "colours repeat";
  HostMemoryOptions plain;
  plain.cache_color = false;
  auto b = HostBuffer::allocateNuma(size_t{3} << 20, topo_, plain);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % k2M, 0u);
  // Small buffers (no huge pages) are not coloured: page aligned, as allocate() gives.
  auto small = HostBuffer::allocateNuma(100000, topo_);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small->data()) % 4096, 0u);
}

TEST_F(Numa, ExplicitNodeNearCpusAndErrors) {
  const int node = topo_.nodes().front();
  HostMemoryOptions opt;
  opt.numa_node = node;
  opt.strict = true;
  auto b = HostBuffer::allocateNuma(1 << 20, topo_, opt);
  ASSERT_TRUE(b.ok()) << b.status().toString();
  EXPECT_EQ(b->numaNodes(), std::vector<int>{node});

  HostMemoryOptions cpus;
  cpus.near_cpus = {topo_.callerCpus()->front()};
  auto c = HostBuffer::allocateNuma(4096, topo_, cpus);
  ASSERT_TRUE(c.ok()) << c.status().toString();

  HostMemoryOptions bad_node;
  bad_node.numa_node = 4095;
  auto e = HostBuffer::allocateNuma(4096, topo_, bad_node);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("NUMA node 4095"), std::string::npos);

  HostMemoryOptions bad_cpu;
  bad_cpu.near_cpus = {-3};
  EXPECT_NE(HostBuffer::allocateNuma(4096, topo_, bad_cpu).status().message().find("CPU -3"),
            std::string::npos);

  EXPECT_EQ(HostBuffer::allocateNuma(0, topo_)->data(), nullptr);
  EXPECT_EQ(HostBuffer::allocateNuma(4096, NumaTopology()).status().code(),
            StatusCode::kFailedPrecondition);
  auto huge = HostBuffer::allocateNuma(size_t{1} << 60, topo_);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace hsdp
