#include "gpt/layers.h"

#include <cmath>

namespace gpt {

template <typename S>
using CMap = Eigen::Map<const Mat<S>>;
template <typename S>
using Map = Eigen::Map<Mat<S>>;
template <typename S>
using CVecMap = Eigen::Map<const Vec<S>>;
template <typename S>
using VecMap = Eigen::Map<Vec<S>>;

template <typename S>
void linearForward(const S* W, const S* b, int in, int out, const Mat<S>& x, Mat<S>* y) {
  y->resize(out, x.cols());
  y->noalias() = CMap<S>(W, out, in) * x;
  y->colwise() += CVecMap<S>(b, out);
}

template <typename S>
void linearBackward(const S* W, int in, int out, const Mat<S>& x, const Mat<S>& dy, S* dW, S* db,
                    Mat<S>* dx) {
  Map<S>(dW, out, in).noalias() += dy * x.transpose();
  VecMap<S>(db, out) += dy.rowwise().sum();
  if (dx != nullptr) {
    dx->resize(in, dy.cols());
    dx->noalias() = CMap<S>(W, out, in).transpose() * dy;
  }
}

template <typename S>
void layerNormForward(const S* g, const S* b, const Mat<S>& x, Mat<S>* y, Vec<S>* mean,
                      Vec<S>* rstd) {
  const Eigen::Index d = x.rows(), n = x.cols();
  y->resize(d, n);
  mean->resize(n);
  rstd->resize(n);
  const auto gamma = CVecMap<S>(g, d).array();
  const auto beta = CVecMap<S>(b, d).array();
  for (Eigen::Index t = 0; t < n; ++t) {
    const S m = x.col(t).mean();
    const S var = (x.col(t).array() - m).square().sum() / static_cast<S>(d);
    const S r = S(1) / std::sqrt(var + kLayerNormEps);
    (*mean)(t) = m;
    (*rstd)(t) = r;
    y->col(t).array() = (x.col(t).array() - m) * r * gamma + beta;
  }
}

template <typename S>
void layerNormBackward(const S* g, const Mat<S>& x, const Vec<S>& mean, const Vec<S>& rstd,
                       const Mat<S>& dy, S* dg, S* db, Mat<S>* dx) {
  const Eigen::Index d = x.rows(), n = x.cols();
  const auto gamma = CVecMap<S>(g, d).array();
  auto dgamma = VecMap<S>(dg, d).array();
  auto dbeta = VecMap<S>(db, d).array();
  Eigen::Array<S, Eigen::Dynamic, 1> xhat(d), dxhat(d);
  for (Eigen::Index t = 0; t < n; ++t) {
    xhat = (x.col(t).array() - mean(t)) * rstd(t);
    dxhat = dy.col(t).array() * gamma;
    dgamma += dy.col(t).array() * xhat;
    dbeta += dy.col(t).array();
    const S m1 = dxhat.mean();
    const S m2 = (dxhat * xhat).mean();
    dx->col(t).array() += rstd(t) * (dxhat - m1 - xhat * m2);
  }
}

namespace {
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;
}  // namespace

template <typename S>
void geluForward(const Mat<S>& x, Mat<S>* y) {
  const S k = static_cast<S>(kGeluK), c = static_cast<S>(kGeluC);
  y->resize(x.rows(), x.cols());
  const auto a = x.array();
  y->array() = S(0.5) * a * (S(1) + (k * (a + c * a.cube())).tanh());
}

template <typename S>
void geluBackward(const Mat<S>& x, Mat<S>* dy_to_dx) {
  const S k = static_cast<S>(kGeluK), c = static_cast<S>(kGeluC);
  const auto a = x.array();
  // One pass: d/dx = 0.5 (1 + th) + 0.5 x (1 - th^2) k (1 + 3 c x^2), th = tanh(k (x + c x^3)).
  // Eigen evaluates the repeated th per use; recomputing it beats a second 4d x N buffer.
  const auto th = (k * (a + c * a.cube())).tanh();
  dy_to_dx->array() *=
      S(0.5) * (S(1) + th) + S(0.5) * a * (S(1) - th.square()) * k * (S(1) + S(3) * c * a.square());
}

template <typename S>
void attentionForward(const Mat<S>& qkv, int B, int T, int H, Mat<S>* probs, Mat<S>* y) {
  const int d = static_cast<int>(qkv.rows()) / 3, hd = d / H;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  probs->resize(T, static_cast<Eigen::Index>(T) * B * H);
  y->resize(d, static_cast<Eigen::Index>(B) * T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const auto q = qkv.block(h * hd, b * T, hd, T);
      const auto k = qkv.block(d + h * hd, b * T, hd, T);
      const auto v = qkv.block(2 * d + h * hd, b * T, hd, T);
      auto p = probs->middleCols(static_cast<Eigen::Index>(b * H + h) * T, T);
      p.noalias() = k.transpose() * q;  // p(j, i) = k_j . q_i
      for (int i = 0; i < T; ++i) {
        auto s = p.col(i).head(i + 1).array();
        const S mx = s.maxCoeff();
        s = ((s - mx) * scale).exp();
        s /= s.sum();
        p.col(i).tail(T - i - 1).setZero();  // the causal mask: query i sees keys j <= i
      }
      y->block(h * hd, b * T, hd, T).noalias() = v * p;
    }
  }
}

