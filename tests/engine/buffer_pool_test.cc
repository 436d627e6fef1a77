// BufferPool on the host memory space: blocks are reused, capacity grows only to the peak in
// use, zeroed blocks are zero, and misuse is an error, never a corruption.
#include "engine/buffer_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "engine/memory_space.h"
#include "offload/cpu_adam.h"

namespace hsdp {
namespace {

TEST(BufferPool, ReusesBlocksAndCountsPeakAndCapacity) {
  auto space = hostMemorySpace(nullptr).memory;
  BufferPool pool;
  EXPECT_EQ(pool.acquire(false).status().code(), StatusCode::kFailedPrecondition);  // no init
  ASSERT_TRUE(pool.init(space.get(), 4096, 2).ok());
  EXPECT_EQ(pool.init(space.get(), 4096, 2).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.capacityBytes(), 2u * 4096);
  EXPECT_EQ(pool.peakBytes(), 0u);
  auto a = pool.acquire(false), b = pool.acquire(false);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(pool.inUseBytes(), 2u * 4096);
  // A third block alive at once grows the pool by one; releasing it makes it the next one out.
  auto c = pool.acquire(false);
  ASSERT_TRUE(c.ok());
  std::set<void*> distinct = {*a, *b, *c};
  EXPECT_EQ(distinct.size(), 3u);
  EXPECT_EQ(pool.capacityBytes(), 3u * 4096);
  EXPECT_EQ(pool.peakBytes(), 3u * 4096);
  ASSERT_TRUE(pool.release(*c).ok());
  auto c2 = pool.acquire(false);
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(*c2, *c);
  EXPECT_EQ(pool.capacityBytes(), 3u * 4096);  // no growth: reused
  // A zeroed block is zero even after someone wrote into it.
  std::fill_n(static_cast<char*>(*c2), 4096, 0x5a);
  ASSERT_TRUE(pool.release(*c2).ok());
  auto z = pool.acquire(true);
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(*z, *c2);
  const char* bytes = static_cast<const char*>(*z);
  EXPECT_TRUE(std::all_of(bytes, bytes + 4096, [](char x) { return x == 0; }));
  // Releasing twice, or a pointer that is not a block, is an error and changes nothing.
  ASSERT_TRUE(pool.release(*z).ok());
  EXPECT_EQ(pool.release(*z).code(), StatusCode::kFailedPrecondition);
  int not_a_block = 0;
  EXPECT_EQ(pool.release(&not_a_block).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.inUseBytes(), 2u * 4096);
  EXPECT_EQ(pool.peakBytes(), 3u * 4096);
}

}  // namespace
}  // namespace hsdp
