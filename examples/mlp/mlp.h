// The example model: an MLP of linear layers (weight out x in, bias out) with tanh between them
// and softmax cross-entropy on top, trained on a deterministic synthetic classification task.
// The math is plain Eigen on raw pointers, so the same functions run on hsdp's gathered unit
// buffers and in the single-process reference. tanh (not ReLU) keeps the loss smooth, so
// rounding differences between the sharded run and the reference stay rounding-sized.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <vector>

namespace mlp {

using Matrix = Eigen::MatrixXf;  // column-major; activations are features x batch

struct Spec {
  std::vector<int> dims = {32, 1000, 333, 128, 10};  // input, hidden..., classes
  uint64_t seed = 1234;
  int layers() const { return static_cast<int>(dims.size()) - 1; }
  size_t paramCount() const;
};

struct Batch {
  Matrix x;                 // dims[0] x n
  std::vector<int> labels;  // n
};

// Samples [first, first+count) of the global batch of `step`; identical on every rank.
Batch makeBatch(const Spec& spec, int64_t step, int first, int count);

// Deterministic initial weight (out x in, column-major) and bias of layer `l`.
void initLayer(const Spec& spec, int l, std::vector<float>* weight, std::vector<float>* bias);

// y = W x + b
void linearForward(const float* W, const float* b, int out, int in, const Matrix& x, Matrix* y);
// Given dy = dL/dy: dW += dy x^T, db += row sums of dy (added, so micro-batches accumulate
// into a zeroed buffer), dx = W^T dy (dx may be null).
void linearBackward(const float* W, int out, int in, const Matrix& x, const Matrix& dy, float* dW,
                    float* db, Matrix* dx);

// Mean cross-entropy over the batch's columns and its gradient dL/dlogits.
float crossEntropy(const Matrix& logits, const std::vector<int>& labels, Matrix* dlogits);

}  // namespace mlp
