#include "hsdp/flat_layout.h"

#include <gtest/gtest.h>

namespace hsdp {
namespace {

TEST(FlatLayout, PadsToShardCountAndCoversEveryElementOnce) {
  // 1000x333 + 333 = 333333 elements over 8 shards: padded to 333336.
  auto l = FlatLayout::create({{"weight", {333, 1000}}, {"bias", {333}}}, 8);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->numel(), 333333u);
  EXPECT_EQ(l->shardNumel(), 41667u);
  EXPECT_EQ(l->paddedNumel(), 333336u);
  EXPECT_EQ(l->offset(1), 333000u);
  size_t covered = 0, prev_end = 0;
  for (int k = 0; k < 8; ++k) {
    auto [b, e] = l->shardRange(k);
    EXPECT_EQ(b, prev_end);
    covered += e - b;
    prev_end = e;
  }
  EXPECT_EQ(covered, l->numel());
  EXPECT_EQ(l->shardRange(7).second - l->shardRange(7).first, 41667u - 3);
}

TEST(FlatLayout, MoreShardsThanElements) {
  auto l = FlatLayout::create({{"b", {3}}}, 8);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->shardNumel(), 1u);
  EXPECT_EQ(l->paddedNumel(), 8u);
  EXPECT_EQ(l->shardRange(2), (std::pair<size_t, size_t>{2, 3}));
  EXPECT_EQ(l->shardRange(5), (std::pair<size_t, size_t>{3, 3}));  // padding only
}

TEST(FlatLayout, RejectsBadRegistrations) {
  EXPECT_FALSE(FlatLayout::create({}, 2).ok());
  EXPECT_FALSE(FlatLayout::create({{"w", {2}}, {"w", {3}}}, 2).ok());
  EXPECT_FALSE(FlatLayout::create({{"w", {2, 0}}}, 2).ok());
  EXPECT_FALSE(FlatLayout::create({{"", {2}}}, 2).ok());
  EXPECT_FALSE(FlatLayout::create({{"w", {2}}}, 0).ok());
  auto l = FlatLayout::create({{"w", {2}}, {"b", {1}}}, 2);
  EXPECT_EQ(*l->indexOf("b"), 1u);
  EXPECT_EQ(l->indexOf("nope").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace hsdp
