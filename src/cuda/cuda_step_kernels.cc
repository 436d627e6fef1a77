// The CUDA space's step kernels (cuda/cuda_space.h): Adam over a device shard and the squared
// gradient norm, both on the space's compute stream. The norm is accumulated in double on the
// device, rounded to float and summed over the group like the host's (through the space's
// collectives), and read back into pinned memory; the host waits for it only in normResult().
#include <cstring>

#include "collectives/nccl/cuda_check.h"
#include "cuda/cuda_space.h"

namespace hsdp::gpu {
namespace {

class CudaStepKernels final : public StepKernels {
 public:
  CudaStepKernels(CudaSpace& space, SpaceCollectives& collectives)
      : space_(space), coll_(collectives) {}

  ~CudaStepKernels() override {
    // The pinned norm buffer is freed next: its last read-back must be done.
    if (norm_ready_.get() != nullptr) (void)cudaEventSynchronize(norm_ready_.get());
  }

  Status init() {
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    // Why: normResult() waits for the norm's read-back into pinned memory, nothing later.
    HSDP_ASSIGN_OR_RETURN(norm_ready_, Event::create());
    HSDP_ASSIGN_OR_RETURN(norm_acc_, DeviceBuffer::allocate(sizeof(double)));
    HSDP_ASSIGN_OR_RETURN(norm_scratch_,
                          DeviceBuffer::allocate(kSumSquaresScratch * sizeof(double)));
    HSDP_ASSIGN_OR_RETURN(norm_partial_, DeviceBuffer::allocate(sizeof(float)));
    HSDP_ASSIGN_OR_RETURN(norm_host_, PinnedBuffer::allocate(2 * sizeof(double)));
    return okStatus();
  }

  Status adamStep(const AdamConfig& cfg, int64_t t, const AdamShard& s, float grad_scale) override {
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    return gpu::adamStep(cfg, t, {s.param, s.grad, s.exp_avg, s.exp_avg_sq, s.n, s.param_bf16},
                         compute(), grad_scale);
  }

  Status normBegin() override {
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    HSDP_CUDA_CHECK(cudaMemsetAsync(norm_acc_.data(), 0, sizeof(double), compute()));
    return okStatus();
  }

  Status normAccumulate(const float* x, size_t n) override {
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    return sumSquares(x, n, norm_acc_.as<double>(), norm_scratch_.as<double>(), compute());
  }

  Status normReduce(Comm* group) override {
    HSDP_ASSIGN_OR_RETURN(DeviceGuard g, DeviceGuard::set(space_.device()));
    norm_reduced_ = group != nullptr;
    if (norm_reduced_) {  // as the host: the float rounding of the sum, summed over the group
      HSDP_RETURN_IF_ERROR(
          castDoubleToFloat(norm_acc_.as<double>(), norm_partial_.as<float>(), 1, compute()));
      HSDP_ASSIGN_OR_RETURN(WorkHandle w, coll_.iallReduce(*group, norm_partial_.data(), 1,
                                                           DType::kFloat32, RedOp::kSum));
      HSDP_ASSIGN_OR_RETURN(bool done,
                            coll_.reached(w, Lane::kCompute, /*block=*/true, /*exposed=*/false));
      (void)done;
      HSDP_CUDA_CHECK(cudaMemcpyAsync(norm_host_.as<double>() + 1, norm_partial_.data(),
                                      sizeof(float), cudaMemcpyDeviceToHost, compute()));
    } else {
      HSDP_CUDA_CHECK(cudaMemcpyAsync(norm_host_.data(), norm_acc_.data(), sizeof(double),
                                      cudaMemcpyDeviceToHost, compute()));
    }
    HSDP_CUDA_CHECK(cudaEventRecord(norm_ready_.get(), compute()));
    return okStatus();
  }

  StatusOr<double> normResult() override {
    HSDP_CUDA_CHECK(cudaEventSynchronize(norm_ready_.get()));
    if (norm_reduced_) {
      float f;
      std::memcpy(&f, norm_host_.as<double>() + 1, sizeof(float));
      return static_cast<double>(f);
    }
    return *norm_host_.as<double>();
  }

 private:
  // The space's compute stream now (setComputeStream may change it between steps).
  cudaStream_t compute() const { return space_.stream(Lane::kCompute); }

  CudaSpace& space_;
  SpaceCollectives& coll_;
  DeviceBuffer norm_acc_;      // one double: the sum of squares
  DeviceBuffer norm_scratch_;  // gpu::sumSquares' block partials
  DeviceBuffer norm_partial_;  // one float: the rounded sum, all-reduced in place
  PinnedBuffer norm_host_;     // [0]: the double; [1]: the float (read back)
  Event norm_ready_;
  bool norm_reduced_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<StepKernels>> createCudaStepKernels(CudaSpace& space,
                                                             SpaceCollectives& collectives) {
  auto k = std::make_unique<CudaStepKernels>(space, collectives);
  HSDP_RETURN_IF_ERROR(k->init());
  return std::unique_ptr<StepKernels>(std::move(k));
}

}  // namespace hsdp::gpu
