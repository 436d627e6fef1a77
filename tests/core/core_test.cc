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
#include "tests/common/scoped_env.h"

namespace hsdp {
namespace {

using testing::ScopedEnv;

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

// What this test binary links declares these; hsdp-env (every object of the library) is checked
// for the whole set by the env.declared test.
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
  EXPECT_TRUE(names.count("HSDP_RANKS_PER_NODE"));  // core's own declaration
}

// Declared here, so registered in this binary only: the typed reads against closed forms.
const env::IntParam kTestInt{"HSDP_TEST_INT", 7, -3, 100, "an integer parameter of core_test"};
const env::IntParam kTestAuto{"HSDP_TEST_AUTO", env::Unset{"auto"}, 1, 8,
                              "an int without a default (core_test)"};
const env::BoolParam kTestBool{"HSDP_TEST_BOOL", true, "a boolean parameter of core_test"};
const env::StringParam kTestEnum{"HSDP_TEST_ENUM", env::StringParam::Kind::kEnum, "red",
                                 "an enum parameter of core_test (red, green)"};
const env::NumberParam kTestNumber{"HSDP_TEST_NUMBER", "", "a positive number of apples",
                                   "a real parameter of core_test"};

TEST(Env, IntParsingNamesTheBadValue) {
  ScopedEnv e("HSDP_TEST_INT", "4x");
  auto bad = kTestInt.get();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("HSDP_TEST_INT='4x'"), std::string::npos);
  for (const char* out : {"101", "-4", "99999999999999999999"}) {
    ScopedEnv o("HSDP_TEST_INT", out);
    EXPECT_FALSE(kTestInt.get().ok()) << out;
  }
  {
    ScopedEnv g("HSDP_TEST_INT", "-3");
    EXPECT_EQ(*kTestInt.value(), -3);
  }
  {
    ScopedEnv u("HSDP_TEST_INT", nullptr);
    EXPECT_EQ(*kTestInt.value(), 7);  // the declared default
    EXPECT_FALSE(kTestInt.isSet());
  }
  ScopedEnv a("HSDP_TEST_AUTO", nullptr);
  EXPECT_FALSE(kTestAuto.get()->has_value());  // no default: unset stays unset
  EXPECT_FALSE(kTestAuto.value().ok());
  ScopedEnv a2("HSDP_TEST_AUTO", "8");
  EXPECT_EQ(**kTestAuto.get(), 8);
}

TEST(Env, BoolStringAndNumber) {
  {
    ScopedEnv u("HSDP_TEST_BOOL", nullptr);
    EXPECT_TRUE(*kTestBool.get());  // declared default
  }
  {
    ScopedEnv off("HSDP_TEST_BOOL", "off");
    EXPECT_FALSE(*kTestBool.get());
  }
  {
    ScopedEnv bad("HSDP_TEST_BOOL", "maybe");
    ASSERT_FALSE(kTestBool.get().ok());
    EXPECT_NE(kTestBool.get().status().message().find("HSDP_TEST_BOOL"), std::string::npos);
  }
  {
    ScopedEnv u("HSDP_TEST_ENUM", nullptr);
    EXPECT_EQ(kTestEnum.get(), "red");
    ScopedEnv g("HSDP_TEST_ENUM", "green");
    EXPECT_EQ(kTestEnum.get(), "green");
    EXPECT_EQ(kTestEnum.raw(), "green");
  }
  {
    ScopedEnv u("HSDP_TEST_NUMBER", nullptr);
    EXPECT_FALSE(kTestNumber.get()->has_value());
    ScopedEnv v("HSDP_TEST_NUMBER", "2.5");
    EXPECT_DOUBLE_EQ(**kTestNumber.get(), 2.5);
  }
  for (const char* bad : {"0", "-1", "nan", "inf", "1e999", "ten"}) {
    ScopedEnv b("HSDP_TEST_NUMBER", bad);
    auto r = kTestNumber.get();
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message(),
              std::string("HSDP_TEST_NUMBER='") + bad + "' is not a positive number of apples");
  }
  // The registry lists what this binary declared, with the defaults as written.
  bool found = false;
  for (const env::Param& p : env::registry())
    if (std::string(p.name) == "HSDP_TEST_INT") {
      found = true;
      EXPECT_STREQ(p.default_value, "7");
      EXPECT_EQ(p.min, -3);
      EXPECT_EQ(p.max, 100);
    }
  EXPECT_TRUE(found);
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
  StatusOr<WorkHandle> startTraced(CommTrace&, const TracedCall& c,
                                   std::function<StatusOr<WorkHandle>()> start) override {
    events.push_back(strCat("start ", static_cast<int>(c.kind), " ", c.count));
    return start();
  }
  Status runTraced(CommTrace&, const TracedCall& c, const char* what,
                   const std::function<Status()>& run) override {
    events.push_back(strCat("run ", static_cast<int>(c.kind), " ", what));
    return run();
  }
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
