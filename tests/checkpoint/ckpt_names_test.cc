// Silently wrong loads (issue 33), under mpirun (2 ranks): tensor names that collide ("<unit>.
// <param>") refused at addUnit and in a manifest; a key listed twice in a safetensors header or a
// manifest refused (nlohmann-json keeps the last one); a checkpoint's optimizer settings checked
// as the model's own are, and LoadOptions::optimizer_from deciding whose settings a load keeps.
// Files are written here by hand (bytes, JSON text), not by the code under test, wherever the
// test is about reading them.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "hsdp/checkpoint.h"
#include "hsdp/mesh.h"
#include "hsdp/sharded_model.h"
#include "hsdp/topology.h"
#include "storage/format.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using testing::world;

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Replaces the first `from` in the file by `to` (rank 0; a failure is reported, not returned
// from, so that every rank reaches the barrier), then every rank goes on.
void edit(const std::string& path, const std::string& from, const std::string& to,
          const std::string& after = "") {
  if (world().rank() == 0) {
    std::string s = readText(path);
    const size_t begin = after.empty() ? 0 : s.find(after);
    const size_t at = begin == std::string::npos ? begin : s.find(from, begin);
    EXPECT_NE(at, std::string::npos) << from << " (after " << after << ") not in " << path;
    if (at != std::string::npos) writeText(path, s.replace(at, from.size(), to));
  }
  EXPECT_TRUE(world().barrier().ok());
}

bool has(const Status& s, const std::string& what) {
  return s.message().find(what) != std::string::npos;
}

class Names : public ::testing::Test {
 protected:
  void SetUp() override {
    char buf[256] = {};
    if (world().rank() == 0) {
      const char* base = std::getenv("TMPDIR");
      std::snprintf(buf, sizeof buf, "%s/hsdp-names-XXXXXX", base ? base : "/tmp");
      if (mkdtemp(buf) == nullptr) buf[0] = 0;
    }
    ASSERT_TRUE(world().broadcast(buf, sizeof buf, DType::kUInt8, 0).ok());
    dir_ = buf;
    ASSERT_FALSE(dir_.empty());
    auto l = groupRanksIntoNodes(world());
    ASSERT_TRUE(l.ok());
    auto m = Mesh::create(world(), *l, {l->ranks_per_node, l->num_nodes});
    ASSERT_TRUE(m.ok()) << m.status().toString();
    mesh_ = std::move(*m);
  }
  void TearDown() override {
    (void)world().barrier();
    if (world().rank() == 0) std::filesystem::remove_all(dir_);
  }
  static EngineConfig config() {
    EngineConfig cfg;
    cfg.adam.lr = 0.01f;
    cfg.adam.weight_decay = 0.1f;
    cfg.adam.eps = 1e-5f;
    return cfg;
  }
  std::unique_ptr<ShardedModel> model(const EngineConfig& cfg = config()) {
    auto m = ckpttest::buildModel(*mesh_, cfg, 1.0f);
    EXPECT_TRUE(m.ok()) << m.status().toString();
    return m.ok() ? std::move(*m) : nullptr;
  }
  // Trains `steps` steps from the test model's initial values and saves into <dir>/<name>.
  std::string saved(const std::string& name, int steps, const EngineConfig& cfg = config()) {
    auto m = model(cfg);
    EXPECT_TRUE(m);
    for (int s = 0; s < steps; ++s) EXPECT_TRUE(ckpttest::trainStep(*m, world().rank(), s, 1).ok());
    auto r = m->save(dir_ + "/" + name, {.name = "ckpt"});
    EXPECT_TRUE(r.ok()) << r.status().toString();
    return r.ok() ? r->dir : "";
  }
  static std::vector<std::vector<float>> params(ShardedModel& m) {
    std::vector<std::vector<float>> all(m.numUnits());
    for (int u = 0; u < m.numUnits(); ++u) EXPECT_TRUE(m.gatherFullParameters(u, &all[u]).ok());
    return all;
  }
  std::string dir_;
  std::unique_ptr<Mesh> mesh_;
};

// ---- names at addUnit ----

TEST_F(Names, DuplicateUnitName) {
  auto m = ShardedModel::create(*mesh_, config());
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*m)->addUnit("a", {{"w", {3}}}).ok());
  auto again = (*m)->addUnit("a", {{"v", {2}}});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(has(again.status(), "duplicate unit name 'a'")) << again.status().toString();
  EXPECT_EQ((*m)->numUnits(), 1);
}

