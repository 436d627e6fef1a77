// Checkpoints under mpirun (8 = 2x4 and 6 = 2x3 ranks): resume exactness against training
// straight through (the saved state of both compared byte for byte), loading into every other
// mesh and mode of the world (parameters and moments identical through diffCheckpoints and
// gatherFullParameters), keep_last, `latest` and the user blob.
#include "hsdp/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace ckpttest {

std::string sharedTempDir(Comm& world) {
  char buf[256] = {};
  if (world.rank() == 0) {
    const char* base = std::getenv("TMPDIR");
    std::snprintf(buf, sizeof buf, "%s/hsdp-ckpt-XXXXXX", base ? base : "/tmp");
    if (mkdtemp(buf) == nullptr) buf[0] = 0;
  }
  if (!world.broadcast(buf, sizeof buf, DType::kUInt8, 0).ok()) return {};
  return buf;
}

}  // namespace ckpttest

namespace {

using namespace ckpttest;
using testing::world;

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  const char* name;
  ShardMode mode;
  int intra, inter;  // 0: all ranks of a node / all nodes
  bool hpz = false;
  DType param_dtype = DType::kFloat32, reduce_dtype = DType::kFloat32;
  int accum = 1;
  float clip = 0;
  bool offload = false;
  bool async = false;
};

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = sharedTempDir(world());
    ASSERT_FALSE(dir_.empty());
    auto l = groupRanksIntoNodes(world());
    ASSERT_TRUE(l.ok());
    layout_ = *l;
  }
  void TearDown() override {
    (void)world().barrier();
    if (world().rank() == 0) std::filesystem::remove_all(dir_);
  }
  std::unique_ptr<Mesh> mesh(int intra, int inter) {
    auto m = Mesh::create(
        world(), layout_,
        {intra == 0 ? layout_.ranks_per_node : intra, inter == 0 ? layout_.num_nodes : inter});
    EXPECT_TRUE(m.ok()) << m.status().toString();
    return m.ok() ? std::move(*m) : nullptr;
  }
  static EngineConfig config(const Case& c) {
    EngineConfig cfg;
    cfg.mode = c.mode;
    cfg.adam.lr = 0.01f;
    cfg.adam.weight_decay = 0.1f;
    cfg.adam.eps = 1e-5f;
    cfg.hpz = c.hpz;
    cfg.precision.param_dtype = c.param_dtype;
    cfg.precision.reduce_dtype = c.reduce_dtype;
    cfg.clip_norm = c.clip;
    cfg.offload.cpu = c.offload;
    return cfg;
  }
  std::string dir_;
  NodeLayout layout_;
};

