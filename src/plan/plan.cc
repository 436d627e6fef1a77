// hsdp-plan's arithmetic; every formula is documented in include/hsdp/plan.h.
#include "hsdp/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <tuple>

#include "hsdp/files.h"

namespace hsdp {

StatusOr<DType> parsePlanDType(std::string_view name) {
  if (name == "bf16") return DType::kBFloat16;
  if (name == "fp32") return DType::kFloat32;
  return invalidArgument("unknown parameter dtype '", name, "' (expected bf16 or fp32)");
}

const char* planDTypeName(DType t) { return t == DType::kBFloat16 ? "bf16" : "fp32"; }

std::string Plan::label() const {
  return strCat("I", input.intra_shard, "xJ", input.inter_shard, " ", shardModeName(input.mode),
                input.hpz ? "+hpz" : "");
}

Status validatePlanInput(const PlanInput& in) {
  if (in.units.empty()) return invalidArgument("no units: the model has no parameters");
  for (size_t i = 0; i < in.units.size(); ++i)
    if (in.units[i] == 0) return invalidArgument("unit ", i, " has 0 parameters");
  if (!in.unit_uses.empty() && in.unit_uses.size() != in.units.size())
    return invalidArgument("unit_uses has ", in.unit_uses.size(), " entries for ", in.units.size(),
                           " units");
  for (size_t i = 0; i < in.unit_uses.size(); ++i)
    if (in.unit_uses[i] == 0) return invalidArgument("unit ", i, " is used 0 times");
  if (in.nodes < 1) return invalidArgument("--nodes ", in.nodes, " must be positive");
  if (in.gpus_per_node < 1)
    return invalidArgument("--gpus-per-node ", in.gpus_per_node, " must be positive");
  if (in.intra_shard < 1)
    return invalidArgument("--intra-shard ", in.intra_shard, " must be positive");
  if (in.inter_shard < 1)
    return invalidArgument("--inter-shard ", in.inter_shard, " must be positive");
  if (in.gpus_per_node % in.intra_shard != 0)
    return invalidArgument("intra_shard=", in.intra_shard, " does not divide the ",
                           in.gpus_per_node, " GPUs per node");
  if (in.nodes % in.inter_shard != 0)
    return invalidArgument("inter_shard=", in.inter_shard, " does not divide the ", in.nodes,
                           " nodes");
  if (in.mode == ShardMode::kNone && in.intra_shard * in.inter_shard != 1)
    return invalidArgument(
        "mode none replicates everything and needs intra_shard=1 and "
        "inter_shard=1 (got intra_shard=",
        in.intra_shard, ", inter_shard=", in.inter_shard, "); use zero1, zero2 or zero3 to shard");
  HSDP_RETURN_IF_ERROR(validate(WireFormat{Wire::kInt8, in.quant_block}));
  const bool qp = in.param_wire && wireQuantized(*in.param_wire);
  const bool qg = in.grad_wire && wireQuantized(*in.grad_wire);
  if (in.inter_shard > 1 && qp && in.mode != ShardMode::kZero3)
    return invalidArgument("--inter-param-wire ", wireName(*in.param_wire),
                           " needs mode zero3 (got ", shardModeName(in.mode),
                           "), as in the engine");
  if (in.inter_shard > 1 && (qp || qg) && in.param_dtype != DType::kFloat32)
    return invalidArgument("a ", wireName(qp ? *in.param_wire : *in.grad_wire),
                           " inter wire encodes fp32 data: use --param-dtype fp32, as the engine");
  if (in.hpz) {
    if (in.mode != ShardMode::kZero3)
      return invalidArgument("--hpz with mode ", shardModeName(in.mode),
                             ": hpZ keeps a secondary partition of sharded parameters and needs "
                             "mode zero3 (",
                             shardModeName(in.mode), " keeps whole parameters)");
    if (in.intra_shard == 1)
      return invalidArgument(
          "--hpz with intra_shard=1: the secondary partition over 1 rank per "
          "node would be a whole copy of the model; use intra_shard > 1");
    if (in.inter_shard == 1)
      return invalidArgument(
          "--hpz with inter_shard=1: the shard group is already inside one "
          "node, so hpZ would change nothing; use inter_shard > 1");
  }
  return okStatus();
}

namespace {

// D on a wire: Σ over units of S shards' encoded bytes (unset wire: e bytes per element, the
// plain D = e·ΣP); per_use: each unit counted once per use (zero3's gather passes).
uint64_t wireData(const Plan& p, std::optional<Wire> wire, bool per_use = false) {
  const uint64_t S = static_cast<uint64_t>(p.shard_group);
  const std::vector<uint32_t>& uses = p.input.unit_uses;
  uint64_t d = 0;
  for (size_t u = 0; u < p.input.units.size(); ++u) {
    const uint64_t s = (p.input.units[u] + S - 1) / S;
    const uint64_t k = per_use && !uses.empty() ? uses[u] : 1;
    d += k * S *
         (wire ? encodedBytes({*wire, p.input.quant_block}, s)
               : static_cast<uint64_t>(p.elem_bytes) * s);
  }
  return d;
}

PlanTraffic traffic(const Plan& p, std::optional<Wire> pw, std::optional<Wire> gw,
                    std::optional<Wire> rw) {
  const PlanInput& in = p.input;
  const uint64_t J = in.inter_shard, N = in.nodes, R = p.replicas, M = p.replica_nodes;
  PlanTraffic t;
  switch (in.mode) {
    case ShardMode::kNone:
      t.all_reduce = 2 * (N - 1) * wireData(p, rw);
      break;
    case ShardMode::kZero1:
    case ShardMode::kZero2:
      t.all_gather = R * (J - 1) * wireData(p, pw);
      t.reduce_scatter = R * (J - 1) * wireData(p, gw);
      t.all_reduce = 2 * (M - 1) * wireData(p, rw);
      break;
    case ShardMode::kZero3:
      t.all_gather = (in.hpz ? 1 : 2) * R * (J - 1) * wireData(p, pw, /*per_use=*/!in.hpz);
      t.reduce_scatter = R * (J - 1) * wireData(p, gw);
      t.all_reduce = 2 * (M - 1) * wireData(p, rw);
      break;
  }
  return t;
}

}  // namespace

StatusOr<Plan> makePlan(const PlanInput& in) {
  HSDP_RETURN_IF_ERROR(validatePlanInput(in));
  Plan p;
  p.input = in;
  const uint64_t I = in.intra_shard, J = in.inter_shard, N = in.nodes, G = in.gpus_per_node;
  const uint64_t S = I * J, W = N * G, R = W / S, M = N / J;
  p.world = static_cast<int>(W);
  p.shard_group = static_cast<int>(S);
  p.replicas = static_cast<int>(R);
  p.replica_nodes = static_cast<int>(M);
  const bool bf16 = in.param_dtype == DType::kBFloat16;
  const uint64_t e = bf16 ? 2 : 4, o = bf16 ? 12 : 8;
  p.elem_bytes = static_cast<int>(e);
  p.optim_bytes_per_elem = static_cast<int>(o);
  for (uint64_t n : in.units) {
    const uint64_t s = (n + S - 1) / S, padded = s * S;
    p.total_params += n;
    p.padded_params += padded;
    p.shard_params += s;
    p.largest_unit = std::max(p.largest_unit, n);
    p.largest_padded = std::max(p.largest_padded, padded);
    p.largest_shard = std::max(p.largest_shard, s);
  }
  // S = 1 (mode none, or a shard group of one): shard = padded = whole unit.
  const uint64_t whole = p.padded_params, shard = p.shard_params;

  PlanMemory& g = p.gpu;
  switch (in.mode) {
    case ShardMode::kNone:
    case ShardMode::kZero1:
      g.params = e * whole;
      g.grads = e * whole;
      break;
    case ShardMode::kZero2:
      g.params = e * whole;
      g.grads = e * shard;
      break;
    case ShardMode::kZero3:
      g.params = e * shard;
      g.grads = e * shard;
      break;
  }
  // The engine's zero1 (fp32 policy) also holds the gradient shard the reduce-scatter lands in
  // beside the whole gradient (a ring cannot reduce into its own input); the paper's bf16
  // accounting counts the whole gradient only.
  if (in.mode == ShardMode::kZero1 && S > 1 && in.param_dtype == DType::kFloat32)
    g.grads += e * shard;
  const uint64_t optim_elems = shard;  // == Ψ in mode none (S = 1)
  g.optimizer = in.offload_cpu ? 0 : o * optim_elems;
  if (in.hpz) g.hpz_secondary = e * J * shard;  // Σ P_u / I
  if (S > 1) {
    p.gathered_blocks = in.mode == ShardMode::kZero3 ? 4 : in.mode == ShardMode::kZero2 ? 2 : 0;
    g.gathered_peak = static_cast<uint64_t>(p.gathered_blocks) * e * p.largest_padded;
    const uint64_t m = p.largest_shard;
    g.comm_estimate = 2 * (J * m * e + (I > 1 ? 2 * J * m * e : 0) + (J > 1 ? 2 * m * e : 0));
  }
  if (in.offload_cpu) {
    p.host_pinned_per_rank = optim_elems * (4 + 8 + 4 + (bf16 ? 2 : 0));
    p.host_pinned_per_node = G * p.host_pinned_per_rank;
  }

  p.cross_node = traffic(p, in.param_wire, in.grad_wire, in.replica_wire);
  {  // per level (plan.h): every level at the policy's element type
    const uint64_t D = e * whole;
    const bool z3 = in.mode == ShardMode::kZero3;
    const uint64_t Dg = z3 ? wireData(p, std::nullopt, /*per_use=*/true) : D;  // gather passes
    const uint64_t g_intra = z3 ? 2 : 1, g_inter = z3 && !in.hpz ? 2 : 1;
    if (in.mode != ShardMode::kNone) {
      p.per_level.intra = (g_intra * Dg + D) * R * J * (I - 1);
      // hpz: a unit's later uses re-gather from the node's secondary partition (intra only).
      p.per_level.inter = (g_inter * (in.hpz ? D : Dg) + D) * R * (J - 1);
    }
    p.per_level.replica = 2 * (R - 1) * D;  // mode none: R = W, D = e·Ψ
  }
  for (Wire w : {Wire::kFp32, Wire::kBf16, Wire::kInt8, Wire::kInt4})
    p.traffic_by_wire.push_back({w, traffic(p, w, w, w)});
  return p;
}

StatusOr<std::vector<uint64_t>> splitUnits(uint64_t total, int64_t units) {
  if (units < 1) return invalidArgument("--units ", units, " must be positive");
  if (total < static_cast<uint64_t>(units))
    return invalidArgument("--units ", units, " is more than the ", total,
                           " parameters (every unit needs at least one)");
  const uint64_t L = static_cast<uint64_t>(units), base = total / L, extra = total % L;
  std::vector<uint64_t> out(L, base);
  for (uint64_t i = 0; i < extra; ++i) ++out[i];
  return out;
}

namespace {

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

StatusOr<std::vector<uint64_t>> parseUnitsText(std::string_view text, std::string_view file,
                                               std::vector<uint32_t>* uses) {
  std::vector<uint64_t> units;
  std::vector<uint32_t> k;
  size_t line_no = 0, pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    ++line_no;
    pos = nl + 1;
    if (const size_t hash = line.find('#'); hash != std::string_view::npos)
      line = line.substr(0, hash);
    const std::string body = trim(line);
    if (body.empty()) {
      if (nl == text.size()) break;
      continue;
    }
    std::istringstream fields(body);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    if (f.size() > 3)
      return invalidArgument(file, ":", line_no, ": '", body,
                             "': expected 'COUNT', 'NAME COUNT' or 'NAME COUNT USES' (one unit "
                             "per line)");
    auto n = parseCount(f[f.size() == 3 ? 1 : f.size() - 1], "parameter count");
    if (!n.ok())
      return invalidArgument(file, ":", line_no, ": '", body, "': ", n.status().message());
    units.push_back(*n);
    uint32_t used = 1;
    if (f.size() == 3) {
      const std::string& t = f[2];
      const bool digits =
          !t.empty() && t.size() <= 4 &&
          std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits || std::stoi(t) < 1)
        return invalidArgument(file, ":", line_no, ": '", body, "': uses '", t,
                               "' is not a whole number from 1 to 9999 (the times the unit is "
                               "used in one forward)");
      used = static_cast<uint32_t>(std::stoi(t));
    }
    k.push_back(used);
    if (nl == text.size()) break;
  }
  if (units.empty())
    return invalidArgument(file, ": no units (expected one parameter count per line)");
  if (uses != nullptr) *uses = std::move(k);
  return units;
}

