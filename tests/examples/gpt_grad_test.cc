// The GPT example's layers against central finite differences of their forward in double
// precision (every backward: linear, layer norm, GELU, attention, embeddings, cross-entropy), the
// whole model's backward (tied embedding, residuals, activation checkpointing) against finite
// differences of its loss, and the data split, the schedule and the reference trainer.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "gpt/data.h"
#include "gpt/layers.h"
#include "gpt/model.h"
#include "gpt/reference.h"

namespace {

using MatD = gpt::Mat<double>;
using VecD = gpt::Vec<double>;

MatD randomMat(int rows, int cols, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  MatD m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = u(gen);
  return m;
}

// Central differences of f over every element of x against `analytic` (same size).
void expectMatchesFiniteDifferences(const std::function<double()>& f, double* x, size_t n,
                                    const double* analytic, const char* what) {
  const double h = 1e-5;
  for (size_t i = 0; i < n; ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f();
    x[i] = keep - h;
    const double down = f();
    x[i] = keep;
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(analytic[i], fd, 1e-7 + 1e-6 * std::fabs(fd)) << what << " element " << i;
  }
}

double dot(const MatD& a, const MatD& b) { return (a.array() * b.array()).sum(); }

TEST(GptLayers, LinearBackward) {
  const int in = 5, out = 4, n = 3;
  MatD W = randomMat(out, in, 1), b = randomMat(out, 1, 2), x = randomMat(in, n, 3);
  const MatD R = randomMat(out, n, 4);  // L = <R, y>, so dL/dy = R
  auto loss = [&] {
    MatD y;
    gpt::linearForward(W.data(), b.data(), in, out, x, &y);
    return dot(R, y);
  };
  MatD dW = MatD::Zero(out, in), db = MatD::Zero(out, 1), dx;
  gpt::linearBackward(W.data(), in, out, x, R, dW.data(), db.data(), &dx);
  expectMatchesFiniteDifferences(loss, W.data(), W.size(), dW.data(), "dW");
  expectMatchesFiniteDifferences(loss, b.data(), b.size(), db.data(), "db");
  expectMatchesFiniteDifferences(loss, x.data(), x.size(), dx.data(), "dx");
}

TEST(GptLayers, LayerNormBackward) {
  const int d = 6, n = 4;
  MatD g = randomMat(d, 1, 5, 0.5, 1.5), b = randomMat(d, 1, 6), x = randomMat(d, n, 7, -2, 2);
  const MatD R = randomMat(d, n, 8);
  VecD mean, rstd;
  auto loss = [&] {
    MatD y;
    gpt::layerNormForward(g.data(), b.data(), x, &y, &mean, &rstd);
    return dot(R, y);
  };
  loss();  // the statistics backward reads
  MatD dg = MatD::Zero(d, 1), db = MatD::Zero(d, 1), dx = MatD::Zero(d, n);
  gpt::layerNormBackward(g.data(), x, mean, rstd, R, dg.data(), db.data(), &dx);
  expectMatchesFiniteDifferences(loss, g.data(), g.size(), dg.data(), "dgamma");
  expectMatchesFiniteDifferences(loss, b.data(), b.size(), db.data(), "dbeta");
  expectMatchesFiniteDifferences(loss, x.data(), x.size(), dx.data(), "dx");
}

TEST(GptLayers, GeluBackward) {
  MatD x = randomMat(7, 3, 9, -3, 3);
  const MatD R = randomMat(7, 3, 10);
  auto loss = [&] {
    MatD y;
    gpt::geluForward(x, &y);
    return dot(R, y);
  };
  MatD dx = R;
  gpt::geluBackward(x, &dx);
  expectMatchesFiniteDifferences(loss, x.data(), x.size(), dx.data(), "dx");
  // The tanh approximation's known values: gelu(0) = 0, gelu(1) = 0.841192.
  MatD y, one(1, 2);
  one << 0.0, 1.0;
  gpt::geluForward(one, &y);
  EXPECT_NEAR(y(0, 0), 0.0, 1e-12);
  EXPECT_NEAR(y(0, 1), 0.8411919906, 1e-9);
}

TEST(GptLayers, AttentionBackwardAndCausality) {
  const int B = 2, T = 5, H = 2, d = 4;
  MatD qkv = randomMat(3 * d, B * T, 11, -2, 2);
  const MatD R = randomMat(d, B * T, 12);
  MatD probs, scratch;
  auto loss = [&] {
    MatD y;
    gpt::attentionForward(qkv, B, T, H, &probs, &y);
    return dot(R, y);
  };
  loss();
  MatD dqkv;
  gpt::attentionBackward(qkv, probs, R, B, T, H, &dqkv, &scratch);
  expectMatchesFiniteDifferences(loss, qkv.data(), qkv.size(), dqkv.data(), "dqkv");
  // Causal: each query's probabilities sum to 1 over keys j <= i and are 0 beyond.
  for (int c = 0; c < B * H; ++c)
    for (int i = 0; i < T; ++i) {
      EXPECT_NEAR(probs.col(c * T + i).head(i + 1).sum(), 1.0, 1e-12);
      EXPECT_EQ(probs.col(c * T + i).tail(T - i - 1).cwiseAbs().sum(), 0.0);
    }
  // The output of token t does not depend on later tokens: changing the last token's k and v
  // leaves every earlier column of y as it was.
  MatD y0, y1, p;
  gpt::attentionForward(qkv, B, T, H, &p, &y0);
  qkv.block(d, T - 1, 2 * d, 1).setConstant(7.0);
  gpt::attentionForward(qkv, B, T, H, &p, &y1);
  EXPECT_EQ(y0.leftCols(T - 1), y1.leftCols(T - 1));
}

TEST(GptLayers, EmbeddingBackward) {
  const int V = 7, d = 3, B = 2, T = 3;
  MatD table = randomMat(d, V, 13), wpe = randomMat(d, T, 14);
  const std::vector<int32_t> tokens = {3, 0, 3, 6, 3, 1};  // repeats accumulate
  const MatD R = randomMat(d, B * T, 15);
  auto loss = [&] {
    MatD x;
    gpt::embedForward(table.data(), d, tokens.data(), B * T, &x);
    gpt::positionForward(wpe.data(), B, T, &x);
    return dot(R, x);
  };
  MatD dtable = MatD::Zero(d, V), dwpe = MatD::Zero(d, T);
  gpt::embedBackward(R, tokens.data(), dtable.data());
  gpt::positionBackward(R, B, T, dwpe.data());
  expectMatchesFiniteDifferences(loss, table.data(), table.size(), dtable.data(), "dwte");
  expectMatchesFiniteDifferences(loss, wpe.data(), wpe.size(), dwpe.data(), "dwpe");
}

TEST(GptLayers, CrossEntropyBackward) {
  MatD logits = randomMat(5, 4, 16, -3, 3);
  const std::vector<int32_t> targets = {4, 0, 2, 2};
  const double scale = 0.7;
  auto loss = [&] {
    return scale * gpt::crossEntropy<double>(logits, targets.data(), 1.0, nullptr);
  };
  MatD dlogits;
  gpt::crossEntropy<double>(logits, targets.data(), scale, &dlogits);
  expectMatchesFiniteDifferences(loss, logits.data(), logits.size(), dlogits.data(), "dlogits");
  // Uniform logits: the loss is log(V).
  EXPECT_NEAR(gpt::crossEntropy<double>(MatD::Zero(5, 4), targets.data(), 1.0, nullptr),
              std::log(5.0), 1e-12);
}

// ---- the whole model (float), through the same code train_gpt runs ---------------------------

gpt::Config testConfig() {
  gpt::Config c;
  c.layers = 2, c.d_model = 8, c.heads = 2, c.context = 6, c.vocab = 256, c.seed = 7;
  return c;
}

// Initial values with every bias and norm moved off its init, so each gradient is exercised.
std::vector<std::vector<float>> testParams(const gpt::Config& c) {
  std::vector<std::vector<float>> p;
  std::mt19937 gen(17);
  std::uniform_real_distribution<float> u(-0.2f, 0.2f);
  for (int k = 0; k < static_cast<int>(gpt::units(c).size()); ++k) {
    p.push_back(gpt::initUnit(c, k));
    for (float& v : p.back()) v += u(gen);
  }
  return p;
}

TEST(GptModel, BackwardMatchesFiniteDifferences) {
  const gpt::Config c = testConfig();
  const auto us = gpt::units(c);
  auto params = testParams(c);
  const int B = 2, n = B * c.context;
  std::vector<int32_t> tokens(n), targets(n);
  for (int i = 0; i < n; ++i) tokens[i] = (37 * i + 5) % 11, targets[i] = (29 * i + 3) % 11;
  auto zeros = [&] {
    std::vector<std::vector<float>> g;
    for (auto& p : params) g.emplace_back(p.size(), 0.0f);
    return g;
  };
  gpt::Model model(c, false);
  auto grads = zeros();
  gpt::modelGradients(model, us, params, B, tokens.data(), targets.data(), 1.0f, &grads);
  auto loss = [&] {
    auto g = zeros();
    return static_cast<double>(
        gpt::modelGradients(model, us, params, B, tokens.data(), targets.data(), 1.0f, &g));
  };
  const float h = 1e-2f;
  int checked = 0;
  for (size_t u = 0; u < us.size(); ++u) {
    size_t off = 0;
    for (const hsdp::ParamSpec& s : us[u].params) {
      // Up to 8 elements per tensor; in wte only rows of tokens in the batch (others are 0).
      for (size_t k = 0; k < 8 && k < s.numel(); ++k) {
        size_t i = off + (k * 7919) % s.numel();
        if (u == gpt::kWte) i = static_cast<size_t>(tokens[k % n]) * c.d_model + k % c.d_model;
        const float keep = params[u][i];
        params[u][i] = keep + h;
        const double up = loss();
        params[u][i] = keep - h;
        const double down = loss();
        params[u][i] = keep;
        const double fd = (up - down) / (2 * h);
        EXPECT_NEAR(grads[u][i], fd, 2e-4 + 3e-2 * std::fabs(fd))
            << us[u].name << "." << s.name << " flat " << i;
        ++checked;
      }
      off += s.numel();
    }
  }
  EXPECT_GT(checked, 100);
  // Activation checkpointing recomputes each block's forward: the same gradients up to float
  // rounding (Eigen's vectorised small products and row sums may add in another order for
  // buffers at other addresses, so not always bit for bit).
  gpt::Model ckpt(c, true);
  auto grads2 = zeros();
  gpt::modelGradients(ckpt, us, params, B, tokens.data(), targets.data(), 1.0f, &grads2);
  for (size_t u = 0; u < grads.size(); ++u) {
    float scale = 0;
    for (float g : grads[u]) scale = std::max(scale, std::fabs(g));
    for (size_t i = 0; i < grads[u].size(); ++i)
      EXPECT_NEAR(grads2[u][i], grads[u][i], 1e-6f * scale) << us[u].name << " flat " << i;
  }
  EXPECT_LT(ckpt.activationBytes(), model.activationBytes());
}

TEST(GptModel, UnitsCarryGpt2Names) {
  const gpt::Config c = testConfig();
  const auto us = gpt::units(c);
  ASSERT_EQ(us.size(), 5u);
  EXPECT_EQ(us[0].name + "." + us[0].params[0].name, "wte.weight");
  EXPECT_EQ(us[1].name + "." + us[1].params[0].name, "wpe.weight");
  EXPECT_EQ(us[2].name + "." + us[2].params[2].name, "h.0.attn.c_attn.weight");
  EXPECT_EQ(us[2].params[2].shape, (std::vector<int64_t>{8, 24}));  // Conv1D [in, out]
  EXPECT_EQ(us[3].name + "." + us[3].params[11].name, "h.1.mlp.c_proj.bias");
  EXPECT_EQ(us[4].name + "." + us[4].params[1].name, "ln_f.bias");
  size_t total = 0;
  for (const auto& u : us)
    for (const auto& p : u.params) {
      total += p.numel();
      EXPECT_EQ(p.weight_decay, p.shape.size() == 2 && u.name.rfind("h.", 0) == 0) << p.name;
    }
  EXPECT_EQ(total, c.paramCount());
  EXPECT_EQ(gpt::unitOrder(c), (std::vector<int>{0, 1, 2, 3, 4, 0}));
  auto small = gpt::preset("small");
  ASSERT_TRUE(small.ok());
  EXPECT_NEAR(static_cast<double>(small->paramCount()), 10.8e6, 0.1e6);
}

TEST(GptData, SplitIsDeterministicAndDisjoint) {
  std::string text;
  for (int k = 0; k < 40; ++k) text += "entry " + std::to_string(k) + "\n%\n";
  const gpt::Corpus c = gpt::splitCorpus(text, 20);
  EXPECT_EQ(c.train_entries, 38u);
  EXPECT_EQ(c.val_entries, 2u);
  const std::string val(c.val.begin(), c.val.end());
  EXPECT_EQ(val, "entry 19\n%\nentry 39\n%\n");
  std::vector<int32_t> a(8), b(8), ta(8), tb(8);
  gpt::trainSequence(c, 1, 3, 5, 8, a.data(), ta.data());
  gpt::trainSequence(c, 1, 3, 5, 8, b.data(), tb.data());
  EXPECT_EQ(a, b);
  for (int i = 0; i + 1 < 8; ++i) EXPECT_EQ(ta[i], a[i + 1]);  // targets are the next bytes
}

TEST(GptData, MissingCorpusNamesThePath) {
  auto c = gpt::loadCorpus("/nonexistent/fortunes", 64);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/fortunes"), std::string::npos);
  EXPECT_NE(c.status().message().find("fortunes"), std::string::npos);
}

// A scratch directory removed at the end.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "gpt_data_XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void writeText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string entries(const char* tag, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += std::string(tag) + " entry " + std::to_string(i) + "\n%\n";
  return s;
}

