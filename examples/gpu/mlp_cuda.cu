// The example MLP on a CUDA device (mlp_cuda.h): cuBLAS for the three GEMMs of a linear layer,
// small grid-stride kernels for the rest. Each kernel mirrors one line of examples/mlp/mlp.cc
// operation for operation (correctly rounded __f*_rn intrinsics, and the target is compiled with
// --fmad=false so plain expressions are not contracted either), so that the only differences
// from Eigen are summation orders and the last bits of tanh/exp/log.
#include <algorithm>
#include <cmath>
#include <utility>

#include "gpu/cuda_owners.h"
#include "gpu/mlp_cuda.h"
#include "hsdp/log.h"

namespace mlp::cuda {
namespace {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `work` items, capped: enough to fill an H200 several times
// over, never more blocks than there are items.
unsigned gridFor(size_t work) {
  const size_t want = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(want, 132 * 8)));
}

// y[r + c*out] += b[r]: Eigen's `y->colwise() += bias` after the GEMM.
__global__ void addBiasKernel(float* __restrict__ y, const float* __restrict__ b, int out,
                              size_t total) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride)
    y[i] = __fadd_rn(y[i], b[i % static_cast<size_t>(out)]);
}

// db[r] += sum over columns of dy[r, c], one thread per row, columns in order. Threads of a warp
// read consecutive rows of one column: coalesced.
__global__ void rowSumAddKernel(const float* __restrict__ dy, float* __restrict__ db, int out,
                                int n) {
  const int stride = gridDim.x * blockDim.x;
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < out; r += stride) {
    float s = 0.0f;
    for (int c = 0; c < n; ++c) s = __fadd_rn(s, dy[static_cast<size_t>(c) * out + r]);
    db[r] = __fadd_rn(db[r], s);
  }
}

__global__ void tanhKernel(const float* z, float* a, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride)
    a[i] = tanhf(z[i]);
}

// dz = dx * (1 - a*a), in that order.
__global__ void tanhBackwardKernel(const float* dx, const float* a, float* dz, size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const float ai = a[i];
    dz[i] = __fmul_rn(dx[i], __fsub_rn(1.0f, __fmul_rn(ai, ai)));
  }
}

// One thread per column (a sample's logits are contiguous): mlp::crossEntropy's loop body.
//   mx = max; e = exp(l - mx); z = sum e; loss = log(z) + mx - l[label];
//   d = e / z; d[label] -= 1; d /= n; (then the caller's d /= accum)
__global__ void crossEntropyKernel(const float* __restrict__ logits, const int* __restrict__ labels,
                                   int classes, int n, float* __restrict__ dlogits,
                                   float* __restrict__ col_loss, float grad_divisor) {
  const int stride = gridDim.x * blockDim.x;
  const float fn = static_cast<float>(n);
  for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < n; s += stride) {
    const float* l = logits + static_cast<size_t>(s) * classes;
    float* d = dlogits + static_cast<size_t>(s) * classes;
    const int label = labels[s];
    if (label < 0 || label >= classes) {  // caller's bug: poison the loss, touch nothing else
      for (int c = 0; c < classes; ++c) d[c] = 0.0f;
      col_loss[s] = __int_as_float(0x7fc00000);  // quiet NaN
      continue;
    }
    float mx = l[0];
    for (int c = 1; c < classes; ++c) mx = fmaxf(mx, l[c]);
    float z = 0.0f;
    for (int c = 0; c < classes; ++c) z = __fadd_rn(z, expf(__fsub_rn(l[c], mx)));
    col_loss[s] = __fsub_rn(__fadd_rn(logf(z), mx), l[label]);
    for (int c = 0; c < classes; ++c) {
      float p = __fdiv_rn(expf(__fsub_rn(l[c], mx)), z);
      if (c == label) p = __fsub_rn(p, 1.0f);
      d[c] = __fdiv_rn(__fdiv_rn(p, fn), grad_divisor);
    }
  }
}

// *loss = mean of col_loss, summed in double in column order as mlp::crossEntropy does. One
// thread: n is a per-rank batch (tens to thousands), and one fixed order keeps it deterministic.
__global__ void meanLossKernel(const float* __restrict__ col_loss, int n,
                               float* __restrict__ loss) {
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += static_cast<double>(col_loss[i]);
  *loss = static_cast<float>(s / n);
}