TEST_F(Names, DuplicateParameter) {
  auto m = ShardedModel::create(*mesh_, config());
  ASSERT_TRUE(m.ok());
  auto u = (*m)->addUnit("blk", {{"w", {3}}, {"b", {3}}, {"w", {4}}});
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(has(u.status(), "addUnit('blk')")) << u.status().toString();
  EXPECT_TRUE(has(u.status(), "duplicate parameter 'w'")) << u.status().toString();
  EXPECT_EQ((*m)->numUnits(), 0);
}

// Unit 'a.b' parameter 'c' and unit 'a' parameter 'b.c' are both the tensor 'a.b.c' of a
// checkpoint and of a safetensors export: refused, naming both, in either order; names that
// only share a prefix are fine.
TEST_F(Names, JoinedNamesCollide) {
  for (bool unit_first : {true, false}) {
    SCOPED_TRACE(unit_first ? "a.b first" : "a first");
    auto m = ShardedModel::create(*mesh_, config());
    ASSERT_TRUE(m.ok());
    ASSERT_TRUE((*m)->addUnit("a.bc", {{"d", {2}}}).ok());  // "a.bc.d": no collision
    ASSERT_TRUE((*m)->addUnit("a", {{"b.cd", {2}}}).ok());  // "a.b.cd": none either
    StatusOr<int> second = okStatus();
    if (unit_first) {
      ASSERT_TRUE((*m)->addUnit("a.b", {{"c", {5}}}).ok());
      second = (*m)->addUnit("x", {{"y", {1}}});  // unrelated: accepted
      ASSERT_TRUE(second.ok());
      second = (*m)->addUnit("a.b.c", {{"z", {1}}});  // "a.b.c.z": accepted
      ASSERT_TRUE(second.ok());
      auto m2 = ShardedModel::create(*mesh_, config());
      ASSERT_TRUE(m2.ok());
      ASSERT_TRUE((*m2)->addUnit("a.b", {{"c", {5}}}).ok());
      second = (*m2)->addUnit("a", {{"w", {1}}, {"b.c", {5}}});
    } else {
      ASSERT_TRUE((*m)->addUnit("p", {{"q.r", {5}}}).ok());
      second = (*m)->addUnit("p.q", {{"r", {5}}});
    }
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), StatusCode::kInvalidArgument);
    const std::string msg = second.status().message();
    if (unit_first) {
      EXPECT_TRUE(has(second.status(), "unit 'a.b' parameter 'c'")) << msg;
      EXPECT_TRUE(has(second.status(), "unit 'a' parameter 'b.c'")) << msg;
      EXPECT_TRUE(has(second.status(), "'a.b.c'")) << msg;
    } else {
      EXPECT_TRUE(has(second.status(), "unit 'p' parameter 'q.r'")) << msg;
      EXPECT_TRUE(has(second.status(), "unit 'p.q' parameter 'r'")) << msg;
    }
  }
}

// The refused unit is not registered: the model finalizes and exports one tensor per parameter.
TEST_F(Names, RefusedUnitLeavesModelExportable) {
  auto m = ShardedModel::create(*mesh_, config());
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*m)->addUnit("a.b", {{"c", {3}}}).ok());
  ASSERT_FALSE((*m)->addUnit("a", {{"b.c", {3}}}).ok());
  ASSERT_TRUE((*m)->finalize().ok());
  const float v[3] = {1, 2, 3};
  ASSERT_TRUE((*m)->setParameter(0, "c", v, 3).ok());
  auto files = (*m)->exportSafetensors(dir_ + "/one.safetensors");
  ASSERT_TRUE(files.ok()) << files.status().toString();
  if (world().rank() == 0) {
    const std::string s = readText(dir_ + "/one.safetensors");
    ASSERT_GT(s.size(), 8u);
    uint64_t n = 0;
    std::memcpy(&n, s.data(), 8);
    const std::string header = s.substr(8, n);
    EXPECT_NE(header.find("\"a.b.c\""), std::string::npos) << header;
    EXPECT_EQ(s.size(), 8 + n + 3 * sizeof(float));
  }
}

// ---- manifests edited by hand ----

