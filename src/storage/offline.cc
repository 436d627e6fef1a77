// What hsdp-ckpt runs, without MPI or a model: inspect, verify, diff and exportCheckpoint (the
// streaming reshard is reshard.cc, the tensor reader reader.cc), declared in
// hsdp/checkpoint_offline.h.
#include "storage/offline.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/json.h"
#include "hsdp/checkpoint_offline.h"
#include "hsdp/stop.h"
#include "storage/io.h"
#include "storage/safetensors.h"

namespace hsdp {

using namespace ckpt;

namespace {

struct Opened {
  std::string dir;
  Manifest m;
};
StatusOr<Opened> openCheckpoint(const std::string& path) {
  Opened o;
  HSDP_ASSIGN_OR_RETURN(o.dir, resolveCheckpointDir(path));
  HSDP_ASSIGN_OR_RETURN(o.m, readManifest(o.dir));
  return o;
}

std::function<void(const OfflineProgress&)>& progressFn() {
  static std::function<void(const OfflineProgress&)> fn;
  return fn;
}

}  // namespace

void setOfflineProgress(std::function<void(const OfflineProgress&)> fn) {
  progressFn() = std::move(fn);
}

namespace ckpt {

Status OfflineTicker::tick(uint64_t done) {
  done_ = done;
  if (progressFn()) progressFn()({phase_, unit_, done_, total_});
  if (!stopRequested()) return okStatus();
  return Status(StatusCode::kAborted,
                strCat("stopped by ", signalName(stopSignal()), " while ", phase_, ": ", done_,
                       " of ", total_, " ", unit_, " done; ", left_));
}

Status verifyDataFile(const std::string& dir_path, const Manifest& m, int f) {
  const FileDesc& d = m.files[f];
  const std::string path = dir_path + "/" + d.name;
  HSDP_ASSIGN_OR_RETURN(Dir dir, Dir::open(dir_path));
  HSDP_ASSIGN_OR_RETURN(File file_owned, openDataFile(m, dir, f));
  const File* file = &file_owned;
  std::vector<char> buf(std::min<uint64_t>(d.bytes, uint64_t{8} << 20));
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  Status s;
  for (uint64_t at = 0; at < d.bytes && s.ok(); at += buf.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), d.bytes - at));
    s = file->preadAll(buf.data(), n, at);
    if (s.ok()) XXH64_update(st, buf.data(), n);
  }
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  HSDP_RETURN_IF_ERROR(s);
  if (h == d.xxh64) return okStatus();
  for (size_t t = 0; t < m.tensors.size(); ++t)
    for (const Chunk& c : m.tensors[t].chunks) {
      if (c.file != f) continue;
      HSDP_RETURN_IF_ERROR(checkFitsInMemory(c.count * 4, "a chunk of " + path));
      buf.resize(c.count * 4);
      HSDP_RETURN_IF_ERROR(file->preadAll(buf.data(), buf.size(), c.offset));
      if (xxh64(buf.data(), buf.size()) != c.xxh64)
        return invalidArgument("data file '", path, "': bytes [", c.offset, ", ",
                               c.offset + c.count * 4, ") of tensor ",
                               tensorName(m, static_cast<int>(t)),
                               " fail their xxh64 checksum (corrupt file)");
    }
  for (const UserEntry& e : m.user) {
    if (e.file != f) continue;
    HSDP_RETURN_IF_ERROR(checkFitsInMemory(e.bytes, "user entry '" + files::quote(e.key) + "'"));
    buf.resize(e.bytes);
    HSDP_RETURN_IF_ERROR(file->preadAll(buf.data(), buf.size(), e.offset));
    if (xxh64(buf.data(), buf.size()) != e.xxh64)
      return invalidArgument("data file '", path, "': bytes [", e.offset, ", ", e.offset + e.bytes,
                             ") of user entry '", files::quote(e.key),
                             "' fail their xxh64 checksum (corrupt file)");
  }
  return invalidArgument("data file '", path,
                         "' fails its xxh64 checksum outside every chunk "
                         "(padding bytes changed)");
}

