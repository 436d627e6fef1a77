// hsdp-plan's command line: tables, JSON, --layers, --auto ranking, the SVG file. Runs the built
// binary (HSDP_PLAN_BIN) and reads what it prints and writes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/plan/xml_check.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr
};

Result plan(const std::string& args) {
  Result r;
  const std::string cmd = std::string(HSDP_PLAN_BIN) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string readFile(const fs::path& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A scratch directory under the test's build folder, fresh per test.
fs::path scratch(const std::string& name) {
  fs::path d = fs::path(HSDP_PLAN_TEST_DIR) / ("cli_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The first line of `out` that starts with `prefix`, or "".
std::string line(const std::string& out, const std::string& prefix) {
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(prefix, 0) == 0) return l;
  return "";
}

const char* kMachine = "--nodes 2 --gpus-per-node 8";

TEST(PlanCli, TableForSevenPointFiveBillion) {
  Result r = plan(std::string("--params 7.5e9 --units 1 ") + kMachine +
                  " --intra-shard 8 --inter-shard 2 --mode zero3");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("model: 7,500,000,000 parameters in 1 units"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("shard group 16; replicas 1; mode zero3"), std::string::npos) << r.out;
  EXPECT_NE(line(r.out, "  model_state_total").find("7,500,000,000     6.98 GiB"),
            std::string::npos)
      << r.out;
  EXPECT_NE(line(r.out, "  all-gather").find("30,000,000,000    27.94 GiB  2·R·(J-1)·D"),
            std::string::npos)
      << r.out;
  EXPECT_NE(line(r.out, "  reduce-scatter").find("15,000,000,000"), std::string::npos) << r.out;
  EXPECT_NE(line(r.out, "  per node").find("22,500,000,000"), std::string::npos) << r.out;
}

TEST(PlanCli, JsonMatchesTheLibrary) {
  Result r = plan(std::string("--params 7.5e9 --units 1 ") + kMachine +
                  " --intra-shard 8 --inter-shard 2 --mode zero2 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(j["mode"], "zero2");
  EXPECT_EQ(j["per_gpu_bytes"]["params"], 15'000'000'000ull);
  EXPECT_EQ(j["per_gpu_bytes"]["grads"], 937'500'000ull);
  EXPECT_EQ(j["per_gpu_bytes"]["model_state_total"], 21'562'500'000ull);
  EXPECT_EQ(j["cross_node_bytes_per_step"]["all_gather"], 15'000'000'000ull);
  EXPECT_EQ(j["cross_node_bytes_per_step"]["reduce_scatter"], 15'000'000'000ull);
  EXPECT_EQ(j["cross_node_bytes_per_step"]["all_reduce"], 0ull);
  EXPECT_EQ(j["per_node_pinned_cpu_bytes"], 0ull);

  Result o = plan(std::string("--params 7.5e9 --units 1 ") + kMachine +
                  " --intra-shard 8 --inter-shard 2 --mode zero3 --offload cpu --json");
  ASSERT_EQ(o.rc, 0) << o.out;
  json k = json::parse(o.out);
  EXPECT_EQ(k["per_gpu_bytes"]["optimizer"], 0ull);
  EXPECT_EQ(k["per_node_pinned_cpu_bytes"], 8ull * 18ull * 468'750'000ull);
}

// The example MLP from a --layers file, fp32, on the demo's mesh (2 x 4, I = 4): the engine's
// numbers (plan_test.cc has the hand computation).
TEST(PlanCli, LayersFileExampleMlp) {
  const fs::path d = scratch("layers");
  std::ofstream(d / "mlp.txt") << "# train_mlp 32-1000-333-128-10\nfc0 33000\nfc1 333333\n"
                                  "fc2 42752\nfc3 1290\n";
  Result r = plan("--layers " + (d / "mlp.txt").string() +
                  " --nodes 2 --gpus-per-node 4 --intra-shard 4 --inter-shard 1 --mode zero3 "
                  "--param-dtype fp32 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(j["units"], 4);
  EXPECT_EQ(j["per_gpu_bytes"]["params"], 410'380ull);
  EXPECT_EQ(j["per_gpu_bytes"]["optimizer"], 820'760ull);
  EXPECT_EQ(j["per_gpu_bytes"]["gathered_peak"], 5'333'376ull);
  EXPECT_EQ(j["per_gpu_bytes"]["comm_buffers_estimate"], 2'000'016ull);
  fs::remove_all(d);
}

// A unit used twice in one forward (a tied embedding: 'NAME COUNT USES'), units 1000 x2, 1353,
// 340 on 3 x 2, zero3 I2 J3 (S = 6): padded 1002, 1356, 342, D = 4 * 2700 = 10800 bytes, the
// gathers' D_g = 4 * (2 * 1002 + 1356 + 342) = 14808. By hand (plan.h): intra (2 D_g + D) * R * J
// * (I-1) = 40416 * 3, inter (2 D_g + D) * (J-1) = 40416 * 2; with hpz the inter level gathers
// once per unit: (D + D) * 2. Bad uses are refused naming the line.
TEST(PlanCli, LayersFileUsesCountTiedUnitsPerUse) {
  const fs::path d = scratch("uses");
  std::ofstream(d / "tied.txt") << "wte 1000 2\nblock 1353\n340\n";
  const std::string args = "--layers " + (d / "tied.txt").string() +
                           " --nodes 3 --gpus-per-node 2 --intra-shard 2 --inter-shard 3 "
                           "--mode zero3 --param-dtype fp32 --json";
  Result r = plan(args);
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = json::parse(r.out)["level_bytes_per_step"];
  EXPECT_EQ(j["intra"], 40416u * 3);
  EXPECT_EQ(j["inter"], 40416u * 2);
  r = plan(args + " --hpz");
  ASSERT_EQ(r.rc, 0) << r.out;
  j = json::parse(r.out)["level_bytes_per_step"];
  EXPECT_EQ(j["intra"], 40416u * 3);
  EXPECT_EQ(j["inter"], 2u * 10800 * 2);
  for (const char* bad : {"wte 1000 0\n", "wte 1000 two\n", "a 1 2 3\n"}) {
    std::ofstream(d / "bad.txt") << bad;
    r = plan("--layers " + (d / "bad.txt").string() + " --nodes 1 --gpus-per-node 2");
    EXPECT_EQ(r.rc, 2) << bad << r.out;
    EXPECT_NE(r.out.find("bad.txt:1:"), std::string::npos) << r.out;
  }
  fs::remove_all(d);
}

TEST(PlanCli, AutoRanksByCrossNodeBytes) {
  Result r = plan(std::string("--params 7.5e9 ") + kMachine + " --auto --mem-budget 80G --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(j["considered"], 25);
  const json& fits = j["fits"];
  ASSERT_GT(fits.size(), 5ull);
  EXPECT_EQ(fits[0]["label"], "I8xJ1 zero3");
  for (size_t i = 1; i < fits.size(); ++i) {
    const uint64_t a = fits[i - 1]["cross_node_bytes_per_step"]["total"];
    const uint64_t b = fits[i]["cross_node_bytes_per_step"]["total"];
    EXPECT_LE(a, b) << i;
    if (a == b) {
      const uint64_t ma = fits[i - 1]["per_gpu_bytes"]["total"];
      const uint64_t mb = fits[i]["per_gpu_bytes"]["total"];
      EXPECT_LE(ma, mb) << i;
    }
    EXPECT_LE(fits[i]["per_gpu_bytes"]["total"].get<uint64_t>(), 80ull << 30);
    EXPECT_NE(fits[i]["mode"], "none");  // 120 GB: over budget
  }
  // The text table: rank 1 is zero3 over I8 x J1.
  Result t = plan(std::string("--params 7.5e9 ") + kMachine + " --auto --mem-budget 80G");
  ASSERT_EQ(t.rc, 0) << t.out;
  EXPECT_NE(t.out.find("configurations fit 80.00 GiB per GPU"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("   1     8     1     8        2  zero3"), std::string::npos) << t.out;
}

TEST(PlanCli, AutoNothingFitsExitsOne) {
  Result r = plan(std::string("--params 7.5e9 ") + kMachine + " --auto --mem-budget 1G");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("nothing fits: the smallest configuration"), std::string::npos) << r.out;
}

TEST(PlanCli, SvgWrittenAndWellFormed) {
  const fs::path d = scratch("svg");
  const fs::path svg = d / "plan.svg";
  Result r = plan(std::string("--params 7.5e9 ") + kMachine + " --auto --mem-budget 80G --svg " +
                  svg.string());
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("chart: " + svg.string() + " (25 configurations)"), std::string::npos)
      << r.out;
  const std::string doc = readFile(svg);
  EXPECT_EQ(hsdp::test::checkWellFormedXml(doc), "");
  EXPECT_EQ(hsdp::test::countElements(doc, "svg"), 1);
  EXPECT_EQ(hsdp::test::countElements(doc, "g"), 25);  // one row per configuration
  EXPECT_NE(doc.find("I8xJ2 zero3+hpz"), std::string::npos);
  EXPECT_NE(doc.find("(over budget)"), std::string::npos);  // mode none, 120 GB

  // Without --auto: every factorization of the chosen mode.
  const fs::path one = d / "zero3.svg";
  Result s =
      plan(std::string("--params 7.5e9 ") + kMachine + " --mode zero3 --svg " + one.string());
  ASSERT_EQ(s.rc, 0) << s.out;
  EXPECT_EQ(hsdp::test::checkWellFormedXml(readFile(one)), "");
  EXPECT_EQ(hsdp::test::countElements(readFile(one), "g"), 7);  // (I, J) != (1, 1)

  // A failing run leaves an existing chart untouched and no temporary behind.
  Result bad =
      plan(std::string("--params 7.5e9 ") + kMachine + " --mode zero9 --svg " + svg.string());
  EXPECT_EQ(bad.rc, 2);
  EXPECT_EQ(readFile(svg), doc);
  Result unwritable = plan(std::string("--params 7.5e9 ") + kMachine + " --svg " + d.string());
  EXPECT_EQ(unwritable.rc, 2) << unwritable.out;
  EXPECT_NE(unwritable.out.find("--svg: cannot write '" + d.string() + "'"), std::string::npos)
      << unwritable.out;
  for (const auto& e : fs::directory_iterator(d))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  fs::remove_all(d);
}

// --inter-param-wire / --inter-grad-wire / --replica-wire and the table by wire.
TEST(PlanCli, WiresAndTheTableByWire) {
  Result r = plan(
      "--params 1e6 --units 1 --nodes 2 --gpus-per-node 4 --intra-shard 4 "
      "--inter-shard 2 --param-dtype fp32 --inter-param-wire int8 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  json j = json::parse(r.out);
  EXPECT_EQ(j["cross_node_bytes_per_step"]["all_gather"], 2ull * 8 * 125'248);
  EXPECT_EQ(j["cross_node_bytes_per_step"]["reduce_scatter"], 8ull * 125'000 * 4);
  EXPECT_EQ(j["wires"]["param"], "int8");
  EXPECT_EQ(j["cross_node_bytes_per_step_by_wire"]["bf16"]["total"], 3ull * 8 * 125'000 * 2);
  Result t = plan(
      "--params 1e6 --units 1 --nodes 2 --gpus-per-node 4 --intra-shard 4 "
      "--inter-shard 2 --param-dtype fp32");
  ASSERT_EQ(t.rc, 0) << t.out;
  EXPECT_NE(t.out.find("cross-node bytes per step by wire"), std::string::npos) << t.out;
  EXPECT_NE(line(t.out, "  int8").find("0.25"), std::string::npos) << t.out;
  Result bad = plan("--params 1e6 --nodes 2 --gpus-per-node 4 --inter-grad-wire fp8");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.out.find("--inter-grad-wire"), std::string::npos) << bad.out;
}

TEST(PlanCli, HelpExitsZero) {
  Result r = plan("--help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("--mem-budget"), std::string::npos);
}

}  // namespace
