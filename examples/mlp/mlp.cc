#include "mlp/mlp.h"

#include <cmath>

namespace mlp {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1), a pure function of its arguments (portable, order independent).
float uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = splitmix64(seed ^ splitmix64(a ^ splitmix64(b ^ splitmix64(c))));
  return static_cast<float>((h >> 40) * (1.0 / 8388608.0) - 1.0);
}

}  // namespace

size_t Spec::paramCount() const {
  size_t n = 0;
  for (int l = 0; l < layers(); ++l) n += static_cast<size_t>(dims[l + 1]) * (dims[l] + 1);
  return n;
}

Batch makeBatch(const Spec& spec, int64_t step, int first, int count) {
  const int in = spec.dims.front(), classes = spec.dims.back();
  Batch b;
  b.x.resize(in, count);
  b.labels.resize(count);
  for (int s = 0; s < count; ++s) {
    const uint64_t sample = static_cast<uint64_t>(first + s);
    for (int j = 0; j < in; ++j) b.x(j, s) = 1.7f * uniform(spec.seed, 1 + step, sample, j);
    // Label from a fixed random linear teacher: a learnable task.
    int best = 0;
    float best_v = -1e30f;
    for (int c = 0; c < classes; ++c) {
      float v = 0.0f;
      for (int j = 0; j < in; ++j) v += uniform(spec.seed, 0, 1000 + c, j) * b.x(j, s);
      if (v > best_v) best_v = v, best = c;
    }
    b.labels[s] = best;
  }
  return b;
}

void initLayer(const Spec& spec, int l, std::vector<float>* weight, std::vector<float>* bias) {
  const int in = spec.dims[l], out = spec.dims[l + 1];
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));  // PyTorch's nn.Linear default
  weight->resize(static_cast<size_t>(out) * in);
  bias->resize(out);
  for (size_t i = 0; i < weight->size(); ++i)
    (*weight)[i] = bound * uniform(spec.seed, 2000 + l, 0, i);
  for (int i = 0; i < out; ++i) (*bias)[i] = bound * uniform(spec.seed, 2000 + l, 1, i);
}

void linearForward(const float* W, const float* b, int out, int in, const Matrix& x, Matrix* y) {
  Eigen::Map<const Matrix> w(W, out, in);
  Eigen::Map<const Eigen::VectorXf> bias(b, out);
  *y = w * x;
  y->colwise() += bias;
}

void linearBackward(const float* W, int out, int in, const Matrix& x, const Matrix& dy, float* dW,
                    float* db, Matrix* dx) {
  Eigen::Map<Matrix> dw(dW, out, in);
  Eigen::Map<Eigen::VectorXf> dbias(db, out);
  dw.noalias() += dy * x.transpose();  // accumulates: gradient buffers start at zero
  dbias += dy.rowwise().sum();
  if (dx != nullptr) {
    Eigen::Map<const Matrix> w(W, out, in);
    *dx = w.transpose() * dy;
  }
}

float crossEntropy(const Matrix& logits, const std::vector<int>& labels, Matrix* dlogits) {
  const int n = static_cast<int>(logits.cols());
  *dlogits = Matrix(logits.rows(), n);
  double loss = 0.0;
  for (int s = 0; s < n; ++s) {
    const float mx = logits.col(s).maxCoeff();
    Eigen::VectorXf e = (logits.col(s).array() - mx).exp();
    const float z = e.sum();
    loss += std::log(z) + mx - logits(labels[s], s);
    dlogits->col(s) = e / z;
    (*dlogits)(labels[s], s) -= 1.0f;
  }
  *dlogits /= static_cast<float>(n);
  return static_cast<float>(loss / n);
}

}  // namespace mlp