std::string checkpointSummaryJson(const std::string& dir, const Manifest& m,
                                  const std::vector<Status>* checks) {
  uint64_t params = 0;
  for (const UnitDesc& u : m.units) params += u.numel();
  bool all_ok = true;
  if (checks)
    for (const Status& c : *checks) all_ok = all_ok && c.ok();
  nlohmann::json units = nlohmann::json::array();
  for (const UnitDesc& u : m.units) {
    nlohmann::json ps = nlohmann::json::array();
    for (const ParamDesc& p : u.params) ps.push_back({{"name", p.name}, {"shape", p.shape}});
    units.push_back({{"name", u.name}, {"frozen", u.frozen}, {"params", ps}});
  }
  nlohmann::json files = nlohmann::json::array();
  for (size_t f = 0; f < m.files.size(); ++f) {
    nlohmann::json file = {{"name", m.files[f].name},
                           {"rank", m.files[f].rank},
                           {"bytes", m.files[f].bytes},
                           {"checksum_ok", nullptr}};
    if (checks) file["checksum_ok"] = (*checks)[f].ok();
    files.push_back(file);
  }
  nlohmann::json user = nlohmann::json::array();
  for (const UserEntry& e : m.user) user.push_back({{"key", e.key}, {"bytes", e.bytes}});
  // The mesh and optimizer exactly as the manifest spells them.
  const StatusOr<nlohmann::json> parsed = hsdp::parseJson(serializeManifest(m), dir);
  const nlohmann::json saved = parsed.ok() ? *parsed : nlohmann::json::object();
  nlohmann::json j = {{"dir", dir},
                      {"format_version", m.version},
                      {"step", m.step},
                      {"created", m.created},
                      {"mesh", saved["mesh"]},
                      {"optimizer", saved["optimizer"]},
                      {"parameters", params},
                      {"bytes", m.dataBytes()},
                      {"units", units},
                      {"files", files},
                      {"user", user},
                      {"checksums_ok", nullptr}};
  if (m.semi_sync) j["replica_sync"] = saved["replica_sync"];  // format_version 2
  if (checks) j["checksums_ok"] = all_ok;
  // Names that are not UTF-8 (a path, a hand-edited manifest) print as U+FFFD, never throw;
  // control bytes and 0x7f as \u001b, \u007f.
  return hsdp::dumpJsonEscaped(j, 2) + "\n";
}

}  // namespace ckpt

bool CheckpointDiff::identical() const {
  if (step_a != step_b) return false;
  for (const TensorDiff& t : tensors)
    if (t.max_abs != 0) return false;
  return true;
}

Status verifyCheckpoint(const std::string& path) {
  HSDP_ASSIGN_OR_RETURN(Opened o, openCheckpoint(path));
  OfflineTicker ticker("verifying", "bytes", o.m.dataBytes(),
                       strCat(o.m.files.size(), " data files, the rest not checked"));
  for (size_t f = 0; f < o.m.files.size(); ++f) {
    HSDP_RETURN_IF_ERROR(verifyDataFile(o.dir, o.m, static_cast<int>(f)));
    HSDP_RETURN_IF_ERROR(ticker.add(o.m.files[f].bytes));
  }
  return okStatus();
}

