// The example MLP's math on a CUDA device: the same functions as examples/mlp/mlp.h, with the
// same semantics, on device buffers. Matrices are column-major float32 with activations
// features x batch (so one sample is one contiguous column), exactly as the Eigen versions.
//
//   HSDP_ASSIGN_OR_RETURN(mlp::cuda::Cublas blas, mlp::cuda::Cublas::create(stream));
//   HSDP_RETURN_IF_ERROR(mlp::cuda::linearForward(blas, W, b, out, in, x, n, z));
//   HSDP_RETURN_IF_ERROR(mlp::cuda::tanhForward(z, a, size_t(out) * n, blas.stream()));
//
// Every function validates its arguments (InvalidArgument, nothing enqueued), enqueues its work on
// the one stream it is given (the Cublas handle's stream for the GEMMs, which the caller makes the
// same as the kernels' stream) and returns without waiting: nothing here allocates device memory,
// synchronises the device or a stream, or reads anything back. A launch error comes back as a
// Status; an error while a kernel runs surfaces at the caller's next synchronisation.
//
// Precision: the GEMMs are cublasSgemm in CUBLAS_PEDANTIC_MATH (fp32 products and sums; no TF32,
// no bf16x9 emulation, no reduced-precision reductions), the kernels use IEEE float operations
// with no FMA contraction (examples/CMakeLists.txt: --fmad=false). Results differ from Eigen only
// by summation order and the last bits of tanh/exp/log: ~1e-7 relative, far inside the training
// example's parity tolerance (tests/examples/gpu/ checks 1e-5 per function).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "gpu/cuda_owners.h"
#include "hsdp/status.h"

namespace mlp::cuda {

// A cuBLAS failure as an INTERNAL Status carrying cuBLAS's status name and string, the call and
// file:line (the cuBLAS counterpart of MLP_CUDA_CHECK, gpu/cuda_owners.h).
hsdp::Status cublasFailure(cublasStatus_t status, const char* call, const char* file, int line);

}  // namespace mlp::cuda

// For calls that return cublasStatus_t.
#define HSDP_CUBLAS_CHECK(call) \
  MLP_GPU_CHECK(call, CUBLAS_STATUS_SUCCESS, ::mlp::cuda::cublasFailure)

namespace mlp::cuda {

// Owns a cuBLAS handle bound to one stream, in CUBLAS_PEDANTIC_MATH (see above) with the
// pointer mode on the host (alpha and beta are host scalars). Created on the current device;
// move-only; the destructor destroys the handle (a failure there is logged, not returned).
class Cublas {
 public:
  Cublas() = default;
  static hsdp::StatusOr<Cublas> create(cudaStream_t stream);
  Cublas(Cublas&& o) noexcept : handle_(o.handle_), stream_(o.stream_) { o.handle_ = nullptr; }
  Cublas& operator=(Cublas&& o) noexcept;
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
  ~Cublas();

  cublasHandle_t get() const { return handle_; }
  cudaStream_t stream() const { return stream_; }

 private:
  void reset();
  cublasHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

// y = W x + b. W: out x in, b: out, x: in x n, y: out x n (not overlapping x). The GEMM first,
// then the bias added to every column: Eigen's order (mlp::linearForward).
hsdp::Status linearForward(const Cublas& blas, const float* W, const float* b, int out, int in,
                           const float* x, int n, float* y);

// Given dy = dL/dy (out x n): dW += dy x^T (out x in), db += row sums of dy (out), both added to
// what is there (micro-batches accumulate into a zeroed buffer), and, when dx is not null,
// dx = W^T dy (in x n). mlp::linearBackward.
hsdp::Status linearBackward(const Cublas& blas, const float* W, int out, int in, const float* x,
                            const float* dy, int n, float* dW, float* db, float* dx);

// a[i] = tanh(z[i]) for `count` elements (a == z allowed: in place).
hsdp::Status tanhForward(const float* z, float* a, size_t count, cudaStream_t stream);

// Back through a = tanh(z): dz[i] = dx[i] * (1 - a[i]^2) (dz == dx allowed), the CPU example's
// `dx.array() * (1.0f - a.array().square())`.
hsdp::Status tanhBackward(const float* dx, const float* a, float* dz, size_t count,
                          cudaStream_t stream);

// Softmax cross-entropy over the n columns of logits (classes x n) with labels[n] (device ints,
// each in [0, classes); a label outside makes that column's loss NaN and its gradient column
// zero, rather than read out of bounds). Writes:
//   dlogits (classes x n): (softmax - onehot) / n, then divided by grad_divisor (the training
//            loop's 1/accum: mlp::crossEntropy followed by `dz /= accum`);
//   col_loss[n]: scratch, each column's loss;
//   *loss (one device float): the mean loss over the columns, summed in double in column order
//            (mlp::crossEntropy's order).
// The host reads *loss back when it likes (one cudaMemcpyAsync + event).
hsdp::Status crossEntropy(const float* logits, const int* labels, int classes, int n,
                          float* dlogits, float* col_loss, float* loss, cudaStream_t stream,
                          float grad_divisor = 1.0f);

}  // namespace mlp::cuda
