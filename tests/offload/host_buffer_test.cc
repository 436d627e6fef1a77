#include <gtest/gtest.h>

#include <cstdint>

#include "hsdp/host_buffer.h"

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
}

}  // namespace
}  // namespace hsdp