StatusOr<std::string> inspectCheckpoint(const std::string& path, bool as_json) {
  HSDP_ASSIGN_OR_RETURN(Opened o, openCheckpoint(path));
  const Manifest& m = o.m;
  std::vector<Status> checks;
  bool all_ok = true;
  for (size_t f = 0; f < m.files.size(); ++f) {
    checks.push_back(verifyDataFile(o.dir, o.m, static_cast<int>(f)));
    all_ok = all_ok && checks.back().ok();
  }
  uint64_t params = 0;
  for (const UnitDesc& u : m.units) params += u.numel();
  const SavedUnder& d = m.saved;
  if (as_json) return checkpointSummaryJson(o.dir, m, &checks);
  std::string s = strCat(
      "checkpoint ", files::quote(o.dir), "\n  format version ", m.version, ", step ", m.step,
      ", created ", files::quote(m.created, 64), "\n  saved under: mode ", files::quote(d.mode, 64),
      ", ", d.mesh.world_size, " ranks = ", d.mesh.num_nodes, " nodes x ", d.mesh.ranks_per_node,
      ", intra_shard ", d.mesh.intra_shard, " x inter_shard ", d.mesh.inter_shard, " (", d.shards,
      " shards x ", d.replicas, " replicas), hpz ", d.hpz ? "on" : "off", ", offload ",
      d.offload_cpu ? "cpu" : "none", ", params ", files::quote(d.param_dtype, 64), ", reduce ",
      files::quote(d.reduce_dtype, 64), ", device ", files::quote(d.device, 64),
      "\n  optimizer: ", files::quote(m.optim.kind, 64), " lr ", m.optim.lr, " betas (",
      m.optim.beta1, ", ", m.optim.beta2, ") eps ", m.optim.eps, " weight_decay ",
      m.optim.weight_decay, " clip_norm ", m.optim.clip_norm, "\n");
  if (m.semi_sync) {  // every replica's own copy, and the outer state (docs/checkpoint.md)
    const ReplicaSyncDesc& r = m.replica_sync;
    s += strCat("  replica policy ", r.policy, ": ", r.replicas, " replicas of ", r.model_units,
                " units, sync every ", r.sync_every, " steps (step ", r.step_in_period,
                " of the period), fragments ", r.fragments, ", outer lr ", r.outer_lr, " momentum ",
                r.outer_momentum, "\n");
    if (r.sync_delay > 0)
      s += strCat("  sync delay ", r.sync_delay, " steps (saved outside every delay window)\n");
  }
  if (!d.elastic_job.empty()) {  // an elastic group's save: the membership it was saved under
    std::string present;
    for (int g : d.elastic_present) present += strCat(present.empty() ? "" : ",", g);
    s += strCat("  elastic: job '", files::quote(d.elastic_job, 64), "', group ", d.elastic_group,
                ", committed step ", d.elastic_step, " by groups ", present, "\n");
  }
  s += "\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-28s %-20s %12s %s\n", "parameter", "shape", "elements",
                "state");
  s += line;
  for (const UnitDesc& u : m.units)
    for (const ParamDesc& p : u.params) {
      std::snprintf(line, sizeof line, "  %-28s %-20s %12llu %s\n",
                    files::quote(joinedName(u.name, p.name), 64).c_str(),
                    shapeString(p.shape).c_str(), static_cast<unsigned long long>(p.numel()),
                    u.frozen ? "param (frozen)" : "param, exp_avg, exp_avg_sq");
      s += line;
    }
  s += strCat("\n  ", m.units.size(), " units, ", params, " parameters\n\n");
  std::snprintf(line, sizeof line, "  %-16s %6s %14s %18s %s\n", "file", "rank", "bytes", "xxh64",
                "checksum");
  s += line;
  for (size_t f = 0; f < m.files.size(); ++f) {
    std::snprintf(line, sizeof line, "  %-16s %6d %14llu %18s %s\n",
                  files::quote(m.files[f].name, 64).c_str(), m.files[f].rank,
                  static_cast<unsigned long long>(m.files[f].bytes),
                  hex64(m.files[f].xxh64).c_str(), checks[f].ok() ? "ok" : "FAIL");
    s += line;
  }
  s += strCat("\n  ", m.dataBytes(), " bytes in ", m.files.size(),
              " files; checksums: ", all_ok ? "all ok" : "FAILING", "\n");
  for (size_t f = 0; f < checks.size(); ++f)
    if (!checks[f].ok()) s += "  " + files::printable(checks[f].message()) + "\n";
  for (const UserEntry& e : m.user)
    s += strCat("  user '", files::quote(e.key), "': ", e.bytes, " bytes\n");
  return s;
}