StatusOr<std::vector<uint64_t>> readUnitsFile(const std::string& path,
                                              std::vector<uint32_t>* uses) {
  HSDP_ASSIGN_OR_RETURN(std::string text, files::readBounded(path, kMaxUnitsFileBytes, "--layers"));
  return parseUnitsText(text, path, uses);
}

std::vector<Plan> enumeratePlans(const PlanInput& base) {
  std::vector<Plan> out;
  for (int I = 1; I <= base.gpus_per_node; ++I) {
    if (base.gpus_per_node % I != 0) continue;
    for (int J = 1; J <= base.nodes; ++J) {
      if (base.nodes % J != 0) continue;
      for (ShardMode mode :
           {ShardMode::kNone, ShardMode::kZero1, ShardMode::kZero2, ShardMode::kZero3}) {
        for (bool hpz : {false, true}) {
          PlanInput in = base;
          in.intra_shard = I;
          in.inter_shard = J;
          in.mode = mode;
          in.hpz = hpz;
          if (!validatePlanInput(in).ok()) continue;
          // A shard group of one is mode none whatever the name: list it once.
          if (mode != ShardMode::kNone && I * J == 1) continue;
          auto p = makePlan(in);
          if (p.ok()) out.push_back(std::move(*p));
        }
      }
    }
  }
  return out;
}