// Only the directory's regular files are read: a symbolic link (to a file outside, or to a FIFO
// that would block an open) is skipped unopened, and so are *.dat indexes.
TEST(GptData, DirectoryReadsRegularFilesOnly) {
  TempDir outside, d;
  writeText(outside / "secret", entries("outside", 40));
  ASSERT_EQ(::mkfifo((outside / "fifo").c_str(), 0600), 0);
  writeText(d / "quotes", entries("inside", 40));
  writeText(d / "quotes.dat", entries("index", 40));
  std::filesystem::create_symlink(outside / "secret", d / "secret.u8");
  std::filesystem::create_symlink(outside / "fifo", d / "fifo.u8");
  auto c = gpt::loadCorpus(d.path.string(), 8);
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_EQ(c->files, 1);
  EXPECT_EQ(c->train_entries + c->val_entries, 40u);
  const std::string all =
      std::string(c->train.begin(), c->train.end()) + std::string(c->val.begin(), c->val.end());
  EXPECT_EQ(all.find("outside"), std::string::npos);
  EXPECT_EQ(all.find("index"), std::string::npos);
}

// A FIFO inside the directory is refused by name, unopened (an open would block).
TEST(GptData, FifoInDirectoryIsAnError) {
  TempDir d;
  writeText(d / "a", entries("inside", 40));
  ASSERT_EQ(::mkfifo((d / "b").c_str(), 0600), 0);
  auto c = gpt::loadCorpus(d.path.string(), 8);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), hsdp::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(d / "b"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("a FIFO"), std::string::npos) << c.status().message();
}