StatusOr<CheckpointDiff> diffCheckpoints(const std::string& pa, const std::string& pb) {
  HSDP_ASSIGN_OR_RETURN(Opened a, openCheckpoint(pa));
  HSDP_ASSIGN_OR_RETURN(Opened b, openCheckpoint(pb));
  HSDP_RETURN_IF_ERROR(compareUnits(a.m.units, b.m.units, b.dir, /*moments=*/false));
  CheckpointDiff out;
  out.step_a = a.m.step;
  out.step_b = b.m.step;
  TensorReader ra(a.m, a.dir, true), rb(b.m, b.dir, true);
  std::vector<float> xa, xb;
  OfflineTicker ticker("comparing", "bytes", a.m.dataBytes(), "the remaining tensors not compared");
  for (size_t t = 0; t < a.m.tensors.size(); ++t) {
    const TensorDesc& ta = a.m.tensors[t];
    const int tb = b.m.tensorIndex(ta.unit, ta.param, ta.state);
    if (tb < 0) continue;
    const uint64_t n = a.m.units[ta.unit].params[ta.param].numel();
    TensorDiff d{tensorName(a.m, static_cast<int>(t)), 0, 0};
    double max_b = 0;
    for (uint64_t at = 0; at < n; at += kChunkElems) {
      const uint64_t e = std::min(n, at + kChunkElems);
      xa.resize(e - at);
      xb.resize(e - at);
      HSDP_RETURN_IF_ERROR(ra.read(static_cast<int>(t), at, e, xa.data()));
      HSDP_RETURN_IF_ERROR(rb.read(tb, at, e, xb.data()));
      HSDP_RETURN_IF_ERROR(ticker.add((e - at) * 4));
      for (size_t i = 0; i < xa.size(); ++i) {
        // Bitwise: a NaN equal to itself counts as no difference.
        const double diff =
            std::memcmp(&xa[i], &xb[i], 4) == 0 ? 0 : std::fabs(double(xa[i]) - xb[i]);
        d.max_abs = std::max(d.max_abs, std::isnan(diff) ? INFINITY : diff);
        max_b = std::max(max_b, std::fabs(double(xb[i])));
      }
    }
    d.max_rel = d.max_abs == 0 ? 0 : max_b > 0 ? d.max_abs / max_b : INFINITY;
    out.tensors.push_back(d);
  }
  return out;
}

StatusOr<std::vector<std::string>> exportCheckpoint(const std::string& path, const std::string& out,
                                                    const ExportOptions& options) {
  HSDP_ASSIGN_OR_RETURN(Opened o, openCheckpoint(path));
  HSDP_RETURN_IF_ERROR(refuseSemiSync(o.m, o.dir, "export"));
  std::vector<SafetensorsWriter::Tensor> list;
  for (const UnitDesc& u : o.m.units)
    for (const ParamDesc& p : u.params) list.push_back({joinedName(u.name, p.name), p.shape});
  HSDP_ASSIGN_OR_RETURN(
      SafetensorsWriter w,
      SafetensorsWriter::create(out, std::move(list), options.dtype, options.max_shard_bytes));
  // Never onto the checkpoint itself (its manifest, a data file, a path inside it).
  HSDP_RETURN_IF_ERROR(w.checkTargets({o.dir, path}));
  TensorReader reader(o.m, o.dir, /*verify=*/true);
  std::vector<float> buf;
  uint64_t total = 0;
  for (const UnitDesc& u : o.m.units) total += u.numel() * 4;
  // A stop returns early: the writer's destructor removes its temporaries, `out` is not made.
  OfflineTicker ticker("exporting", "bytes", total,
                       strCat("no safetensors file written (", files::quote(out), ")"));
  for (size_t u = 0; u < o.m.units.size(); ++u)
    for (size_t p = 0; p < o.m.units[u].params.size(); ++p) {
      const int t = o.m.tensorIndex(static_cast<int>(u), static_cast<int>(p), State::kParam);
      const uint64_t n = o.m.units[u].params[p].numel();
      for (uint64_t at = 0; at < n; at += kChunkElems) {
        const uint64_t e = std::min(n, at + kChunkElems);
        buf.resize(e - at);
        HSDP_RETURN_IF_ERROR(reader.read(t, at, e, buf.data()));
        HSDP_RETURN_IF_ERROR(w.append(buf.data(), buf.size()));
        HSDP_RETURN_IF_ERROR(ticker.add(buf.size() * 4));
      }
    }
  return w.finish();
}

}  // namespace hsdp