hsdp::Status positive(const char* fn, const char* what, long long v) {
  if (v > 0) return hsdp::okStatus();
  return hsdp::invalidArgument(fn, ": ", what, " = ", v, " must be positive");
}

hsdp::Status notNull(const char* fn, const char* what, const void* p) {
  if (p != nullptr) return hsdp::okStatus();
  return hsdp::invalidArgument(fn, ": ", what, " is null");
}

}  // namespace

hsdp::Status cublasFailure(cublasStatus_t status, const char* call, const char* file, int line) {
  return hsdp::internalError("cuBLAS error ", static_cast<int>(status), " (",
                             cublasGetStatusName(status), ": ", cublasGetStatusString(status),
                             ") in ", call, " at ", file, ":", line);
}

// ---- Cublas ----------------------------------------------------------------------------------

hsdp::StatusOr<Cublas> Cublas::create(cudaStream_t stream) {
  Cublas c;
  HSDP_CUBLAS_CHECK(cublasCreate(&c.handle_));  // on the current device
  c.stream_ = stream;
  // From here on `c` owns the handle: an early return destroys it.
  HSDP_CUBLAS_CHECK(cublasSetStream(c.handle_, stream));
  // Pedantic: fp32 compute throughout. The default mode already excludes TF32 for cublasSgemm
  // unless NVIDIA_TF32_OVERRIDE or a later default says otherwise; pedantic also excludes the
  // bf16x9 fp32 emulation and reduced-precision reductions, so the GEMMs stay an fp32 reference.
  HSDP_CUBLAS_CHECK(cublasSetMathMode(c.handle_, CUBLAS_PEDANTIC_MATH));
  HSDP_CUBLAS_CHECK(cublasSetPointerMode(c.handle_, CUBLAS_POINTER_MODE_HOST));
  return std::move(c);  // StatusOr<Cublas>(Cublas&&): C++17 does not move implicitly here
}

Cublas& Cublas::operator=(Cublas&& o) noexcept {
  if (this != &o) {
    reset();
    handle_ = o.handle_;
    stream_ = o.stream_;
    o.handle_ = nullptr;
  }
  return *this;
}

Cublas::~Cublas() { reset(); }

void Cublas::reset() {
  if (handle_ == nullptr) return;
  const cublasStatus_t st = cublasDestroy(handle_);
  if (st != CUBLAS_STATUS_SUCCESS)
    HSDP_WARN(kInit, "cublasDestroy failed: ", cublasGetStatusName(st), " (",
              cublasGetStatusString(st), ")");
  handle_ = nullptr;
}

// ---- layers ----------------------------------------------------------------------------------

hsdp::Status linearForward(const Cublas& blas, const float* W, const float* b, int out, int in,
                           const float* x, int n, float* y) {
  constexpr const char* fn = "linearForward";
  HSDP_RETURN_IF_ERROR(positive(fn, "out", out));
  HSDP_RETURN_IF_ERROR(positive(fn, "in", in));
  HSDP_RETURN_IF_ERROR(positive(fn, "n", n));
  HSDP_RETURN_IF_ERROR(notNull(fn, "cuBLAS handle", blas.get()));
  for (auto [what, p] : {std::pair<const char*, const void*>{"W", W}, {"b", b}, {"x", x}, {"y", y}})
    HSDP_RETURN_IF_ERROR(notNull(fn, what, p));
  const float one = 1.0f, zero = 0.0f;
  // y (out x n) = W (out x in) * x (in x n); beta = 0: y's old contents are not read.
  HSDP_CUBLAS_CHECK(cublasSgemm(blas.get(), CUBLAS_OP_N, CUBLAS_OP_N, out, n, in, &one, W, out, x,
                                in, &zero, y, out));
  const size_t total = static_cast<size_t>(out) * n;
  addBiasKernel<<<gridFor(total), kThreads, 0, blas.stream()>>>(y, b, out, total);
  MLP_CUDA_CHECK(cudaGetLastError());
  return hsdp::okStatus();
}

