// OptimizerStep: the CPU Adam, the offload worker, the norm, the space's step kernels and host
// copies (optimizer_step.h).
#include "engine/optimizer_step.h"

#include <algorithm>
#include <cmath>

namespace hsdp::engine {

namespace {
// The Adam settings of a span: no decay where its parameters take none.
AdamConfig spanConfig(const AdamConfig& adam, const DecaySpan& s) {
  AdamConfig c = adam;
  if (!s.decay) c.weight_decay = 0.0f;
  return c;
}

AdamShard spanOf(const ShardStep& s, const DecaySpan& d) {
  return {s.master + d.begin,
          s.grad + d.begin,
          s.exp_avg + d.begin,
          s.exp_avg_sq + d.begin,
          d.n,
          s.out16 ? s.out16 + d.begin : nullptr};
}
}  // namespace

std::vector<DecaySpan> decaySpans(const FlatLayout& l, int k) {
  std::vector<DecaySpan> spans;
  const size_t sb = static_cast<size_t>(k) * l.shardNumel(), se = sb + l.shardNumel();
  for (size_t i = 0; i < l.params().size(); ++i) {
    const size_t pb = l.offset(i), pe = pb + l.params()[i].numel();
    const size_t b = std::max(sb, pb), e = std::min(se, pe);
    if (b >= e) continue;
    const bool decay = l.params()[i].weight_decay;
    if (!spans.empty() && spans.back().decay == decay &&
        spans.back().begin + spans.back().n == b - sb)
      spans.back().n += e - b;
    else
      spans.push_back({b - sb, e - b, decay});
  }
  // Padding (past the last parameter) steps with the last run; a shard of padding alone decays
  // (its values are zero and stay zero either way).
  const size_t covered = spans.empty() ? 0 : spans.back().begin + spans.back().n;
  if (spans.empty())
    spans.push_back({0, l.shardNumel(), true});
  else if (covered < l.shardNumel())
    spans.back().n += l.shardNumel() - covered;
  return spans;
}

StatusOr<std::unique_ptr<OptimizerStep>> OptimizerStep::create(const EngineConfig& cfg) {
  auto o = std::make_unique<OptimizerStep>();
  if (cfg.device == Device::kHost || cfg.offload.cpu) {  // the CPU Adam steps host shards
    CpuAdamOptions adam_opts;
    adam_opts.threads = *cfg.offload.adam_threads;
    adam_opts.isa = *cfg.offload.adam_isa;
    HSDP_ASSIGN_OR_RETURN(o->cpu_adam_, CpuAdam::create(adam_opts));
  }
  if (cfg.offload.cpu) {
    HSDP_ASSIGN_OR_RETURN(o->numa_, NumaTopology::load());
    o->queue_ = std::make_unique<StepQueue>();
  }
  return o;
}

Status OptimizerStep::beginNorm(std::span<const std::pair<const float*, size_t>> grads,
                                Comm* group) {
  HSDP_RETURN_IF_ERROR(kernels_->normBegin());
  for (auto [g, n] : grads) HSDP_RETURN_IF_ERROR(kernels_->normAccumulate(g, n));
  HSDP_RETURN_IF_ERROR(kernels_->normReduce(group));
  norm_pending_ = true;
  return okStatus();
}

Status OptimizerStep::readNorm() const {
  if (!norm_pending_) return okStatus();
  HSDP_ASSIGN_OR_RETURN(double sumsq, kernels_->normResult());
  last_norm_ = static_cast<float>(std::sqrt(sumsq));
  norm_pending_ = false;
  return okStatus();
}

float OptimizerStep::clipCoefficient(float clip_norm) const {
  if (clip_norm <= 0) return 1.0f;
  return std::min(1.0f, clip_norm / (last_norm_ + 1e-6f));
}

Status OptimizerStep::stepNow(const AdamConfig& adam, int64_t t, const ShardStep& s, float scale) {
  for (const DecaySpan& d : s.spans)
    HSDP_RETURN_IF_ERROR(kernels_->adamStep(spanConfig(adam, d), t, spanOf(s, d), scale));
  if (s.encoded != nullptr) wireEncode(s.wire, s.master, s.n, s.encoded);
  return okStatus();
}

// `adam` by value in the job: the rate of this step, whatever the caller sets later.
StatusOr<int64_t> OptimizerStep::launch(const AdamConfig& adam, int64_t t, const ShardStep& s,
                                        float scale) {
  HostCopies* sp = copies_.get();
  const size_t bytes = s.n * sizeof(float);
  if (s.slot != nullptr)
    HSDP_RETURN_IF_ERROR(sp->startDownload(*s.slot, s.grad, s.space_grad, bytes));
  CpuAdam* opt = cpu_adam_.get();
  return queue_->submit([adam, t, s, scale, sp, opt, bytes]() -> Status {
    if (s.slot != nullptr)
      HSDP_RETURN_IF_ERROR(sp->finishDownload(*s.slot, s.grad, s.space_grad, bytes));
    for (const DecaySpan& d : s.spans)
      HSDP_RETURN_IF_ERROR(opt->step(spanConfig(adam, d), t, spanOf(s, d), scale));
    if (s.slot != nullptr) {
      HSDP_RETURN_IF_ERROR(sp->upload(*s.slot, s.space_master, s.master, bytes));
      if (s.space16 != nullptr)
        HSDP_RETURN_IF_ERROR(sp->upload(*s.slot, s.space16, s.out16, s.n * sizeof(bf16)));
    }
    if (s.encoded != nullptr) wireEncode(s.wire, s.master, s.n, s.encoded);
    return okStatus();
  });
}

Status OptimizerStep::wait(int64_t ticket) { return queue_->waitFor(ticket); }
Status OptimizerStep::waitAll() { return queue_->waitAll(); }

void OptimizerStep::takeSeconds(double* total, double* exposed) {
  *total = *exposed = 0;
  if (queue_) queue_->takeSeconds(total, exposed);
}

}  // namespace hsdp::engine