void rankPlans(std::vector<Plan>* plans) {
  auto key = [](const Plan& p) {
    return std::make_tuple(p.cross_node.total(), p.gpu.total(), static_cast<int>(p.input.mode),
                           p.input.hpz, p.input.intra_shard, p.input.inter_shard);
  };
  std::stable_sort(plans->begin(), plans->end(),
                   [&](const Plan& a, const Plan& b) { return key(a) < key(b); });
}

std::string formatBytes(uint64_t b) {
  char buf[48];
  const double v = static_cast<double>(b);
  if (b >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", v / 1073741824.0);
  else if (b >= (uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.2f MiB", v / 1048576.0);
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", v / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

namespace {

std::string xmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A "nice" axis maximum >= v (1, 2, 5 x 10^k), in GiB.
double niceCeil(double v) {
  if (v <= 0) return 1;
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= v) return m * p;
  return 10 * p;
}

}  // namespace

std::string planChartSvg(const std::vector<Plan>& plans, uint64_t budget, std::string_view title) {
  const double kGiB = 1073741824.0;
  const int row_h = 22, top = 70, label_w = 190, panel_w = 360, gap = 70, right_pad = 30;
  const int rows = static_cast<int>(plans.size());
  const int width = label_w + panel_w + gap + panel_w + right_pad;
  const int height = top + std::max(rows, 1) * row_h + 80;
  double mem_max = budget > 0 ? budget / kGiB : 0, traffic_max = 0;
  for (const Plan& p : plans) {
    mem_max = std::max(mem_max, p.gpu.total() / kGiB);
    traffic_max = std::max(traffic_max, p.cross_node.total() / kGiB);
  }
  mem_max = niceCeil(mem_max);
  traffic_max = niceCeil(traffic_max);
  const int x_mem = label_w, x_tr = label_w + panel_w + gap;

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
    << "<rect x=\"0\" y=\"0\" width=\"" << width << "\" height=\"" << height
    << "\" fill=\"white\"/>\n"
    << "<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">" << xmlEscape(title)
    << "</text>\n"
    << "<text x=\"" << x_mem << "\" y=\"44\" font-weight=\"bold\">memory per GPU (GiB)</text>\n"
    << "<text x=\"" << x_tr
    << "\" y=\"44\" font-weight=\"bold\">cross-node bytes per step, all "
       "nodes (GiB)</text>\n";

  struct Seg {
    const char* name;
    const char* color;
  };
  const Seg mem_segs[] = {{"params", "#4e79a7"},        {"grads", "#f28e2b"},
                          {"optimizer", "#59a14f"},     {"hpz secondary", "#b07aa1"},
                          {"gathered peak", "#e15759"}, {"comm (estimate)", "#9c755f"}};
  const Seg tr_segs[] = {
      {"all-gather", "#4e79a7"}, {"reduce-scatter", "#f28e2b"}, {"all-reduce", "#59a14f"}};

  // Axes: ticks at 0, 1/4, ..., 1 of each panel.
  const int axis_y = top + std::max(rows, 1) * row_h + 4;
  for (int panel = 0; panel < 2; ++panel) {
    const int x0 = panel == 0 ? x_mem : x_tr;
    const double vmax = panel == 0 ? mem_max : traffic_max;
    o << "<line x1=\"" << x0 << "\" y1=\"" << top - 6 << "\" x2=\"" << x0 << "\" y2=\"" << axis_y
      << "\" stroke=\"#333\"/>\n";
    for (int k = 0; k <= 4; ++k) {
      const double x = x0 + panel_w * k / 4.0;
      o << "<line x1=\"" << num(x) << "\" y1=\"" << top - 6 << "\" x2=\"" << num(x) << "\" y2=\""
        << axis_y << "\" stroke=\"#ddd\"/>\n"
        << "<text x=\"" << num(x) << "\" y=\"" << axis_y + 14 << "\" text-anchor=\"middle\">"
        << xmlEscape(strCat(vmax * k / 4)) << "</text>\n";
    }
  }
  if (budget > 0) {
    const double x = x_mem + panel_w * (budget / kGiB) / mem_max;
    o << "<line x1=\"" << num(x) << "\" y1=\"" << top - 10 << "\" x2=\"" << num(x) << "\" y2=\""
      << axis_y << "\" stroke=\"#d00\" stroke-dasharray=\"4,3\"/>\n"
      << "<text x=\"" << num(x) << "\" y=\"" << top - 14 << "\" fill=\"#d00\" "
      << "text-anchor=\"middle\">budget " << xmlEscape(formatBytes(budget)) << "</text>\n";
  }

  for (int r = 0; r < rows; ++r) {
    const Plan& p = plans[r];
    const bool fits = budget == 0 || p.gpu.total() <= budget;
    const int y = top + r * row_h;
    o << "<g opacity=\"" << (fits ? "1" : "0.35") << "\">\n"
      << "<text x=\"" << label_w - 8 << "\" y=\"" << y + 14 << "\" text-anchor=\"end\">"
      << xmlEscape(p.label()) << (fits ? "" : " (over budget)") << "</text>\n";
    const uint64_t mem_v[] = {p.gpu.params,        p.gpu.grads,         p.gpu.optimizer,
                              p.gpu.hpz_secondary, p.gpu.gathered_peak, p.gpu.comm_estimate};
    double x = x_mem;
    for (int s = 0; s < 6; ++s) {
      const double w = panel_w * (mem_v[s] / kGiB) / mem_max;
      if (w <= 0) continue;
      o << "<rect x=\"" << num(x) << "\" y=\"" << y + 3 << "\" width=\"" << num(w) << "\" height=\""
        << row_h - 6 << "\" fill=\"" << mem_segs[s].color << "\"><title>" << mem_segs[s].name
        << ": " << xmlEscape(formatBytes(mem_v[s])) << "</title></rect>\n";
      x += w;
    }
    o << "<text x=\"" << num(x + 4) << "\" y=\"" << y + 14 << "\">"
      << xmlEscape(formatBytes(p.gpu.total())) << "</text>\n";
    const uint64_t tr_v[] = {p.cross_node.all_gather, p.cross_node.reduce_scatter,
                             p.cross_node.all_reduce};
    x = x_tr;
    for (int s = 0; s < 3; ++s) {
      const double w = panel_w * (tr_v[s] / kGiB) / traffic_max;
      if (w <= 0) continue;
      o << "<rect x=\"" << num(x) << "\" y=\"" << y + 3 << "\" width=\"" << num(w) << "\" height=\""
        << row_h - 6 << "\" fill=\"" << tr_segs[s].color << "\"><title>" << tr_segs[s].name << ": "
        << xmlEscape(formatBytes(tr_v[s])) << "</title></rect>\n";
      x += w;
    }
    o << "<text x=\"" << num(x + 4) << "\" y=\"" << y + 14 << "\">"
      << xmlEscape(formatBytes(p.cross_node.total())) << "</text>\n</g>\n";
  }

  // Legends under the axes: fixed slots, three per row.
  auto legend = [&](const Seg* segs, int n, int x0) {
    for (int i = 0; i < n; ++i) {
      const int lx = x0 + (i % 3) * 120, ly = axis_y + 36 + (i / 3) * 16;
      o << "<rect x=\"" << lx << "\" y=\"" << ly - 9 << "\" width=\"10\" height=\"10\" fill=\""
        << segs[i].color << "\"/><text x=\"" << lx + 13 << "\" y=\"" << ly << "\">" << segs[i].name
        << "</text>\n";
    }
  };
  legend(mem_segs, 6, x_mem);
  legend(tr_segs, 3, x_tr);
  o << "</svg>\n";
  return o.str();
}

Status writeFileAtomically(const std::string& path, std::string_view content) {
  return files::writeFileAtomically(path, content);
}

}  // namespace hsdp