// A manifest edited so that two parameters join to one name, or two units share a name, or an
// object holds a key twice, is refused by every reader (load, inspect, export), naming both.
TEST_F(Names, CollidingManifestRefused) {
  // Test model units: "emb" {weight, bias}, "h.0" {ln_1.weight, attn.w}, "head" {weight, bias}.
  const std::string good = saved("good", 1);
  ASSERT_FALSE(good.empty());
  struct Edit {
    const char* name;
    std::string from, to;
    std::vector<std::string> want;
  };
  const Edit edits[] = {
      // unit "h.0" parameter "ln_1.weight" vs unit "h" parameter "0.ln_1.weight".
      {"joined", "\"name\": \"head\"", "\"name\": \"h\"", {}},
      {"unit_twice", "\"name\": \"head\"", "\"name\": \"emb\"", {"both named 'emb'"}},
      {"param_twice",
       "\"name\": \"bias\"",
       "\"name\": \"weight\"",
       {"unit 'emb' has two parameters named 'weight'"}},
      {"key_twice",
       "\"optimizer\": {",
       "\"optimizer\": {\n  \"lr\": 5.0,",
       {"key 'lr' in optimizer appears twice"}},
      // An elastic group's membership (optional) of the wrong types: named, never a throw.
      {"elastic_group",
       "\"mesh\": {",
       "\"mesh\": {\n  \"elastic\": {\"job\": \"j\", \"group\": \"x\", \"committed_step\": 3, "
       "\"groups_present\": [0]},",
       {"field 'mesh.elastic.group' is not an integer"}},
      {"elastic_present",
       "\"mesh\": {",
       "\"mesh\": {\n  \"elastic\": {\"job\": \"j\", \"group\": 1, \"committed_step\": 3, "
       "\"groups_present\": [0, \"a\"]},",
       {"field 'mesh.elastic.groups_present' holds an entry that is not a group index"}},
  };
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.name);
    const std::string dir = dir_ + "/" + e.name;
    if (world().rank() == 0) std::filesystem::copy(good, dir);
    ASSERT_TRUE(world().barrier().ok());
    std::vector<std::string> want = e.want;
    if (std::string(e.name) == "joined") {
      // "head" {weight, bias} becomes "h" {weight, bias} below; make "h"'s first parameter
      // "0.ln_1.weight" (a unit's parameter names follow its name in the manifest).
      edit(dir + "/manifest.json", "\"name\": \"weight\"", "\"name\": \"0.ln_1.weight\"",
           "\"name\": \"head\"");
      // The shapes differ ([5] vs [3, 64]): the name check comes first.
      want = {"unit 'h.0' parameter 'ln_1.weight'", "unit 'h' parameter '0.ln_1.weight'",
              "'h.0.ln_1.weight'"};
    }
    edit(dir + "/manifest.json", e.from, e.to);
    auto m = model();
    ASSERT_TRUE(m);
    const auto before = params(*m);
    auto r = m->load(dir);
    ASSERT_FALSE(r.ok()) << "load of an edited manifest succeeded";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(has(r.status(), dir + "/manifest.json")) << r.status().toString();
    for (const std::string& w : want) EXPECT_TRUE(has(r.status(), w)) << r.status().toString();
    EXPECT_EQ(params(*m), before);  // unchanged
    EXPECT_EQ(m->stepCount(), 0);
    if (world().rank() == 0) {
      for (const Status& s : {inspectCheckpoint(dir, false).status(),
                              exportCheckpoint(dir, dir_ + "/x.safetensors").status(),
                              ckpt::readManifest(dir).status()}) {
        EXPECT_FALSE(s.ok());
        for (const std::string& w : want) EXPECT_TRUE(has(s, w)) << s.toString();
      }
    }
  }
  // The unedited checkpoint loads (the refusals above are the edits').
  auto m = model();
  ASSERT_TRUE(m);
  auto r = m->load(good);
  EXPECT_TRUE(r.ok()) << r.status().toString();
  EXPECT_EQ(m->stepCount(), 1);
}

// ---- safetensors with a key twice ----

// "<8-byte little-endian header length><header JSON><data>", by hand.
std::string safetensorsBytes(const std::string& header, const std::vector<float>& data) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);  // the test hosts are little-endian (x86-64, aarch64)
  s += header;
  s.append(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
  return s;
}

