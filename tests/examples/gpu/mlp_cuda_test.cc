// The GPU example's MLP functions (examples/gpu/mlp_cuda.h) against the Eigen functions they
// mirror (examples/mlp/mlp.h), on random data at odd sizes (1, 7, 333 in every role: rows,
// inner dimension, batch), within 1e-5 of each tensor's scale (max|gpu - eigen| / max|eigen|).
// Argument validation runs without a device; everything else skips without one.
#include "gpu/mlp_cuda.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "collectives/nccl/cuda_resources.h"
#include "mlp/mlp.h"
#include "tests/common/gpu_test.h"

namespace hsdp {
namespace {

constexpr double kTolerance = 1e-5;
const int kSizes[] = {1, 7, 333};

// max|a - b| / max|b| (0 / 0 = 0: both all-zero is agreement).
double relErr(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

std::vector<float> randomVec(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

mlp::Matrix toMatrix(const std::vector<float>& v, int rows, int cols) {
  return Eigen::Map<const mlp::Matrix>(v.data(), rows, cols);
}

// A device copy of host data, and back. Test plumbing: failures stop the test.
struct Dev {
  gpu::DeviceBuffer buf;
  size_t n = 0;
  float* f() const { return buf.as<float>(); }
  int* i() const { return buf.as<int>(); }
};

Dev upload(const void* host, size_t bytes) {
  Dev d;
  auto b = gpu::DeviceBuffer::allocate(std::max<size_t>(bytes, 4));
  EXPECT_TRUE(b.ok()) << b.status().toString();
  if (!b.ok()) return d;
  d.buf = std::move(*b);
  d.n = bytes;
  if (bytes) EXPECT_EQ(cudaMemcpy(d.buf.data(), host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
Dev upload(const std::vector<float>& v) { return upload(v.data(), v.size() * 4); }
Dev upload(const std::vector<int>& v) { return upload(v.data(), v.size() * 4); }
Dev zeros(size_t floats) { return upload(std::vector<float>(floats, 0.0f)); }

std::vector<float> download(const Dev& d, size_t floats) {
  std::vector<float> v(floats);
  EXPECT_EQ(cudaMemcpy(v.data(), d.buf.data(), floats * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

class MlpCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HSDP_REQUIRE_GPU();
    // Why a stream of its own: the functions take the caller's stream, and a non-blocking one
    // (not the legacy default stream) is what train_mlp_gpu gives them.
    auto s = gpu::Stream::create("mlp-cuda-test");
    ASSERT_TRUE(s.ok()) << s.status().toString();
    stream_ = std::move(*s);
    auto b = mlp::cuda::Cublas::create(stream_.get());
    ASSERT_TRUE(b.ok()) << b.status().toString();
    blas_ = std::move(*b);
  }
  // The functions only enqueue; the test waits before reading results back.
  void sync() { ASSERT_EQ(cudaStreamSynchronize(stream_.get()), cudaSuccess); }

  gpu::Stream stream_;
  mlp::cuda::Cublas blas_;
};

TEST_F(MlpCudaTest, HandleIsPedanticOnItsStream) {
  cublasMath_t mode;
  ASSERT_EQ(cublasGetMathMode(blas_.get(), &mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(mode & 0xf, CUBLAS_PEDANTIC_MATH);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cublasGetStream(blas_.get(), &s), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(s, stream_.get());
}

TEST_F(MlpCudaTest, LinearForwardMatchesEigen) {
  std::mt19937 rng(1);
  for (int out : kSizes)
    for (int in : kSizes)
      for (int n : kSizes) {
        SCOPED_TRACE(testing::Message() << "out=" << out << " in=" << in << " n=" << n);
        auto W = randomVec(size_t(out) * in, rng), b = randomVec(out, rng),
             x = randomVec(size_t(in) * n, rng);
        mlp::Matrix ref;
        mlp::linearForward(W.data(), b.data(), out, in, toMatrix(x, in, n), &ref);
        Dev dW = upload(W), db = upload(b), dx = upload(x);
        // y starts as garbage (NaN): beta = 0 must not read it.
        Dev dy = upload(std::vector<float>(size_t(out) * n, std::nanf("")));
        ASSERT_OK(mlp::cuda::linearForward(blas_, dW.f(), db.f(), out, in, dx.f(), n, dy.f()));
        sync();
        auto y = download(dy, size_t(out) * n);
        EXPECT_LE(relErr(y.data(), ref.data(), y.size()), kTolerance);
      }
}

TEST_F(MlpCudaTest, LinearBackwardMatchesEigenAndAccumulates) {
  std::mt19937 rng(2);
  for (int out : kSizes)
    for (int in : kSizes)
      for (int n : kSizes)
        for (bool want_dx : {true, false}) {
          SCOPED_TRACE(testing::Message()
                       << "out=" << out << " in=" << in << " n=" << n << " dx=" << want_dx);
          auto W = randomVec(size_t(out) * in, rng), x = randomVec(size_t(in) * n, rng),
               dy = randomVec(size_t(out) * n, rng);
          // Gradient buffers already hold a micro-step's gradient: the call adds to them.
          auto gW0 = randomVec(size_t(out) * in, rng, 0.1f), gb0 = randomVec(out, rng, 0.1f);
          std::vector<float> refW = gW0, refb = gb0;
          mlp::Matrix ref_dx;
          mlp::linearBackward(W.data(), out, in, toMatrix(x, in, n), toMatrix(dy, out, n),
                              refW.data(), refb.data(), want_dx ? &ref_dx : nullptr);
          Dev dW = upload(W), dX = upload(x), dDy = upload(dy), gW = upload(gW0), gb = upload(gb0);
          Dev gx = upload(std::vector<float>(size_t(in) * n, std::nanf("")));
          ASSERT_OK(mlp::cuda::linearBackward(blas_, dW.f(), out, in, dX.f(), dDy.f(), n, gW.f(),
                                              gb.f(), want_dx ? gx.f() : nullptr));
          sync();
          auto w = download(gW, refW.size()), b = download(gb, refb.size()),
               xg = download(gx, size_t(in) * n);
          EXPECT_LE(relErr(w.data(), refW.data(), w.size()), kTolerance);
          EXPECT_LE(relErr(b.data(), refb.data(), b.size()), kTolerance);
          if (want_dx) {
            EXPECT_LE(relErr(xg.data(), ref_dx.data(), xg.size()), kTolerance);
          } else {
            for (float v : xg) ASSERT_TRUE(std::isnan(v)) << "dx written although null";
          }
        }
}

TEST_F(MlpCudaTest, TanhForwardAndBackwardMatchEigen) {
  std::mt19937 rng(3);
  for (int rows : kSizes)
    for (int n : kSizes) {
      SCOPED_TRACE(testing::Message() << rows << " x " << n);
      const size_t count = size_t(rows) * n;
      auto z = randomVec(count, rng, 2.0f), dx = randomVec(count, rng);
      mlp::Matrix a_ref = toMatrix(z, rows, n).array().tanh();
      mlp::Matrix dz_ref =
          (toMatrix(dx, rows, n).array() * (1.0f - a_ref.array().square())).matrix();
      // In place, as the training loop does it (z's buffer becomes a).
      Dev dzA = upload(z), dDx = upload(dx), dDz = zeros(count);
      ASSERT_OK(mlp::cuda::tanhForward(dzA.f(), dzA.f(), count, stream_.get()));
      ASSERT_OK(mlp::cuda::tanhBackward(dDx.f(), dzA.f(), dDz.f(), count, stream_.get()));
      sync();
      auto a = download(dzA, count), dz = download(dDz, count);
      EXPECT_LE(relErr(a.data(), a_ref.data(), count), kTolerance);
      EXPECT_LE(relErr(dz.data(), dz_ref.data(), count), kTolerance);
      // Element-wise as well: tanh is within a few ulp everywhere, not just near the maximum.
      for (size_t i = 0; i < count; ++i)
        ASSERT_NEAR(a[i], a_ref.data()[i], 1e-6 * std::max(1.0f, std::fabs(a_ref.data()[i])));
    }
}

TEST_F(MlpCudaTest, CrossEntropyMatchesEigen) {
  std::mt19937 rng(4);
  for (int classes : kSizes)
    for (int n : kSizes)
      for (float divisor : {1.0f, 3.0f}) {
        SCOPED_TRACE(testing::Message()
                     << "classes=" << classes << " n=" << n << " divisor=" << divisor);
        auto logits = randomVec(size_t(classes) * n, rng, 3.0f);
        std::vector<int> labels(n);
        std::uniform_int_distribution<int> pick(0, classes - 1);
        for (int& l : labels) l = pick(rng);
        mlp::Matrix dref;
        const float loss_ref = mlp::crossEntropy(toMatrix(logits, classes, n), labels, &dref);
        dref /= divisor;  // the training loop's `dz /= accum`
        Dev dl = upload(logits), dlab = upload(labels), dd = zeros(dref.size()), col = zeros(n),
            loss = zeros(1);
        ASSERT_OK(mlp::cuda::crossEntropy(dl.f(), dlab.i(), classes, n, dd.f(), col.f(), loss.f(),
                                          stream_.get(), divisor));
        sync();
        auto d = download(dd, dref.size()), l = download(loss, 1);
        EXPECT_LE(relErr(d.data(), dref.data(), d.size()), kTolerance);
        EXPECT_LE(std::fabs(l[0] - loss_ref), kTolerance * std::max(1.0f, std::fabs(loss_ref)))
            << "loss " << l[0] << " vs " << loss_ref;
      }
}

// The functions composed as train_mlp_gpu composes them (in-place tanh, the dz/dx ping-pong
// through the tanh derivative, accumulation over two micro-batches with the 1/accum divisor)
// against train_mlp's Eigen loop: the full gradient of a small odd-sized MLP and the losses.
TEST_F(MlpCudaTest, TwoMicroStepGradientMatchesEigenLoop) {
  mlp::Spec spec;
  spec.dims = {7, 333, 1, 7, 5};
  const int L = spec.layers(), n = 7, accum = 2;
  std::vector<std::vector<float>> W(L), b(L);
  for (int l = 0; l < L; ++l) mlp::initLayer(spec, l, &W[l], &b[l]);
  // Eigen: train_mlp's microStep, twice, gradients accumulating.
  std::vector<std::vector<float>> gW(L), gb(L);
  for (int l = 0; l < L; ++l) {
    gW[l].assign(W[l].size(), 0.0f);
    gb[l].assign(b[l].size(), 0.0f);
  }
  float loss_ref[accum];
  std::vector<mlp::Batch> batches;
  for (int k = 0; k < accum; ++k) {
    batches.push_back(mlp::makeBatch(spec, 3, k * n, n));
    std::vector<mlp::Matrix> acts(L + 1);
    acts[0] = batches[k].x;
    for (int l = 0; l < L; ++l) {
      mlp::Matrix z;
      mlp::linearForward(W[l].data(), b[l].data(), spec.dims[l + 1], spec.dims[l], acts[l], &z);
      acts[l + 1] = l + 1 < L ? mlp::Matrix(z.array().tanh()) : z;
    }
    mlp::Matrix dz;
    loss_ref[k] = mlp::crossEntropy(acts[L], batches[k].labels, &dz);
    dz /= static_cast<float>(accum);
    for (int l = L - 1; l >= 0; --l) {
      mlp::Matrix dx;
      mlp::linearBackward(W[l].data(), spec.dims[l + 1], spec.dims[l], acts[l], dz, gW[l].data(),
                          gb[l].data(), l > 0 ? &dx : nullptr);
      if (l > 0) dz = (dx.array() * (1.0f - acts[l].array().square())).matrix();
    }
  }
  // Device: the same loop with train_mlp_gpu's buffers.
  std::vector<Dev> dW, db, dgW, dgb, acts(L + 1);
  for (int l = 0; l < L; ++l) {
    dW.push_back(upload(W[l]));
    db.push_back(upload(b[l]));
    dgW.push_back(zeros(W[l].size()));
    dgb.push_back(zeros(b[l].size()));
    acts[l + 1] = zeros(size_t(spec.dims[l + 1]) * n);
  }
  Dev dz = zeros(size_t(333) * n), dx = zeros(size_t(333) * n), col = zeros(n),
      losses = zeros(accum);
  for (int k = 0; k < accum; ++k) {
    Dev x = upload(std::vector<float>(batches[k].x.data(), batches[k].x.data() + 7 * n));
    Dev labels = upload(batches[k].labels);
    auto input = [&](int l) { return l == 0 ? x.f() : acts[l].f(); };
    for (int l = 0; l < L; ++l) {
      const int in = spec.dims[l], out = spec.dims[l + 1];
      ASSERT_OK(mlp::cuda::linearForward(blas_, dW[l].f(), db[l].f(), out, in, input(l), n,
                                         acts[l + 1].f()));
      if (l + 1 < L)
        ASSERT_OK(mlp::cuda::tanhForward(acts[l + 1].f(), acts[l + 1].f(), size_t(out) * n,
                                         stream_.get()));
    }
    ASSERT_OK(mlp::cuda::crossEntropy(acts[L].f(), labels.i(), spec.dims[L], n, dz.f(), col.f(),
                                      losses.f() + k, stream_.get(), float(accum)));
    for (int l = L - 1; l >= 0; --l) {
      const int in = spec.dims[l], out = spec.dims[l + 1];
      ASSERT_OK(mlp::cuda::linearBackward(blas_, dW[l].f(), out, in, input(l), dz.f(), n,
                                          dgW[l].f(), dgb[l].f(), l > 0 ? dx.f() : nullptr));
      if (l > 0)
        ASSERT_OK(
            mlp::cuda::tanhBackward(dx.f(), acts[l].f(), dz.f(), size_t(in) * n, stream_.get()));
    }
    sync();  // x and labels are freed at the end of this iteration
  }
  auto l = download(losses, accum);
  for (int k = 0; k < accum; ++k)
    EXPECT_NEAR(l[k], loss_ref[k], kTolerance * std::max(1.0f, std::fabs(loss_ref[k])));
  for (int li = 0; li < L; ++li) {
    SCOPED_TRACE(testing::Message() << "layer " << li);
    auto w = download(dgW[li], gW[li].size()), bb = download(dgb[li], gb[li].size());
    EXPECT_LE(relErr(w.data(), gW[li].data(), w.size()), kTolerance);
    EXPECT_LE(relErr(bb.data(), gb[li].data(), bb.size()), kTolerance);
  }
}

TEST_F(MlpCudaTest, CrossEntropyBadLabelPoisonsLossOnly) {
  const int classes = 7, n = 3;
  std::mt19937 rng(5);
  auto logits = randomVec(size_t(classes) * n, rng);
  std::vector<int> labels = {2, classes, 0};  // column 1's label is out of range
  Dev dl = upload(logits), dlab = upload(labels), dd = zeros(size_t(classes) * n), col = zeros(n),
      loss = zeros(1);
  ASSERT_OK(mlp::cuda::crossEntropy(dl.f(), dlab.i(), classes, n, dd.f(), col.f(), loss.f(),
                                    stream_.get()));
  sync();
  auto d = download(dd, size_t(classes) * n), l = download(loss, 1), c = download(col, n);
  EXPECT_TRUE(std::isnan(l[0]));
  EXPECT_TRUE(std::isnan(c[1]));
  EXPECT_FALSE(std::isnan(c[0]));
  for (int r = 0; r < classes; ++r) EXPECT_EQ(d[classes + r], 0.0f);
}

// Validation happens before anything touches the device: these run without one.
TEST(MlpCudaArgs, BadArgumentsAreInvalidArgumentWithoutEnqueueing) {
  mlp::cuda::Cublas none;
  float f = 0;
  int label = 0;
  auto expectInvalid = [](const Status& s, const char* needle) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.toString();
    EXPECT_NE(s.toString().find(needle), std::string::npos) << s.toString();
  };
  expectInvalid(mlp::cuda::linearForward(none, &f, &f, 0, 1, &f, 1, &f), "out = 0");
  expectInvalid(mlp::cuda::linearForward(none, &f, &f, 1, 1, &f, 1, &f), "cuBLAS handle");
  expectInvalid(mlp::cuda::linearBackward(none, &f, 1, -3, &f, &f, 1, &f, &f, nullptr), "in = -3");
  expectInvalid(mlp::cuda::tanhForward(nullptr, &f, 5, nullptr), "z is null");
  expectInvalid(mlp::cuda::tanhBackward(&f, nullptr, &f, 5, nullptr), "a is null");
  expectInvalid(mlp::cuda::crossEntropy(&f, &label, 1, 1, &f, &f, nullptr, nullptr),
                "loss is null");
  expectInvalid(mlp::cuda::crossEntropy(&f, &label, 1, 1, &f, &f, &f, nullptr, 0.0f),
                "grad_divisor");
  expectInvalid(mlp::cuda::crossEntropy(&f, &label, 0, 1, &f, &f, &f, nullptr), "classes = 0");
  EXPECT_OK(mlp::cuda::tanhForward(nullptr, nullptr, 0, nullptr));  // empty: nothing to do
}

}  // namespace
}  // namespace hsdp