hsdp::Status linearBackward(const Cublas& blas, const float* W, int out, int in, const float* x,
                            const float* dy, int n, float* dW, float* db, float* dx) {
  constexpr const char* fn = "linearBackward";
  HSDP_RETURN_IF_ERROR(positive(fn, "out", out));
  HSDP_RETURN_IF_ERROR(positive(fn, "in", in));
  HSDP_RETURN_IF_ERROR(positive(fn, "n", n));
  HSDP_RETURN_IF_ERROR(notNull(fn, "cuBLAS handle", blas.get()));
  for (auto [what, p] :
       {std::pair<const char*, const void*>{"W", W}, {"x", x}, {"dy", dy}, {"dW", dW}, {"db", db}})
    HSDP_RETURN_IF_ERROR(notNull(fn, what, p));
  const float one = 1.0f, zero = 0.0f;
  // dW (out x in) += dy (out x n) * x^T; x is stored in x n, so ldb = in.
  HSDP_CUBLAS_CHECK(cublasSgemm(blas.get(), CUBLAS_OP_N, CUBLAS_OP_T, out, in, n, &one, dy, out, x,
                                in, &one, dW, out));
  rowSumAddKernel<<<gridFor(static_cast<size_t>(out)), kThreads, 0, blas.stream()>>>(dy, db, out,
                                                                                     n);
  MLP_CUDA_CHECK(cudaGetLastError());
  if (dx != nullptr) {
    // dx (in x n) = W^T (W stored out x in, lda = out) * dy (out x n); beta = 0.
    HSDP_CUBLAS_CHECK(cublasSgemm(blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, in, n, out, &one, W, out,
                                  dy, out, &zero, dx, in));
  }
  return hsdp::okStatus();
}

hsdp::Status tanhForward(const float* z, float* a, size_t count, cudaStream_t stream) {
  if (count == 0) return hsdp::okStatus();
  HSDP_RETURN_IF_ERROR(notNull("tanhForward", "z", z));
  HSDP_RETURN_IF_ERROR(notNull("tanhForward", "a", a));
  tanhKernel<<<gridFor(count), kThreads, 0, stream>>>(z, a, count);
  MLP_CUDA_CHECK(cudaGetLastError());
  return hsdp::okStatus();
}

hsdp::Status tanhBackward(const float* dx, const float* a, float* dz, size_t count,
                          cudaStream_t stream) {
  if (count == 0) return hsdp::okStatus();
  HSDP_RETURN_IF_ERROR(notNull("tanhBackward", "dx", dx));
  HSDP_RETURN_IF_ERROR(notNull("tanhBackward", "a", a));
  HSDP_RETURN_IF_ERROR(notNull("tanhBackward", "dz", dz));
  tanhBackwardKernel<<<gridFor(count), kThreads, 0, stream>>>(dx, a, dz, count);
  MLP_CUDA_CHECK(cudaGetLastError());
  return hsdp::okStatus();
}

hsdp::Status crossEntropy(const float* logits, const int* labels, int classes, int n,
                          float* dlogits, float* col_loss, float* loss, cudaStream_t stream,
                          float grad_divisor) {
  constexpr const char* fn = "crossEntropy";
  HSDP_RETURN_IF_ERROR(positive(fn, "classes", classes));
  HSDP_RETURN_IF_ERROR(positive(fn, "n", n));
  for (auto [what, p] : {std::pair<const char*, const void*>{"logits", logits},
                         {"labels", labels},
                         {"dlogits", dlogits},
                         {"col_loss", col_loss},
                         {"loss", loss}})
    HSDP_RETURN_IF_ERROR(notNull(fn, what, p));
  if (!(grad_divisor > 0.0f) || !std::isfinite(grad_divisor))
    return hsdp::invalidArgument(fn, ": grad_divisor = ", grad_divisor,
                                 " must be positive and finite");
  crossEntropyKernel<<<gridFor(static_cast<size_t>(n)), kThreads, 0, stream>>>(
      logits, labels, classes, n, dlogits, col_loss, grad_divisor);
  MLP_CUDA_CHECK(cudaGetLastError());
  // Same stream: runs after every column's loss is written.
  meanLossKernel<<<1, 1, 0, stream>>>(col_loss, n, loss);
  MLP_CUDA_CHECK(cudaGetLastError());
  return hsdp::okStatus();
}

}  // namespace mlp::cuda