TEST_F(Names, SafetensorsDuplicateKeyRefused) {
  auto m = ShardedModel::create(*mesh_, config());
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE((*m)->addUnit("u", {{"w", {2}}, {"b", {2}}}).ok());
  ASSERT_TRUE((*m)->finalize().ok());
  const float zero[2] = {0, 0};
  ASSERT_TRUE((*m)->setParameter(0, "w", zero, 2).ok());
  ASSERT_TRUE((*m)->setParameter(0, "b", zero, 2).ok());
  const std::string w1 = R"("u.w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string b = R"("u.b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]})";
  const std::string w2 = R"("u.w":{"dtype":"F32","shape":[2],"data_offsets":[16,24]})";
  const std::vector<float> data = {1, 2, 3, 4, 5, 6};
  const std::string dup = dir_ + "/dup.safetensors", one = dir_ + "/one.safetensors";
  if (world().rank() == 0) {
    writeText(dup, safetensorsBytes("{" + w1 + "," + b + "," + w2 + "}", data));
    writeText(one, safetensorsBytes("{" + w1 + "," + b + "}", {1, 2, 3, 4}));
  }
  ASSERT_TRUE(world().barrier().ok());
  Status s = (*m)->loadWeights(dup);
  ASSERT_FALSE(s.ok()) << "a safetensors file listing 'u.w' twice loaded";
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(has(s, dup)) << s.toString();
  EXPECT_TRUE(has(s, "'u.w' at the top level appears twice")) << s.toString();
  std::vector<float> got;
  ASSERT_TRUE((*m)->gatherFullParameters(0, &got).ok());
  EXPECT_EQ(got, std::vector<float>({0, 0, 0, 0}));  // unchanged
  // The same file without the second entry loads: w = {1, 2}, b = {3, 4}.
  s = (*m)->loadWeights(one);
  ASSERT_TRUE(s.ok()) << s.toString();
  ASSERT_TRUE((*m)->gatherFullParameters(0, &got).ok());
  EXPECT_EQ(got, std::vector<float>({1, 2, 3, 4}));
  // A key twice inside a tensor's entry, and in __metadata__, are refused as well.
  const std::string inner =
      R"({"u.w":{"dtype":"F32","shape":[2],"shape":[2],"data_offsets":[0,8]}})";
  const std::string meta = R"({"__metadata__":{"format":"pt","format":"np"}})";
  EXPECT_NE(ckpt::duplicateJsonKey(inner), "");
  EXPECT_EQ(ckpt::duplicateJsonKey(meta), "'format' in __metadata__");
  EXPECT_EQ(ckpt::duplicateJsonKey("{" + w1 + "," + b + "}"), "");
  EXPECT_EQ(ckpt::duplicateJsonKey("{\"a\": [{\"k\": 1}, {\"k\": 2}]}"), "");  // other objects
}

// ---- the optimizer settings a checkpoint holds ----

// Sets `"key": <value>` of the manifest's optimizer object (rank 0).
void setOptimizerField(const std::string& manifest, const std::string& key,
                       const std::string& value) {
  if (world().rank() ==
      0) {  // failures reported, not returned from: every rank reaches the barrier
    std::string s = readText(manifest);
    const size_t o = s.find("\"optimizer\": {");
    const size_t at = o == std::string::npos ? o : s.find("\"" + key + "\": ", o);
    EXPECT_NE(at, std::string::npos) << key << " not in " << manifest;
    if (at != std::string::npos) {
      const size_t b = at + key.size() + 4, e = s.find_first_of(",\n}", b);
      writeText(manifest, s.replace(b, e - b, value));
    }
  }
  EXPECT_TRUE(world().barrier().ok());
}

// A value the flags and EngineConfig refuse is refused in a checkpoint too, naming the
// checkpoint, the setting and the value; the model is unchanged.
TEST_F(Names, BadOptimizerSettingsRefused) {
  const std::string good = saved("opt", 2);
  ASSERT_FALSE(good.empty());
  struct Case {
    const char* key;
    const char* value;
    const char* want;
  };
  const Case cases[] = {
      {"lr", "1e39", "field 'optimizer.lr' is 1e+39, which does not fit a float"},
      {"lr", "null", "field 'optimizer.lr' is not a number"},
      {"lr", "NaN", "not valid JSON"},
      {"lr", "-1", "learning rate -1 must be positive"},
      {"lr", "0", "learning rate 0 must be positive"},
      {"beta1", "1.0", "beta1 1 must be in [0, 1)"},
      {"beta2", "-0.5", "beta2 -0.5 must be in [0, 1)"},
      {"eps", "0", "eps 0 must be positive"},
      {"weight_decay", "-0.25", "weight decay -0.25 must be >= 0"},
      {"clip_norm", "-1", "clip_norm=-1 must be finite and >= 0"},
      {"kind", "\"sgd\"", "unknown optimizer 'sgd'"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value);
    const std::string dir = dir_ + "/bad" + std::to_string(i++);
    if (world().rank() == 0) std::filesystem::copy(good, dir);
    setOptimizerField(dir + "/manifest.json", c.key, c.value);
    auto m = model();
    ASSERT_TRUE(m);
    const auto before = params(*m);
    auto r = m->load(dir);
    ASSERT_FALSE(r.ok()) << "a checkpoint with " << c.key << " " << c.value << " loaded";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(has(r.status(), dir)) << r.status().toString();
    EXPECT_TRUE(has(r.status(), c.want)) << r.status().toString();
    EXPECT_EQ(params(*m), before);
    EXPECT_EQ(m->stepCount(), 0);
    EXPECT_EQ(m->learningRate(), config().adam.lr);
  }
}