// N + M steps straight vs N steps, save, a new model (other initial values) that loads and
// trains M: the two final checkpoints hold the same bytes (parameters, both moments, step).
TEST_F(Checkpoint, ResumeIsBitwise) {
  const int rank = world().rank();
  const int N = 3, M = 2;
  const Case cases[] = {
      {"zero3.hpz", ShardMode::kZero3, 0, 0, true},
      {"zero3.offload.clip.accum2.async", ShardMode::kZero3, 0, 1, false, DType::kFloat32,
       DType::kFloat32, 2, 0.05f, true, true},
      {"zero2.bf16both", ShardMode::kZero2, 0, 0, false, DType::kBFloat16, DType::kBFloat16},
      {"zero2.i1.offload.bf16params.async", ShardMode::kZero2, 1, 0, false, DType::kBFloat16,
       DType::kFloat32, 1, 0, true, true},
      {"zero1.accum3.clip", ShardMode::kZero1, 0, 1, false, DType::kFloat32, DType::kFloat32, 3,
       0.05f},
      {"zero1.i1.j1.async", ShardMode::kZero1, 1, 1, false, DType::kFloat32, DType::kFloat32, 1, 0,
       false, true},
      {"none.accum2.clip", ShardMode::kNone, 1, 1, false, DType::kFloat32, DType::kFloat32, 2,
       0.05f},
      {"none.async", ShardMode::kNone, 1, 1, false, DType::kFloat32, DType::kFloat32, 1, 0, false,
       true},
      {"zero3.hpz.bf16both.accum2.clip.async", ShardMode::kZero3, 0, 0, true, DType::kBFloat16,
       DType::kBFloat16, 2, 0.05f, false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto m = mesh(c.intra, c.inter);
    ASSERT_TRUE(m);
    const std::string root = dir_ + "/" + c.name;
    {  // straight through
      auto a = buildModel(*m, config(c), 1.0f);
      ASSERT_TRUE(a.ok()) << a.status().toString();
      for (int s = 0; s < N + M; ++s) ASSERT_TRUE(trainStep(**a, rank, s, c.accum).ok());
      ASSERT_TRUE((*a)->save(root + "/a", {.name = "final"}).ok());
    }
    {  // N steps, save (async: two more steps while it is written)
      auto b = buildModel(*m, config(c), 1.0f);
      ASSERT_TRUE(b.ok());
      for (int s = 0; s < N; ++s) ASSERT_TRUE(trainStep(**b, rank, s, c.accum).ok());
      if (c.async) {
        ASSERT_TRUE((*b)->saveAsync(root + "/b").ok());
        for (int s = N; s < N + 2; ++s) ASSERT_TRUE(trainStep(**b, rank, s, c.accum).ok());
        auto r = (*b)->waitForSave();
        ASSERT_TRUE(r.ok()) << r.status().toString();
        EXPECT_EQ(r->step, N);
      } else {
        auto r = (*b)->save(root + "/b");
        ASSERT_TRUE(r.ok()) << r.status().toString();
      }
    }
    {  // a new model with other values loads and trains M
      auto cm = buildModel(*m, config(c), 7.0f);
      ASSERT_TRUE(cm.ok());
      auto r = (*cm)->load(root + "/b");
      ASSERT_TRUE(r.ok()) << r.status().toString();
      EXPECT_EQ(r->step, N);
      EXPECT_EQ((*cm)->stepCount(), N);
      for (int s = N; s < N + M; ++s) ASSERT_TRUE(trainStep(**cm, rank, s, c.accum).ok());
      ASSERT_TRUE((*cm)->save(root + "/c", {.name = "final"}).ok());
    }
    // Same mesh, same state: every rank's data file holds the same bytes.
    char name[32];
    std::snprintf(name, sizeof name, "data-%05d.bin", rank);
    const std::string a = readFile(root + "/a/final/" + name);
    const std::string b = readFile(root + "/c/final/" + name);
    EXPECT_GT(a.size(), 0u);
    EXPECT_TRUE(a == b) << name << " differs between straight and resumed training";
    if (rank == 0) {
      auto d = diffCheckpoints(root + "/a/final", root + "/c/final");
      ASSERT_TRUE(d.ok()) << d.status().toString();
      EXPECT_TRUE(d->identical());
      EXPECT_EQ(d->step_a, N + M);
    }
  }
}

// saveAsync returns before its copier thread has read the host state: setParameter at once
// after it (and with offload, a step) must wait for the copy. The checkpoint holds the values of
// the save's step, the model the new ones. A few MiB per rank, so that the copy is still going
// when setParameter comes; without the wait the first check fails.
TEST_F(Checkpoint, AsyncSaveHoldsTheStateOfItsStep) {
  const Case cases[] = {
      {"zero3", ShardMode::kZero3, 0, 0},
      {"zero3.offload", ShardMode::kZero3, 0, 0, false, DType::kFloat32, DType::kFloat32, 1, 0,
       true},
  };
  const size_t numel = size_t{1} << 20 << (world().size() > 4 ? 3 : 2);
  std::vector<float> before(numel), after(numel);
  for (size_t i = 0; i < numel; ++i) {
    before[i] = 0.001f * float(i % 1009);
    after[i] = -0.5f - 0.002f * float(i % 997);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto m = mesh(c.intra, c.inter);
    ASSERT_TRUE(m);
    const std::string root = dir_ + "/held-" + c.name;
    auto make = [&]() -> std::unique_ptr<ShardedModel> {
      auto model = ShardedModel::create(*m, config(c));
      EXPECT_TRUE(model.ok());
      if (!model.ok()) return nullptr;
      EXPECT_TRUE((*model)->addUnit("big", {{"w", {static_cast<int64_t>(numel)}}}).ok());
      EXPECT_TRUE((*model)->finalize().ok());
      return std::move(*model);
    };
    auto a = make();
    ASSERT_TRUE(a);
    ASSERT_TRUE(a->setParameter(0, "w", before.data(), numel).ok());
    ASSERT_TRUE(a->saveAsync(root, {.name = "held"}).ok());
    ASSERT_TRUE(a->setParameter(0, "w", after.data(), numel).ok());
    auto r = a->waitForSave();
    ASSERT_TRUE(r.ok()) << r.status().toString();
    std::vector<float> got;
    ASSERT_TRUE(a->gatherFullParameters(0, &got).ok());
    EXPECT_TRUE(got == after) << "setParameter after saveAsync did not take effect";
    auto b = make();
    ASSERT_TRUE(b);
    auto l = b->load(root + "/held");
    ASSERT_TRUE(l.ok()) << l.status().toString();
    ASSERT_TRUE(b->gatherFullParameters(0, &got).ok());
    EXPECT_TRUE(got == before) << "the checkpoint holds values set after saveAsync";
  }
}

// Saved on the full shard group (zero3), loaded into every other mesh and mode of this world:
// the same parameters (gatherFullParameters) and, saved again, the same checkpoint contents.
TEST_F(Checkpoint, LoadsIntoEveryMeshAndMode) {
  const int rank = world().rank();
  auto m0 = mesh(0, 0);
  ASSERT_TRUE(m0);
  Case base{"base", ShardMode::kZero3, 0, 0};
  std::vector<std::vector<float>> want(3);
  {
    auto a = buildModel(*m0, config(base), 2.0f);
    ASSERT_TRUE(a.ok());
    for (int s = 0; s < 2; ++s) ASSERT_TRUE(trainStep(**a, rank, s, 1).ok());
    SaveOptions so;
    so.user["data_position"] = "1234";
    so.user["rng"] = std::string("\0\1\2\3", 4);
    ASSERT_TRUE((*a)->save(dir_ + "/src", so).ok());
    for (int u = 0; u < 3; ++u) ASSERT_TRUE((*a)->gatherFullParameters(u, &want[u]).ok());
  }
  int n = 0;
  for (int I = 1; I <= layout_.ranks_per_node; ++I) {
    if (layout_.ranks_per_node % I) continue;
    for (int J = 1; J <= layout_.num_nodes; ++J) {
      if (layout_.num_nodes % J) continue;
      for (ShardMode mode :
           {ShardMode::kNone, ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3}) {
        if (mode == ShardMode::kNone && I * J != 1) continue;
        Case c{"target", mode, I, J};
        c.hpz = mode == ShardMode::kZero3 && I > 1 && J > 1;
        c.offload = mode == ShardMode::kZero2 && (I + J) % 2 == 1;
        SCOPED_TRACE(strCat(shardModeName(mode), " I", I, " J", J, c.hpz ? " hpz" : "",
                            c.offload ? " offload" : ""));
        auto m = mesh(I, J);
        ASSERT_TRUE(m);
        auto b = buildModel(*m, config(c), 5.0f);
        ASSERT_TRUE(b.ok());
        auto r = (*b)->load(dir_ + "/src");
        ASSERT_TRUE(r.ok()) << r.status().toString();
        EXPECT_EQ(r->user["data_position"], "1234");
        EXPECT_EQ(r->user["rng"], std::string("\0\1\2\3", 4));
        for (int u = 0; u < 3; ++u) {
          std::vector<float> got;
          ASSERT_TRUE((*b)->gatherFullParameters(u, &got).ok());
          EXPECT_TRUE(got == want[u]) << "unit " << u;
        }
        const std::string again = strCat(dir_, "/again", n++);
        ASSERT_TRUE((*b)->save(again).ok());
        if (rank == 0) {
          auto d = diffCheckpoints(dir_ + "/src", again);
          ASSERT_TRUE(d.ok()) << d.status().toString();
          EXPECT_TRUE(d->identical());
        }
        // And it trains on from there like the original would have.
        ASSERT_TRUE(trainStep(**b, rank, 2, 1).ok());
      }
    }
  }
}

// keep_last keeps the newest K; `latest` names the newest; a root loads through it.
TEST_F(Checkpoint, KeepLastAndLatest) {
  const int rank = world().rank();
  auto m = mesh(0, 1);
  ASSERT_TRUE(m);
  auto a = buildModel(*m, config({"k", ShardMode::kZero2, 0, 1}), 3.0f);
  ASSERT_TRUE(a.ok());
  for (int s = 0; s < 4; ++s) {
    ASSERT_TRUE(trainStep(**a, rank, s, 1).ok());
    auto r = (*a)->save(dir_ + "/root", {.keep_last = 2});
    ASSERT_TRUE(r.ok()) << r.status().toString();
    EXPECT_EQ(r->step, s + 1);
  }
  (void)world().barrier();
  std::vector<std::string> names;
  for (auto& e : std::filesystem::directory_iterator(dir_ + "/root"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000003", "step-00000004"}));
  EXPECT_EQ(readFile(dir_ + "/root/latest"), "step-00000004\n");
  auto b = buildModel(*m, config({"k", ShardMode::kZero3, 0, 0}), 4.0f);
  ASSERT_TRUE(b.ok());
  auto r = (*b)->load(dir_ + "/root");
  ASSERT_TRUE(r.ok()) << r.status().toString();
  EXPECT_EQ(r->step, 4);
  EXPECT_EQ(r->dir, dir_ + "/root/step-00000004");
}

std::vector<std::vector<float>> gatherAll(ShardedModel& m) {
  std::vector<std::vector<float>> v(m.numUnits());
  for (int u = 0; u < m.numUnits(); ++u) EXPECT_TRUE(m.gatherFullParameters(u, &v[u]).ok());
  return v;
}

// Failed saves (an unwritable root; a full disk on one rank, through RLIMIT_FSIZE) are the same
// error on every rank naming the file, and leave the previous checkpoint committed, verifying
// and loading; a failed load (one flipped byte) leaves the model as it was.
TEST_F(Checkpoint, FailuresLeaveStateAndPreviousCheckpoint) {
  const int rank = world().rank();
  auto m = mesh(0, 0);
  ASSERT_TRUE(m);
  auto a = buildModel(*m, config({"f", ShardMode::kZero3, 0, 0}), 6.0f);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(trainStep(**a, rank, 0, 1).ok());
  const std::string root = dir_ + "/root";
  ASSERT_TRUE((*a)->save(root).ok());
  const auto good = gatherAll(**a);
  ASSERT_TRUE(trainStep(**a, rank, 1, 1).ok());

  auto bad = (*a)->save("/proc/hsdp-ckpt-test");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("/proc/hsdp-ckpt-test"), std::string::npos)
      << bad.status().toString();

  // The last rank's disk is full: its write fails with EFBIG (SIGXFSZ ignored).
  const int victim = world().size() - 1;
  struct rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  if (rank == victim) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = {4096, old.rlim_max};
    setrlimit(RLIMIT_FSIZE, &small);
  }
  bad = (*a)->save(root);
  if (rank == victim) setrlimit(RLIMIT_FSIZE, &old);
  ASSERT_FALSE(bad.ok());
  char file[32];
  std::snprintf(file, sizeof file, "data-%05d.bin", victim);
  EXPECT_NE(bad.status().message().find(file), std::string::npos) << bad.status().toString();
  EXPECT_NE(bad.status().message().find("File too large"), std::string::npos)
      << bad.status().toString();
  (void)world().barrier();
  EXPECT_EQ(readFile(root + "/latest"), "step-00000001\n");
  EXPECT_FALSE(std::filesystem::exists(root + "/step-00000002"));
  EXPECT_TRUE(verifyCheckpoint(root).ok());

  // One flipped byte in a copy: the load fails on every rank, naming the file; nothing changed.
  const std::string copy = dir_ + "/flipped";
  if (rank == 0) {
    std::filesystem::copy(root + "/step-00000001", copy);
    std::fstream f(copy + "/data-00001.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(100);
    f.write(&c, 1);
  }
  (void)world().barrier();
  const auto before = gatherAll(**a);
  auto l = (*a)->load(copy);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("data-00001.bin': bytes ["), std::string::npos)
      << l.status().toString();
  EXPECT_EQ((*a)->stepCount(), 2);
  EXPECT_TRUE(gatherAll(**a) == before);

  // The previous checkpoint loads; a later save succeeds (the failed one's leftovers go).
  auto r = (*a)->load(root);
  ASSERT_TRUE(r.ok()) << r.status().toString();
  EXPECT_EQ((*a)->stepCount(), 1);
  EXPECT_TRUE(gatherAll(**a) == good);
  ASSERT_TRUE(trainStep(**a, rank, 1, 1).ok());
  ASSERT_TRUE((*a)->save(root).ok());
  (void)world().barrier();
  EXPECT_EQ(readFile(root + "/latest"), "step-00000002\n");
  std::vector<std::string> names;
  for (auto& e : std::filesystem::directory_iterator(root)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000001", "step-00000002"}));
}

// A checkpoint's export equals gatherFullParameters bit for bit, in both export paths (the
// model's and the offline one from the checkpoint), sharded or not; loadWeights of it on another
// mesh gives the same parameters back (bf16: their roundings).
TEST_F(Checkpoint, ExportAndLoadWeights) {
  const int rank = world().rank();
  auto m = mesh(0, 0);
  ASSERT_TRUE(m);
  auto a = buildModel(*m, config({"e", ShardMode::kZero3, 0, 0}), 8.0f);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(trainStep(**a, rank, 0, 1).ok());
  ASSERT_TRUE((*a)->save(dir_ + "/root").ok());
  const auto want = gatherAll(**a);
  auto files = (*a)->exportSafetensors(dir_ + "/model.safetensors");
  ASSERT_TRUE(files.ok()) << files.status().toString();
  ExportOptions sharded;
  sharded.max_shard_bytes = 4000;
  ExportOptions b16;
  b16.dtype = DType::kBFloat16;
  if (rank == 0) {
    auto off = exportCheckpoint(dir_ + "/root", dir_ + "/offline.safetensors");
    ASSERT_TRUE(off.ok()) << off.status().toString();
    EXPECT_EQ(readFile(dir_ + "/offline.safetensors"), readFile(dir_ + "/model.safetensors"));
    auto sh = exportCheckpoint(dir_ + "/root", dir_ + "/sh.safetensors", sharded);
    ASSERT_TRUE(sh.ok()) << sh.status().toString();
    EXPECT_EQ(sh->size(), 4u);  // three shards and the index
    ASSERT_TRUE(exportCheckpoint(dir_ + "/root", dir_ + "/b16.safetensors", b16).ok());
  }
  (void)world().barrier();
  for (const char* path : {"/model.safetensors", "/sh.safetensors", "/b16.safetensors"}) {
    SCOPED_TRACE(path);
    auto m2 = mesh(1, 1);
    auto b = buildModel(*m2, config({"w", ShardMode::kZero1, 1, 1}), 9.0f);
    ASSERT_TRUE(b.ok());
    Status s = (*b)->loadWeights(dir_ + path);
    ASSERT_TRUE(s.ok()) << s.toString();
    auto got = gatherAll(**b);
    auto expect = want;
    if (std::string(path) == "/b16.safetensors")
      for (auto& v : expect)
        for (float& x : v) x = toFloat(toBf16(x));
    EXPECT_TRUE(got == expect);
  }
  // Strict: a model with a parameter the file lacks is refused, naming it; not strict loads the
  // rest.
  auto m3 = mesh(0, 0);
  auto c = ShardedModel::create(*m3, config({"x", ShardMode::kZero3, 0, 0}));
  ASSERT_TRUE(c.ok());
  for (auto& [name, params] : testUnits()) ASSERT_TRUE((*c)->addUnit(name, params).ok());
  ASSERT_TRUE((*c)->addUnit("extra", {{"w", {4}}}).ok());
  ASSERT_TRUE((*c)->finalize().ok());
  Status s = (*c)->loadWeights(dir_ + "/model.safetensors");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no tensor 'extra.w'"), std::string::npos) << s.toString();
  ASSERT_TRUE((*c)->loadWeights(dir_ + "/model.safetensors", {.strict = false}).ok());
  for (int u = 0; u < 3; ++u) {
    std::vector<float> got;
    ASSERT_TRUE((*c)->gatherFullParameters(u, &got).ok());
    EXPECT_TRUE(got == want[u]);
  }
}

// CheckpointReader (what the Python hsdp.checkpoint reads with) gives every parameter whole,
// equal to gatherFullParameters bit for bit: mapped where a tensor is one run of one data file,
// assembled otherwise, with and without checks, and into the caller's buffer; on the saved mesh
// (some tensors inside one rank's piece, most spread) and resharded for one rank (all mapped). A
// flipped byte is an error naming the file and "checksum", mapped and assembled.
TEST_F(Checkpoint, ReaderGivesTheFullParameters) {
  const int rank = world().rank();
  auto m = mesh(0, 0);
  ASSERT_TRUE(m);
  auto a = buildModel(*m, config({"r", ShardMode::kZero3, 0, 0}), 5.0f);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(trainStep(**a, rank, 0, 1).ok());
  ASSERT_TRUE((*a)->save(dir_ + "/root").ok());
  const auto want = gatherAll(**a);
  if (rank == 0) {
    MeshTarget one;  // world 1: every tensor one run of data-00000.bin
    ASSERT_TRUE(reshardCheckpoint(dir_ + "/root", dir_ + "/one", one).ok());
    const auto units = testUnits();
    for (const std::string path : {dir_ + "/root", dir_ + "/one"}) {
      SCOPED_TRACE(path);
      auto r = CheckpointReader::open(path);
      ASSERT_TRUE(r.ok()) << r.status().toString();
      size_t mapped = 0, tensors = 0;
      for (int u = 0; u < (*a)->numUnits(); ++u) {
        size_t offset = 0;
        for (const ParamSpec& p : (*a)->layout(u).params()) {
          const std::string name = units[u].first + "." + p.name;
          const int t = (*r)->find(name);
          ASSERT_GE(t, 0) << name;
          const float* expect = want[u].data() + offset;
          offset += p.numel();
          ++tensors;
          for (bool verify : {true, false})
            for (bool map : {true, false}) {
              auto d = (*r)->read(t, TensorState::kParam, verify, map);
              ASSERT_TRUE(d.ok()) << name << ": " << d.status().toString();
              ASSERT_EQ(d->size(), p.numel());
              EXPECT_EQ(std::memcmp(d->data(), expect, p.numel() * 4), 0) << name;
              EXPECT_EQ(d->mapped(), map && (*r)->contiguous(t, TensorState::kParam)) << name;
              if (verify && map && d->mapped()) ++mapped;
              TensorData moved = std::move(*d);  // the owner moves; the mapping stays valid
              EXPECT_EQ(std::memcmp(moved.data(), expect, p.numel() * 4), 0) << name;
            }
          std::vector<float> into(p.numel());
          ASSERT_TRUE((*r)->readInto(t, TensorState::kParam, into.data()).ok());
          EXPECT_EQ(std::memcmp(into.data(), expect, p.numel() * 4), 0) << name;
          auto m1 = (*r)->read(t, TensorState::kExpAvg, true, true);
          auto m2 = (*r)->read(t, TensorState::kExpAvg, true, false);
          ASSERT_TRUE(m1.ok() && m2.ok()) << name;
          EXPECT_EQ(std::memcmp(m1->data(), m2->data(), p.numel() * 4), 0) << name;
        }
      }
      if (path == dir_ + "/one") {
        EXPECT_EQ(mapped, tensors);
      } else {
        EXPECT_GT(mapped, 0u);
        EXPECT_LT(mapped, tensors);
      }
    }
    // A flipped byte in the first tensor's first chunk (offset 0 of the one rank's file).
    {
      std::fstream f(dir_ + "/one/data-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
      ASSERT_TRUE(f.good());
      char c = 0;
      f.seekg(8);
      f.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      f.seekp(8);
      f.write(&c, 1);
    }
    auto r = CheckpointReader::open(dir_ + "/one");
    ASSERT_TRUE(r.ok());
    for (bool map : {true, false}) {
      auto d = (*r)->read(0, TensorState::kParam, true, map);
      ASSERT_FALSE(d.ok()) << "map " << map;
      EXPECT_NE(d.status().message().find("checksum"), std::string::npos) << d.status().toString();
      EXPECT_NE(d.status().message().find("data-00000.bin"), std::string::npos);
      EXPECT_TRUE((*r)->read(0, TensorState::kParam, false, map).ok());
    }
    EXPECT_FALSE((*r)->verify().ok());
    EXPECT_FALSE(CheckpointReader::open(dir_ + "/nowhere").ok());
  }
  (void)world().barrier();
}

}  // namespace
}  // namespace hsdp
