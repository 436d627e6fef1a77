// ScratchPool: a slot per operation in flight, reused after release, grown only when every slot
// is busy or too small; reserve() makes a free slot of the size ahead of time.
#include "core/scratch_pool.h"

#include <gtest/gtest.h>

namespace hsdp {
namespace {

TEST(ScratchPool, SlotsAreReusedAndGrowOnlyWhenNeeded) {
  ScratchPool pool;
  EXPECT_EQ(pool.totalBytes(), 0u);
  ASSERT_TRUE(pool.reserve(1 << 16).ok());
  EXPECT_GE(pool.totalBytes(), size_t{1} << 16);
  const size_t reserved = pool.totalBytes();
  ASSERT_TRUE(pool.reserve(1 << 12).ok());  // a free slot already fits
  EXPECT_EQ(pool.totalBytes(), reserved);
  auto a = pool.acquire(1 << 16);
  ASSERT_TRUE(a.ok());
  EXPECT_GE((*a)->size(), size_t{1} << 16);
  EXPECT_EQ(pool.totalBytes(), reserved);  // the reserved slot
  auto b = pool.acquire(100);              // the only slot is busy: one more
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_GT(pool.totalBytes(), reserved);
  const size_t two = pool.totalBytes();
  pool.release(*a);
  auto c = pool.acquire(1 << 15);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, *a);  // reused
  EXPECT_EQ(pool.totalBytes(), two);
  pool.release(*b);
  auto d = pool.acquire(1 << 20);  // the free slot is too small: a new, larger one
  ASSERT_TRUE(d.ok());
  EXPECT_GE((*d)->size(), size_t{1} << 20);
  EXPECT_NE(*d, *b);
  // Slot memory is usable end to end.
  static_cast<char*>((*d)->data())[(1 << 20) - 1] = 1;
}

}  // namespace
}  // namespace hsdp
