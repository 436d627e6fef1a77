// hsdp/parse.h at its boundaries: each class of bad number (junk, empty, out of range, wrap,
// NaN/Inf, negative where not allowed) refused with the value named as written.
#include "hsdp/parse.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace hsdp {
namespace {

std::string err(const Status& s) { return std::string(s.message()); }

TEST(Parse, IntegerBoundaries) {
  EXPECT_EQ(*parseInteger<int>("1", "--accum", 1, 10), 1);
  EXPECT_EQ(*parseInteger<int>("10", "--accum", 1, 10), 10);
  EXPECT_EQ(err(parseInteger<int>("11", "--accum", 1, 10).status()),
            "--accum 11 is too large (at most 10)");
  EXPECT_EQ(err(parseInteger<int>("0", "--accum", 1, 10).status()), "--accum 0 must be positive");
  EXPECT_EQ(err(parseInteger<int>("0", "HSDP_PIPELINE_CHUNKS", 1, 10).status()),
            "HSDP_PIPELINE_CHUNKS=0 must be >= 1");
  EXPECT_EQ(err(parseInteger<int>("-1", "--keep", 0).status()), "--keep -1 must be >= 0");
  EXPECT_EQ(*parseInteger<int>(" 7 ", "--steps"), 7);  // surrounding blanks only
  EXPECT_EQ(*parseInteger<int>("+7", "--steps"), 7);
  EXPECT_EQ(*parseInteger<int>("010", "--steps"), 10);  // never octal
  EXPECT_EQ(*parseInteger<int64_t>("-9223372036854775808", "x"), INT64_MIN);
  EXPECT_EQ(*parseInteger<int64_t>("9223372036854775807", "x"), INT64_MAX);
  EXPECT_EQ(*parseInteger<uint64_t>("18446744073709551615", "x"), UINT64_MAX);
  // A range below zero bounds negatives from above too (found by parse_fuzz: "-0" was 0).
  EXPECT_EQ(err(parseInteger<int64_t>("-0", "x", INT64_MIN, -1000).status()),
            "x -0 is too large (at most -1000)");
  EXPECT_EQ(*parseInteger<int64_t>("-1000", "x", INT64_MIN, -1000), -1000);
}

TEST(Parse, IntegerNeverWraps) {
  // A 64-bit value read for an int is refused, not reduced modulo 2^32.
  EXPECT_EQ(err(parseInteger<int>("4294967297", "--steps").status()),
            "--steps 4294967297 is too large (at most 2147483647)");
  EXPECT_EQ(err(parseInteger<int>("-2147483649", "--steps").status()),
            "--steps -2147483649 must be >= -2147483648");
  EXPECT_FALSE(parseInteger<uint64_t>("18446744073709551616", "x").ok());
  EXPECT_FALSE(parseInteger<int64_t>("99999999999999999999999", "x").ok());
  EXPECT_EQ(err(parseInteger<uint64_t>("-1", "--elements").status()), "--elements -1 must be >= 0");
  EXPECT_EQ(*parseInteger<uint64_t>("-0", "--elements"), 0u);  // negative zero is zero
  EXPECT_EQ(*parseInteger<uint8_t>("255", "x"), 255);
  EXPECT_FALSE(parseInteger<uint8_t>("256", "x").ok());
}

TEST(Parse, IntegerJunk) {
  for (const char* bad : {"", " ", "ten", "1O", "7x", "1e3", "1.0", "0x10", "--", "+", "5 5"})
    EXPECT_EQ(err(parseInteger<int>(bad, "--steps").status()),
              std::string("--steps '") + std::string(bad).substr(bad[0] == ' ' ? 1 : 0) +
                  "' is not an integer")
        << bad;
  EXPECT_EQ(err(parseInteger<int>("abc", "HSDP_RANKS_PER_NODE").status()),
            "HSDP_RANKS_PER_NODE='abc' is not an integer");
}

TEST(Parse, RealsAreFiniteAndInRange) {
  EXPECT_DOUBLE_EQ(*parseReal("1e-3", "--lr", RealRange::atLeast(0)), 1e-3);
  EXPECT_DOUBLE_EQ(*parseReal(".5", "--lr", RealRange::atLeast(0)), 0.5);
  for (const char* bad : {"nan", "NaN", "inf", "-inf", "Infinity", "+nan"})
    EXPECT_EQ(err(parseReal(bad, "--lr", RealRange::any()).status()),
              std::string("--lr '") + bad + "' is not a finite number")
        << bad;
  for (const char* bad : {"", "x", "1e", "0x1p3", "1,5", "1.5f"})
    EXPECT_FALSE(parseReal(bad, "--lr", RealRange::any()).ok()) << bad;
  EXPECT_FALSE(parseReal("1e400", "--lr", RealRange::any()).ok());  // overflows double
  EXPECT_EQ(err(parseReal("-1", "--tolerance", RealRange::atLeast(0)).status()),
            "--tolerance -1 must be >= 0");
  EXPECT_TRUE(parseReal("-0", "--tolerance", RealRange::atLeast(0)).ok());  // -0 == 0
  EXPECT_EQ(err(parseReal("0", "--eps", RealRange::above(0)).status()), "--eps 0 must be > 0");
  EXPECT_EQ(err(parseReal("1", "--beta2", RealRange::halfOpen(0, 1)).status()),
            "--beta2 1 must be in [0, 1)");
  EXPECT_TRUE(parseReal("0.999", "--beta2", RealRange::halfOpen(0, 1)).ok());
  // Fits double, not float: refused for a float setting, accepted for a double one.
  EXPECT_FALSE(parseFloating<float>("1e39", "--lr").ok());
  EXPECT_TRUE(parseFloating<double>("1e39", "--lr").ok());
  EXPECT_EQ(*parseFloating<float>("1e-50", "--lr"), 0.0f);  // underflow reads as 0
}

TEST(Parse, BoolCountAndBytes) {
  EXPECT_TRUE(*parseBool("On", "HSDP_HIER"));
  EXPECT_FALSE(*parseBool("no", "HSDP_HIER"));
  EXPECT_EQ(err(parseBool("maybe", "HSDP_HIER").status()),
            "HSDP_HIER='maybe' is not a boolean (1/0, true/false, on/off, yes/no)");
  EXPECT_EQ(*parseCount("7.5e9", "--params"), 7500000000u);
  EXPECT_EQ(*parseCount("18446744073709551615", "--params"), UINT64_MAX);
  EXPECT_FALSE(parseCount("18446744073709551616", "--params").ok());
  EXPECT_FALSE(parseCount("2e19", "--params").ok());
  EXPECT_FALSE(parseCount("nan", "--params").ok());
  EXPECT_FALSE(parseCount("1.5", "--params").ok());
  EXPECT_EQ(*parseByteSize("80GiB", "--mem-budget"), uint64_t{80} << 30);
  EXPECT_EQ(*parseByteSize("1M", "-b"), uint64_t{1} << 20);
  EXPECT_EQ(*parseByteSize("80GB", "--mem-budget"), 80000000000u);
  EXPECT_FALSE(parseByteSize("20000000T", "-e").ok());  // beyond 2^64
  EXPECT_FALSE(parseByteSize("infG", "-e").ok());
  EXPECT_FALSE(parseByteSize("1X", "-e").ok());
}

// The one list syntax: elements trimmed; an empty one refused by position, whatever follows.
TEST(Parse, Lists) {
  using V = std::vector<std::string>;
  EXPECT_EQ(*parseList("hier,flat", "--algo"), (V{"hier", "flat"}));
  EXPECT_EQ(*parseList(" a , b ", "--algo"), (V{"a", "b"}));
  EXPECT_EQ(*parseList("one", "--algo"), (V{"one"}));
  EXPECT_EQ(err(parseList("32,64,", "--dims").status()), "--dims '32,64,': element 3 is empty");
  EXPECT_EQ(err(parseList(",32,64", "--dims").status()), "--dims ',32,64': element 1 is empty");
  EXPECT_EQ(err(parseList("32,,64", "--dims").status()), "--dims '32,,64': element 2 is empty");
  EXPECT_EQ(err(parseList("32, \t,64", "--dims").status()),
            "--dims '32, \t,64': element 2 is empty");
  EXPECT_EQ(err(parseList("", "--isa").status()), "--isa '': element 1 is empty");
  EXPECT_EQ(err(parseList(",", "--isa").status()), "--isa ',': element 1 is empty");
  EXPECT_EQ(err(parseList("MESH,,COLL", "HSDP_DEBUG_SUBSYS").status()),
            "HSDP_DEBUG_SUBSYS='MESH,,COLL': element 2 is empty");
  // The structure is checked first: an empty element is named even after a malformed one.
  EXPECT_EQ(err(parseIntegerList<int>("x,,1", "--dims", 1, 10).status()),
            "--dims 'x,,1': element 2 is empty");
  EXPECT_EQ(parseList("a,b,c,d,e,f,g,h,i,j,k", "--algo")->size(), 11u);
  for (const char* bad : {"32,64,", ",32", "1,,2", "1, ,2", " "})
    EXPECT_FALSE(parseIntegerList<int>(bad, "--dims", 1, 10).ok()) << bad;
}

TEST(Parse, IntegerLists) {
  EXPECT_EQ(*parseIntegerList<int>("32, 64,10", "--dims", 1, 1 << 20),
            (std::vector<int>{32, 64, 10}));
  EXPECT_EQ(err(parseIntegerList<int>("32,x,10", "--dims", 1, 100).status()),
            "--dims '32,x,10': element 2 'x' is not an integer");
  EXPECT_EQ(err(parseIntegerList<int>("1,0", "--threads", 1, 4096).status()),
            "--threads '1,0': element 2 0 must be >= 1");
  EXPECT_EQ(err(parseIntegerList<int>("5000", "--threads", 1, 4096).status()),
            "--threads '5000': element 1 5000 is too large (at most 4096)");
  EXPECT_EQ(err(parseIntegerList<int>("1,4294967297", "--threads").status()),
            "--threads '1,4294967297': element 2 4294967297 is too large (at most 2147483647)");
  EXPECT_EQ(err(parseIntegerList<uint32_t>("-1", "HSDP_X").status()),
            "HSDP_X='-1': element 1 -1 must be >= 0");
}

TEST(Parse, CheckedArithmetic) {
  EXPECT_EQ(*checkedMul<int>(1 << 15, 1 << 15), 1 << 30);
  EXPECT_FALSE(checkedMul<int>(1073741824, 4).has_value());  // --accum 2^30 on 4 ranks
  EXPECT_FALSE(checkedMul<uint64_t>(UINT64_MAX / 2 + 1, 2).has_value());
  EXPECT_FALSE(checkedAdd<int64_t>(INT64_MAX, 1).has_value());
  EXPECT_EQ(*checkedAdd<int64_t>(INT64_MAX - 1, 1), INT64_MAX);
}

TEST(Parse, AllocationsAreCheckedAgainstTheLimit) {
  const uint64_t limit = allocatableBytes();
  ASSERT_GT(limit, 0u);
  EXPECT_EQ(*checkedAllocation(1024, 4, "--elements 1024"), 4096u);
  // Wraps 64 bits (n * 18 near 2^64): refused, not allocated as the wrapped remainder.
  auto wrap = checkedAllocation(UINT64_MAX / 4, 18, "--elements 4611686018427387903");
  ASSERT_FALSE(wrap.ok());
  EXPECT_NE(err(wrap.status()).find("--elements 4611686018427387903 needs"), std::string::npos);
  EXPECT_FALSE(checkedAllocation(limit / 2 + 1, 2, "x").ok());
  EXPECT_TRUE(checkedAllocation(limit / 4, 2, "x").ok());
}

}  // namespace
}  // namespace hsdp