template <typename S>
void attentionBackward(const Mat<S>& qkv, const Mat<S>& probs, const Mat<S>& dy, int B, int T,
                       int H, Mat<S>* dqkv, Mat<S>* scratch) {
  const int d = static_cast<int>(qkv.rows()) / 3, hd = d / H;
  const S scale = S(1) / std::sqrt(static_cast<S>(hd));
  dqkv->resize(3 * d, static_cast<Eigen::Index>(B) * T);
  scratch->resize(T, T);
  Mat<S>& ds = *scratch;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const auto q = qkv.block(h * hd, b * T, hd, T);
      const auto k = qkv.block(d + h * hd, b * T, hd, T);
      const auto v = qkv.block(2 * d + h * hd, b * T, hd, T);
      const auto p = probs.middleCols(static_cast<Eigen::Index>(b * H + h) * T, T);
      const auto dout = dy.block(h * hd, b * T, hd, T);
      dqkv->block(2 * d + h * hd, b * T, hd, T).noalias() = dout * p.transpose();  // dV
      ds.noalias() = v.transpose() * dout;                                         // dP
      // Softmax backward along each query's column: dS = P * (dP - <P, dP>), scaled.
      for (int i = 0; i < T; ++i) {
        auto pi = p.col(i).head(i + 1).array();
        auto di = ds.col(i).head(i + 1).array();
        const S dot = (pi * di).sum();
        di = pi * (di - dot) * scale;
        ds.col(i).tail(T - i - 1).setZero();
      }
      dqkv->block(h * hd, b * T, hd, T).noalias() = k * ds;                  // dQ
      dqkv->block(d + h * hd, b * T, hd, T).noalias() = q * ds.transpose();  // dK
    }
  }
}

template <typename S>
void embedForward(const S* table, int d, const int32_t* tokens, int n, Mat<S>* x) {
  x->resize(d, n);
  for (int t = 0; t < n; ++t) x->col(t) = CVecMap<S>(table + static_cast<size_t>(tokens[t]) * d, d);
}

template <typename S>
void embedBackward(const Mat<S>& dx, const int32_t* tokens, S* dtable) {
  const Eigen::Index d = dx.rows();
  for (Eigen::Index t = 0; t < dx.cols(); ++t)
    VecMap<S>(dtable + static_cast<size_t>(tokens[t]) * d, d) += dx.col(t);
}

template <typename S>
void positionForward(const S* wpe, int B, int T, Mat<S>* x) {
  const Eigen::Index d = x->rows();
  for (int b = 0; b < B; ++b)
    x->middleCols(static_cast<Eigen::Index>(b) * T, T) += CMap<S>(wpe, d, T);
}

template <typename S>
void positionBackward(const Mat<S>& dx, int B, int T, S* dwpe) {
  const Eigen::Index d = dx.rows();
  for (int b = 0; b < B; ++b)
    Map<S>(dwpe, d, T) += dx.middleCols(static_cast<Eigen::Index>(b) * T, T);
}

template <typename S>
S crossEntropy(const Mat<S>& logits, const int32_t* targets, S grad_scale, Mat<S>* dlogits) {
  const Eigen::Index n = logits.cols();
  if (dlogits != nullptr) dlogits->resize(logits.rows(), n);
  double loss = 0.0;
  const S g = grad_scale / static_cast<S>(n);
  for (Eigen::Index t = 0; t < n; ++t) {
    const S mx = logits.col(t).maxCoeff();
    const S z = (logits.col(t).array() - mx).exp().sum();
    loss += std::log(z) + mx - logits(targets[t], t);
    if (dlogits != nullptr) {
      dlogits->col(t).array() = (logits.col(t).array() - mx).exp() * (g / z);
      (*dlogits)(targets[t], t) -= g;
    }
  }
  return static_cast<S>(loss / static_cast<double>(n));
}

#define GPT_INSTANTIATE(S)                                                                         \
  template void linearForward(const S*, const S*, int, int, const Mat<S>&, Mat<S>*);               \
  template void linearBackward(const S*, int, int, const Mat<S>&, const Mat<S>&, S*, S*, Mat<S>*); \
  template void layerNormForward(const S*, const S*, const Mat<S>&, Mat<S>*, Vec<S>*, Vec<S>*);    \
  template void layerNormBackward(const S*, const Mat<S>&, const Vec<S>&, const Vec<S>&,           \
                                  const Mat<S>&, S*, S*, Mat<S>*);                                 \
  template void geluForward(const Mat<S>&, Mat<S>*);                                               \
  template void geluBackward(const Mat<S>&, Mat<S>*);                                              \
  template void attentionForward(const Mat<S>&, int, int, int, Mat<S>*, Mat<S>*);                  \
  template void attentionBackward(const Mat<S>&, const Mat<S>&, const Mat<S>&, int, int, int,      \
                                  Mat<S>*, Mat<S>*);                                               \
  template void embedForward(const S*, int, const int32_t*, int, Mat<S>*);                         \
  template void embedBackward(const Mat<S>&, const int32_t*, S*);                                  \
  template void positionForward(const S*, int, int, Mat<S>*);                                      \
  template void positionBackward(const Mat<S>&, int, int, S*);                                     \
  template S crossEntropy(const Mat<S>&, const int32_t*, S, Mat<S>*);
GPT_INSTANTIATE(float)
GPT_INSTANTIATE(double)
#undef GPT_INSTANTIATE

}  // namespace gpt
