#include "gpt/model.h"

#include <cmath>
#include <utility>

#include "gpt/data.h"

namespace gpt {
namespace {

// A block's parameters, in registration order (the index into the pointer spans).
enum BlockParam {
  kLn1W,
  kLn1B,
  kAttnW,
  kAttnB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kMlpProjW,
  kMlpProjB,
  kBlockParams
};

// A standard normal, a pure function of its arguments (Box-Muller on two hashed uniforms).
float normal(uint64_t seed, uint64_t a, uint64_t b, uint64_t i) {
  const uint64_t h = splitmix64(seed ^ splitmix64(a ^ splitmix64(b ^ splitmix64(i))));
  const double u1 = ((h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  const double u2 = (splitmix64(h) >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

size_t Config::paramCount() const {
  const size_t d = d_model;
  return vocab * d + context * d + layers * (12 * d * d + 13 * d) + 2 * d;
}

size_t Config::matmulParamCount() const {
  const size_t d = d_model;
  return layers * 12 * d * d + vocab * d;
}

hsdp::StatusOr<Config> preset(const std::string& name) {
  Config c;
  if (name == "tiny") {
    c.layers = 4, c.d_model = 128, c.heads = 4, c.context = 64;
  } else if (name == "small") {
    c.layers = 6, c.d_model = 384, c.heads = 6, c.context = 128;
  } else {
    return hsdp::invalidArgument("--preset '", name, "' is not one of tiny, small");
  }
  return c;
}

hsdp::Status validate(const Config& c) {
  if (c.layers < 1) return hsdp::invalidArgument("--layers ", c.layers, " must be >= 1");
  if (c.heads < 1) return hsdp::invalidArgument("--heads ", c.heads, " must be >= 1");
  if (c.d_model < 1 || c.d_model % c.heads != 0)
    return hsdp::invalidArgument("--d-model ", c.d_model,
                                 " must be a positive multiple of --heads ", c.heads);
  if (c.context < 2) return hsdp::invalidArgument("--context ", c.context, " must be >= 2");
  if (c.d_model > 8192 || c.layers > 1024 || c.context > 8192)
    return hsdp::invalidArgument(
        "model too large for this CPU example (d_model <= 8192, layers <= "
        "1024, context <= 8192)");
  return hsdp::okStatus();
}

std::vector<UnitInfo> units(const Config& c) {
  const int64_t d = c.d_model;
  std::vector<UnitInfo> out;
  // Embeddings, norms and biases take no weight decay; the four matrices of each block do.
  out.push_back({"wte", UnitKind::kTokenEmbedding, -1, {{"weight", {c.vocab, d}, false}}});
  out.push_back({"wpe", UnitKind::kPositionEmbedding, -1, {{"weight", {c.context, d}, false}}});
  for (int l = 0; l < c.layers; ++l) {
    out.push_back({"h." + std::to_string(l),
                   UnitKind::kBlock,
                   l,
                   {{"ln_1.weight", {d}, false},
                    {"ln_1.bias", {d}, false},
                    {"attn.c_attn.weight", {d, 3 * d}, true},
                    {"attn.c_attn.bias", {3 * d}, false},
                    {"attn.c_proj.weight", {d, d}, true},
                    {"attn.c_proj.bias", {d}, false},
                    {"ln_2.weight", {d}, false},
                    {"ln_2.bias", {d}, false},
                    {"mlp.c_fc.weight", {d, 4 * d}, true},
                    {"mlp.c_fc.bias", {4 * d}, false},
                    {"mlp.c_proj.weight", {4 * d, d}, true},
                    {"mlp.c_proj.bias", {d}, false}}});
  }
  out.push_back({"ln_f", UnitKind::kFinalNorm, -1, {{"weight", {d}, false}, {"bias", {d}, false}}});
  return out;
}

std::vector<int> unitOrder(const Config& c) {
  std::vector<int> order = {kWte, kWpe};
  for (int l = 0; l < c.layers; ++l) order.push_back(blockUnit(l));
  order.push_back(finalNormUnit(c));
  order.push_back(kWte);  // the tied LM head
  return order;
}

std::vector<float> initUnit(const Config& c, int unit) {
  const UnitInfo info = units(c)[unit];
  std::vector<float> flat;
  for (size_t i = 0; i < info.params.size(); ++i) {
    const hsdp::ParamSpec& p = info.params[i];
    const std::string& n = p.name;
    const bool is_bias = n.size() >= 4 && n.compare(n.size() - 4, 4, "bias") == 0;
    const bool is_norm = n.rfind("ln_", 0) == 0 || info.kind == UnitKind::kFinalNorm;
    float stddev = 0.02f;
    if (info.kind == UnitKind::kPositionEmbedding) stddev = 0.01f;
    if (n == "attn.c_proj.weight" || n == "mlp.c_proj.weight")
      stddev = 0.02f / std::sqrt(2.0f * c.layers);
    for (size_t k = 0; k < p.numel(); ++k) {
      float v;
      if (is_bias)
        v = 0.0f;
      else if (is_norm)
        v = 1.0f;  // a norm's weight (its bias is caught above)
      else
        v = stddev * normal(c.seed, unit, i, k);
      flat.push_back(v);
    }
  }
  return flat;
}

Model::Model(const Config& cfg, bool checkpoint) : cfg_(cfg), checkpoint_(checkpoint) {
  xs_.resize(cfg.layers + 1);
  caches_.resize(checkpoint ? 1 : cfg.layers);
}

void Model::setBatch(int B, int T, const int32_t* tokens, const int32_t* targets,
                     float grad_scale) {
  B_ = B, T_ = T, tokens_ = tokens, targets_ = targets, grad_scale_ = grad_scale;
}

void Model::forward(int pos, std::span<const float* const> p) {
  const int L = cfg_.layers, d = cfg_.d_model, n = B_ * T_;
  if (pos == 0) {
    embedForward(p[0], d, tokens_, n, &xs_[0]);
  } else if (pos == 1) {
    positionForward(p[0], B_, T_, &xs_[0]);
  } else if (pos < 2 + L) {
    blockForward(pos - 2, p);
  } else if (pos == 2 + L) {
    layerNormForward(p[0], p[1], xs_[L], &xf_, &meanf_, &rstdf_);
  } else {  // the head, tied to wte (d x V)
    logits_.resize(cfg_.vocab, n);
    logits_.noalias() = Eigen::Map<const Matrix>(p[0], d, cfg_.vocab).transpose() * xf_;
    loss_ = targets_ != nullptr ? crossEntropy(logits_, targets_, grad_scale_, &dlogits_) : 0.0f;
  }
}

void Model::backward(int pos, std::span<const float* const> p, std::span<float* const> g) {
  const int L = cfg_.layers, d = cfg_.d_model;
  if (pos == 3 + L) {  // head: d(wte) += xf dlogits^T, dxf = wte dlogits
    const Eigen::Map<const Matrix> wte(p[0], d, cfg_.vocab);
    Eigen::Map<Matrix>(g[0], d, cfg_.vocab).noalias() += xf_ * dlogits_.transpose();
    dx_.resize(d, dlogits_.cols());
    dx_.noalias() = wte * dlogits_;
  } else if (pos == 2 + L) {
    std::swap(dx_, dsmall_);  // dsmall_ = dL/dxf; dx_ receives dL/d(last block's output)
    dx_.setZero(dsmall_.rows(), dsmall_.cols());
    layerNormBackward(p[0], xs_[L], meanf_, rstdf_, dsmall_, g[0], g[1], &dx_);
  } else if (pos >= 2) {
    blockBackward(pos - 2, p, g);
  } else if (pos == 1) {
    positionBackward(dx_, B_, T_, g[0]);
  } else {
    embedBackward(dx_, tokens_, g[0]);
  }
}

void Model::blockForward(int l, std::span<const float* const> p) {
  const int d = cfg_.d_model;
  const Matrix& x = xs_[l];
  BlockCache& c = cache(l);
  layerNormForward(p[kLn1W], p[kLn1B], x, &c.ln1, &c.mean1, &c.rstd1);
  linearForward(p[kAttnW], p[kAttnB], d, 3 * d, c.ln1, &c.qkv);
  attentionForward(c.qkv, B_, T_, cfg_.heads, &c.probs, &c.atty);
  linearForward(p[kAttnProjW], p[kAttnProjB], d, d, c.atty, &c.x2);
  c.x2 += x;  // residual
  layerNormForward(p[kLn2W], p[kLn2B], c.x2, &c.ln2, &c.mean2, &c.rstd2);
  linearForward(p[kFcW], p[kFcB], d, 4 * d, c.ln2, &c.fch);
  geluForward(c.fch, &c.fcg);
  Matrix& y = xs_[l + 1];
  linearForward(p[kMlpProjW], p[kMlpProjB], 4 * d, d, c.fcg, &y);
  y += c.x2;  // residual
}

// dx_ holds dL/d(block output) on entry and dL/d(block input) on return.
void Model::blockBackward(int l, std::span<const float* const> p, std::span<float* const> g) {
  const int d = cfg_.d_model;
  if (checkpoint_) blockForward(l, p);  // recompute what forward did not keep
  const Matrix& x = xs_[l];
  BlockCache& c = cache(l);
  linearBackward(p[kMlpProjW], 4 * d, d, c.fcg, dx_, g[kMlpProjW], g[kMlpProjB], &dbig_);
  geluBackward(c.fch, &dbig_);
  linearBackward(p[kFcW], d, 4 * d, c.ln2, dbig_, g[kFcW], g[kFcB], &dsmall_);
  // dx_ += ln_2's input gradient: dx_ is now dL/dx2 (the residual after attention).
  layerNormBackward(p[kLn2W], c.x2, c.mean2, c.rstd2, dsmall_, g[kLn2W], g[kLn2B], &dx_);
  linearBackward(p[kAttnProjW], d, d, c.atty, dx_, g[kAttnProjW], g[kAttnProjB], &dattn_);
  attentionBackward(c.qkv, c.probs, dattn_, B_, T_, cfg_.heads, &dqkv_, &dscores_);
  linearBackward(p[kAttnW], d, 3 * d, c.ln1, dqkv_, g[kAttnW], g[kAttnB], &dsmall_);
  layerNormBackward(p[kLn1W], x, c.mean1, c.rstd1, dsmall_, g[kLn1W], g[kLn1B], &dx_);
}

size_t Model::activationBytes() const {
  size_t floats = xf_.size() + meanf_.size() + rstdf_.size() + logits_.size() + dlogits_.size() +
                  dx_.size() + dbig_.size() + dqkv_.size() + dsmall_.size() + dattn_.size() +
                  dscores_.size();
  for (const Matrix& x : xs_) floats += x.size();
  for (const BlockCache& c : caches_)
    floats += c.ln1.size() + c.qkv.size() + c.probs.size() + c.atty.size() + c.x2.size() +
              c.ln2.size() + c.fch.size() + c.fcg.size() + c.mean1.size() + c.rstd1.size() +
              c.mean2.size() + c.rstd2.size();
  return floats * sizeof(float);
}

}  // namespace gpt
