#include <gtest/gtest.h>
#include <stdlib.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "core/comm_observer.h"
#include "core/progress.h"
#include "hsdp/dtype.h"
#include "hsdp/env.h"
#include "hsdp/status.h"

namespace hsdp {
namespace {

StatusOr<int> half(int x) {
  if (x % 2) return invalidArgument("x=", x, " is odd");
  return x / 2;
}

Status quarter(int x, int* out) {
  HSDP_ASSIGN_OR_RETURN(int h, half(x));
  HSDP_ASSIGN_OR_RETURN(*out, half(h));
  return okStatus();
}

TEST(Status, CarriesCodeAndMessage) {
  int q = 0;
  EXPECT_TRUE(quarter(8, &q).ok());
  EXPECT_EQ(q, 2);
  Status s = quarter(6, &q);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "x=3 is odd");
  EXPECT_EQ(s.toString(), "INVALID_ARGUMENT: x=3 is odd");
  EXPECT_EQ(s.withContext("ctx").message(), "ctx: x=3 is odd");
}

TEST(Env, RegistryIsDocumentedAndUnique) {
  std::set<std::string> names;
  for (const env::Param& p : env::registry()) {
    EXPECT_TRUE(std::string(p.name).rfind("HSDP_", 0) == 0) << p.name;
    EXPECT_GT(std::strlen(p.doc), 20u) << p.name;
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
    // Every int has a range that admits something, its default included.
    if (std::strcmp(p.type, "int") == 0) {
      EXPECT_LT(p.min, p.max) << p.name;
      if (std::isdigit(static_cast<unsigned char>(p.default_value[0]))) {  // not "" or "auto"
        const long long d = std::atoll(p.default_value);
        EXPECT_TRUE(d >= p.min && d <= p.max) << p.name << " default " << p.default_value;
      }
    }
  }
}

TEST(Env, IntParsingNamesTheBadValue) {
  setenv("HSDP_RANKS_PER_NODE", "4x", 1);
  auto bad = env::getInt("HSDP_RANKS_PER_NODE");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("HSDP_RANKS_PER_NODE='4x'"), std::string::npos);
  setenv("HSDP_RANKS_PER_NODE", "4", 1);
  auto good = env::getInt("HSDP_RANKS_PER_NODE");
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(**good, 4);
  unsetenv("HSDP_RANKS_PER_NODE");
  EXPECT_FALSE(env::getInt("HSDP_RANKS_PER_NODE")->has_value());
  EXPECT_FALSE(env::getInt("HSDP_NOT_REGISTERED").ok());
}

TEST(Env, BoolDefaultsAndErrors) {
  unsetenv("HSDP_HIER");
  EXPECT_TRUE(*env::getBool("HSDP_HIER"));  // registered default 1
  setenv("HSDP_HIER", "off", 1);
  EXPECT_FALSE(*env::getBool("HSDP_HIER"));
  setenv("HSDP_HIER", "maybe", 1);
  EXPECT_FALSE(env::getBool("HSDP_HIER").ok());
  unsetenv("HSDP_HIER");
}

TEST(BFloat16, RoundsToNearestEven) {
  // Closed forms: bf16 keeps 8 significant bits.
  EXPECT_EQ(toFloat(toBf16(1.0f)), 1.0f);
  EXPECT_EQ(toFloat(toBf16(-3.5f)), -3.5f);
  EXPECT_EQ(toFloat(toBf16(1.0f + 1.0f / 256)), 1.0f);               // tie -> even (down)
  EXPECT_EQ(toFloat(toBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);  // tie -> even (up)
  EXPECT_EQ(toFloat(toBf16(1.0f + 1.0f / 128 + 1e-4f)), 1.0f + 1.0f / 128);
  EXPECT_TRUE(std::isnan(toFloat(toBf16(NAN))));
  EXPECT_EQ(toFloat(toBf16(INFINITY)), INFINITY);
  for (int i = -256; i <= 256; ++i) EXPECT_EQ(toFloat(toBf16(float(i))), float(i));
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(*parseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(*parseDType("float"), DType::kFloat32);
  EXPECT_FALSE(parseDType("fp8").ok());
}

// core/comm_observer.h: what the watchdog sees of core. A recording observer stands in for it.
struct RecordingObserver final : CommObserver {
  std::vector<std::string> events;
  void waitBegin(const CommTrace* t, uint64_t seq, const char* what, WaitState& s) override {
    events.push_back(strCat("begin ", reinterpret_cast<uintptr_t>(t), " ", seq, " ", what));
    s.bytes[0] = 42;  // the state reaches waitEnd unchanged
  }
  void waitEnd(WaitState& s) override { events.push_back(strCat("end ", int(s.bytes[0]))); }
  void renamed(CommTrace&, const std::string& name) override { events.push_back("rename " + name); }
};

// A work that completes on its second advance.
class TwoStepWork final : public ProgressiveWork {
 public:
  ~TwoStepWork() override { waitForDestruction(); }
  int advances = 0;

 private:
  void advance() override {
    if (++advances == 2) finish(okStatus());
  }
};

TEST(CommObserver, SeesEveryWaitOfTheProgressLoopOnlyWhileInstalled) {
  ASSERT_EQ(commObserver(), nullptr);  // nothing installs one without the watchdog
  RecordingObserver rec;
  setCommObserver(&rec);
  int token = 0;  // an opaque trace: core never looks inside it
  const auto* trace = reinterpret_cast<const CommTrace*>(&token);
  {
    TwoStepWork w;
    w.watchAs(trace, 17);
    ASSERT_TRUE(w.wait().ok());
    EXPECT_EQ(w.advances, 2);
    ASSERT_TRUE(w.wait().ok());  // complete: still a wait, reported again
  }
  {
    TwoStepWork untraced;
    ASSERT_TRUE(untraced.wait().ok());
  }
  setCommObserver(nullptr);
  {
    TwoStepWork after;
    ASSERT_TRUE(after.wait().ok());
  }
  const std::string t = std::to_string(reinterpret_cast<uintptr_t>(trace));
  EXPECT_EQ(rec.events, (std::vector<std::string>{"begin " + t + " 17 wait", "end 42",
                                                  "begin " + t + " 17 wait", "end 42",
                                                  "begin 0 0 wait", "end 42"}));
}

}  // namespace
}  // namespace hsdp