// --data naming a FIFO or a device: refused by what it is, nothing read (no hang, no unbounded
// read of /dev/zero).
TEST(GptData, FifoOrDeviceIsAnError) {
  TempDir d;
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  for (const std::string path : {d / "fifo", std::string("/dev/zero")}) {
    auto c = gpt::loadCorpus(path, 8);
    ASSERT_FALSE(c.ok()) << path;
    EXPECT_EQ(c.status().code(), hsdp::StatusCode::kInvalidArgument) << path;
    EXPECT_NE(c.status().message().find(path), std::string::npos) << c.status().message();
    EXPECT_NE(c.status().message().find("not a regular file"), std::string::npos)
        << c.status().message();
  }
}

// Over kMaxCorpusBytes, alone or together: refused before reading (sparse files: no disk used).
TEST(GptData, CorpusOverTheLimitIsAnError) {
  TempDir d;
  const std::string big = d / "big";
  writeText(big, "");
  std::filesystem::resize_file(big, gpt::kMaxCorpusBytes + 1);
  auto c = gpt::loadCorpus(big, 8);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(big), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find(std::to_string(gpt::kMaxCorpusBytes)), std::string::npos)
      << c.status().message();

  // Each file under the limit, the two together over it (the second is never read).
  TempDir two;
  writeText(two / "a", entries("inside", 40));
  writeText(two / "b", "");
  std::filesystem::resize_file(two / "b", gpt::kMaxCorpusBytes - 10);
  c = gpt::loadCorpus(two.path.string(), 8);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find(two / "b"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("over the limit"), std::string::npos) << c.status().message();
}

