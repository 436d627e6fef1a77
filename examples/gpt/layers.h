// The GPT's layers on the CPU, written with Eigen: each one a forward and a fused backward on
// column-major matrices of features x tokens (column t is token t; B sequences of T tokens are
// B*T columns, sequence-major). The same functions run on the engine's gathered unit buffers
// (train_gpt) and in the single-process reference (gpt/reference.h), and the finite-difference
// tests (tests/examples/gpt_grad_test.cc) check every backward against its forward.
//
// A weight of `in` inputs and `out` outputs is the GPT-2 Conv1D tensor [in, out] (row-major, as
// GPT-2 checkpoints store it), which is the same memory as the column-major out x in matrix W,
// so y = W x + b is one GEMM on the parameter buffer in place. Backward functions ADD into the
// parameter gradients (the engine's gradient buffers start at zero and accumulate over
// micro-steps and over the two uses of the tied embedding).
#pragma once

#include <Eigen/Dense>
#include <cstdint>

namespace gpt {

using Matrix = Eigen::MatrixXf;  // column-major
using Vector = Eigen::VectorXf;
// The layers are templates on the scalar: float for training, double for the finite-difference
// tests (instantiated for both in layers.cc).
template <typename S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic>;
template <typename S>
using Vec = Eigen::Matrix<S, Eigen::Dynamic, 1>;

constexpr float kLayerNormEps = 1e-5f;

// y = W x + b (y resized to out x cols).
template <typename S>
void linearForward(const S* W, const S* b, int in, int out, const Mat<S>& x, Mat<S>* y);
// dW += dy x^T, db += row sums of dy; dx = W^T dy when dx is not null.
template <typename S>
void linearBackward(const S* W, int in, int out, const Mat<S>& x, const Mat<S>& dy, S* dW, S* db,
                    Mat<S>* dx);

// LayerNorm over each column: y = (x - mean) * rstd * g + b, rstd = 1/sqrt(var + eps); the
// column means and rstds are kept for backward.
template <typename S>
void layerNormForward(const S* g, const S* b, const Mat<S>& x, Mat<S>* y, Vec<S>* mean,
                      Vec<S>* rstd);
// Fused backward from the saved statistics: dg += sum_t dy*xhat, db += sum_t dy, and the input
// gradient ADDED into *dx (the residual stream's gradient already there).
template <typename S>
void layerNormBackward(const S* g, const Mat<S>& x, const Vec<S>& mean, const Vec<S>& rstd,
                       const Mat<S>& dy, S* dg, S* db, Mat<S>* dx);

// GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename S>
void geluForward(const Mat<S>& x, Mat<S>* y);
// *dy_to_dx: on entry dL/dy, on return dL/dx (in place).
template <typename S>
void geluBackward(const Mat<S>& x, Mat<S>* dy_to_dx);

// Causal multi-head self-attention over B sequences of T tokens with H heads. qkv (3d x B*T) is
// the fused projection: rows [0, d) the queries, [d, 2d) the keys, [2d, 3d) the values, head h
// owning rows [h*hd, (h+1)*hd) of each (hd = d / H). Scores K^T Q / sqrt(hd), softmax over the
// keys j <= i of query i. *probs (T x T*B*H; block b*H+h holds sequence b, head h, column i =
// query i) is kept for backward; *y is d x B*T.
template <typename S>
void attentionForward(const Mat<S>& qkv, int B, int T, int H, Mat<S>* probs, Mat<S>* y);
// Fused backward: dqkv (3d x B*T) from dy, the saved probabilities and qkv; *scratch is a T x T
// work matrix reused across heads.
template <typename S>
void attentionBackward(const Mat<S>& qkv, const Mat<S>& probs, const Mat<S>& dy, int B, int T,
                       int H, Mat<S>* dqkv, Mat<S>* scratch);

// Token embedding x.col(t) = table.col(tokens[t]) (table d x V: GPT-2's wte [V, d]).
template <typename S>
void embedForward(const S* table, int d, const int32_t* tokens, int n, Mat<S>* x);
// dtable.col(tokens[t]) += dx.col(t).
template <typename S>
void embedBackward(const Mat<S>& dx, const int32_t* tokens, S* dtable);
// Position embedding x.col(b*T + p) += wpe.col(p) (wpe d x context: GPT-2's wpe [context, d]).
template <typename S>
void positionForward(const S* wpe, int B, int T, Mat<S>* x);
template <typename S>
void positionBackward(const Mat<S>& dx, int B, int T, S* dwpe);

// Softmax cross-entropy over the columns of logits (V x n): returns the mean loss and, when
// dlogits is not null, dlogits = grad_scale * d(mean loss)/dlogits.
template <typename S>
S crossEntropy(const Mat<S>& logits, const int32_t* targets, S grad_scale, Mat<S>* dlogits);

}  // namespace gpt