bool sameAdam(const AdamConfig& a, const AdamConfig& b) {
  return a.kind == b.kind && a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 &&
         a.eps == b.eps && a.weight_decay == b.weight_decay;
}

// optimizer_from: kCheckpoint (the default) steps with every setting of the checkpoint whatever
// the model was created with; kConfig with the model's own. Truths: a model created with the
// checkpoint's settings, and setLearningRate after a load.
TEST_F(Names, OptimizerFrom) {
  const EngineConfig a = config();  // what the checkpoint was trained with
  const std::string ckpt = saved("from", 2, a);
  ASSERT_FALSE(ckpt.empty());
  EngineConfig x = a;  // every setting different
  x.adam = {OptimizerKind::kAdam, 0.002f, 0.8f, 0.99f, 1e-6f, 0.05f};
  const int rank = world().rank();
  auto run = [&](const EngineConfig& cfg, LoadOptions lo, float set_lr, AdamConfig* used) {
    auto m = model(cfg);
    EXPECT_TRUE(m);
    if (!m) return std::vector<std::vector<float>>{};
    auto r = m->load(ckpt, lo);
    EXPECT_TRUE(r.ok()) << r.status().toString();
    if (!r.ok()) return std::vector<std::vector<float>>{};
    EXPECT_TRUE(sameAdam(r->optimizer, a.adam));  // what the checkpoint holds, either way
    EXPECT_EQ(r->clip_norm, a.clip_norm);
    if (set_lr > 0) EXPECT_TRUE(m->setLearningRate(set_lr).ok());
    *used = m->config().adam;
    EXPECT_EQ(m->learningRate(), used->lr);
    EXPECT_TRUE(ckpttest::trainStep(*m, rank, 2, 1).ok());
    return params(*m);
  };
  AdamConfig used;
  const auto truth = run(a, {}, 0, &used);  // created with the checkpoint's settings
  ASSERT_FALSE(truth.empty());
  const auto from_ckpt = run(x, {}, 0, &used);
  EXPECT_TRUE(sameAdam(used, a.adam));
  EXPECT_EQ(from_ckpt, truth);  // bitwise: nothing of x's settings was used

  LoadOptions cfg_wins;
  cfg_wins.optimizer_from = OptimizerFrom::kConfig;
  const auto from_x = run(x, cfg_wins, 0, &used);
  EXPECT_TRUE(sameAdam(used, x.adam));
  EXPECT_NE(from_x, truth);
  // Only the rate differs: the checkpoint's settings with setLearningRate(0.002) after the load.
  EngineConfig y = a;
  y.adam.lr = 0.002f;
  const auto from_y = run(y, cfg_wins, 0, &used);
  EXPECT_TRUE(sameAdam(used, y.adam));
  const auto set_after = run(a, {}, 0.002f, &used);
  EXPECT_EQ(from_y, set_after);
  EXPECT_NE(from_y, truth);
  // kCheckpoint without restore_learning_rate: x's rate, the checkpoint's other settings.
  LoadOptions keep_lr;
  keep_lr.restore_learning_rate = false;
  const auto kept = run(x, keep_lr, 0, &used);
  AdamConfig want = a.adam;
  want.lr = x.adam.lr;
  EXPECT_TRUE(sameAdam(used, want));
  EXPECT_EQ(kept, set_after);
  // Parameters only: the checkpoint's settings are neither used nor checked.
  if (rank == 0) std::filesystem::copy(ckpt, dir_ + "/badlr");
  setOptimizerField(dir_ + "/badlr/manifest.json", "lr", "-1");
  auto m = model(x);
  ASSERT_TRUE(m);
  LoadOptions params_only;
  params_only.optimizer_state = false;
  auto r = m->load(dir_ + "/badlr", params_only);
  EXPECT_TRUE(r.ok()) << r.status().toString();
  EXPECT_TRUE(sameAdam(m->config().adam, x.adam));
}

}  // namespace
}  // namespace hsdp
