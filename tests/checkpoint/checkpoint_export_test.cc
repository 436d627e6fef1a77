// Checkpoints under mpirun (8 = 2x4 and 6 = 2x3 ranks), part of checkpoint_test (with
// checkpoint_test.cc, whose fixture is checkpoint_fixture.h): failed saves and loads that leave
// the state and the previous checkpoint as they were, the export against gatherFullParameters
// and loadWeights of it, and CheckpointReader's full parameters.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "hsdp/checkpoint.h"
#include "tests/checkpoint/checkpoint_fixture.h"
#include "tests/checkpoint/ckpt_test_util.h"
#include "tests/common/mpi_test_main.h"

namespace hsdp {
namespace {

using namespace ckpttest;

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