TEST(GptData, ReadsTheDebianCorpus) {
  if (!std::filesystem::exists(gpt::kDefaultCorpus)) GTEST_SKIP() << "fortunes not installed";
  auto c = gpt::loadCorpus(gpt::kDefaultCorpus, 128);
  ASSERT_TRUE(c.ok()) << c.status().toString();
  EXPECT_GT(c->train.size(), 1000000u);
  EXPECT_GT(c->val.size(), 50000u);
  EXPECT_GT(c->files, 10);
}

TEST(GptTraining, ScheduleWarmsUpThenDecays) {
  gpt::LrSchedule s{1e-3f, 1e-4f, 4, 20};
  EXPECT_FLOAT_EQ(s.at(0), 2.5e-4f);
  EXPECT_FLOAT_EQ(s.at(3), 1e-3f);
  EXPECT_FLOAT_EQ(s.at(4), 1e-3f);
  EXPECT_NEAR(s.at(12), 5.5e-4f, 1e-7);
  EXPECT_FLOAT_EQ(s.at(20), 1e-4f);
}

// One process, no engine: the reference trainer learns a repeated text (from the uniform
// log 256 = 5.55 to below the text's unigram entropy).
TEST(GptTraining, ReferenceLearnsText) {
  std::string text;
  for (int k = 0; k < 60; ++k) text += "the quick brown fox jumps over the lazy dog\n%\n";
  const gpt::Corpus corpus = gpt::splitCorpus(text, 20);
  gpt::Config c;
  c.layers = 2, c.d_model = 32, c.heads = 2, c.context = 16;
  gpt::TrainSettings s;
  s.adam.weight_decay = 0.1f;
  s.schedule = {3e-3f, 3e-4f, 5, 60};
  s.steps = 60;
  s.batch = 8;
  const gpt::ReferenceResult r = gpt::trainReference(c, corpus, s);
  ASSERT_EQ(r.losses.size(), 60u);
  EXPECT_NEAR(r.losses.front(), std::log(256.0), 0.2);
  // Below the text's unigram entropy (~2.9 nats): it learned more than byte frequencies.
  EXPECT_LT(r.losses.back(), 2.5);
}

}  // namespace
