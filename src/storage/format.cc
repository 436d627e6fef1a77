// The manifest's model and its JSON writer (nlohmann-json): the layout arithmetic, the checks
// every manifest passes (Manifest::finish) and serializeManifest. Reading one back, every field
// checked, is manifest_read.cc.
#include "storage/format.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "hsdp/files.h"

namespace hsdp::ckpt {

using json = nlohmann::json;

const char* stateName(State s) {
  switch (s) {
    case State::kParam:
      return "param";
    case State::kExpAvg:
      return "exp_avg";
    case State::kExpAvgSq:
      return "exp_avg_sq";
  }
  return "?";
}

uint64_t ParamDesc::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t UnitDesc::numel() const {
  uint64_t n = 0;
  for (const ParamDesc& p : params) n += p.numel();
  return n;
}

uint64_t UnitDesc::offset(size_t param) const {
  uint64_t n = 0;
  for (size_t i = 0; i < param; ++i) n += params[i].numel();
  return n;
}

std::string hex64(uint64_t v) {
  static const char* d = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[i] = d[v & 15];
  return s;
}

int Manifest::tensorIndex(int unit, int param, State s) const {
  if (unit < 0 || unit >= static_cast<int>(first_tensor.size())) return -1;
  const UnitDesc& u = units[unit];
  if (param < 0 || param >= static_cast<int>(u.params.size())) return -1;
  if (static_cast<int>(s) >= u.states()) return -1;
  return first_tensor[unit] + param * u.states() + static_cast<int>(s);
}

uint64_t Manifest::dataBytes() const {
  uint64_t b = 0;
  for (const FileDesc& f : files) b += f.bytes;
  return b;
}

Status Manifest::finish(const std::string& where) {
  std::vector<TensorDesc> want = tensorList(units);
  if (want.size() != tensors.size())
    return invalidArgument(where, ": ", tensors.size(), " tensors, the units describe ",
                           want.size());
  first_tensor.assign(units.size(), 0);
  for (size_t i = 0, u = 0; u < units.size(); ++u) {
    first_tensor[u] = static_cast<int>(i);
    i += units[u].params.size() * units[u].states();
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const TensorDesc& t = tensors[i];
    if (t.unit != want[i].unit || t.param != want[i].param || t.state != want[i].state)
      return invalidArgument(where, ": tensor ", i, " is not unit ", want[i].unit, " param ",
                             want[i].param, " state ", stateName(want[i].state),
                             " (tensors must follow unit, parameter, state order)");
    const uint64_t numel = units[t.unit].params[t.param].numel();
    uint64_t next = 0;
    for (const Chunk& c : t.chunks) {
      if (c.file < 0 || c.file >= static_cast<int>(files.size()))
        return invalidArgument(where, ": tensor ", i, ": chunk names file ", c.file, " of ",
                               files.size());
      // hsdp writes chunks of at most kChunkElems (a reader holds one whole to check it).
      if (c.count > kChunkElems)
        return invalidArgument(where, ": tensor ", i, ": a chunk of ", c.count,
                               " elements, more than the ", kChunkElems, " hsdp writes");
      if (c.start != next || c.count == 0 || c.count > numel - c.start)
        return invalidArgument(where, ": tensor ", i, ": chunks do not tile [0, ", numel,
                               ") (chunk at ", c.start, " of ", c.count, ", expected start ", next,
                               ")");
      const uint64_t fb = files[c.file].bytes;
      if (c.offset % sizeof(float) != 0 || c.offset > fb || c.count > (fb - c.offset) / 4)
        return invalidArgument(where, ": tensor ", i, ": chunk [", c.offset, ", +", c.count * 4,
                               ") lies outside ", files[c.file].name, " (", fb, " bytes)");
      next = c.start + c.count;
    }
    if (next != numel)
      return invalidArgument(where, ": tensor ", i, ": chunks cover ", next, " of ", numel,
                             " elements");
  }
  for (const UserEntry& e : user)
    if (e.file < 0 || e.file >= static_cast<int>(files.size()) || e.offset > files[e.file].bytes ||
        e.bytes > files[e.file].bytes - e.offset)
      return invalidArgument(where, ": user entry '", files::quote(e.key),
                             "' lies outside its file");
    else if (e.bytes > kMaxUserEntryBytes)
      return invalidArgument(where, ": user entry '", files::quote(e.key), "' is ", e.bytes,
                             " bytes, over the limit of ", kMaxUserEntryBytes, " bytes");
  // A data file ends where its last chunk or user entry does (plus alignment at most): a size
  // beyond that (a sparse file of any length matches it) would have readers hash nothing.
  std::vector<uint64_t> ends(files.size(), 0);
  for (const TensorDesc& t : tensors)
    for (const Chunk& c : t.chunks)
      ends[c.file] = std::max(ends[c.file], c.offset + c.count * sizeof(float));
  for (const UserEntry& e : user) ends[e.file] = std::max(ends[e.file], e.offset + e.bytes);
  for (size_t f = 0; f < files.size(); ++f)
    if (files[f].bytes > ends[f] + kAlign)
      return invalidArgument(where, ": ", files[f].name, " is said to be ", files[f].bytes,
                             " bytes, but its chunks and user entries end at byte ", ends[f]);
  return okStatus();
}

std::string serializeManifest(const Manifest& m) {
  json units = json::array();
  for (const UnitDesc& u : m.units) {
    json params = json::array();
    for (const ParamDesc& p : u.params)
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"weight_decay", p.weight_decay}});
    units.push_back({{"name", u.name}, {"frozen", u.frozen}, {"params", params}});
  }
  const SavedUnder& d = m.saved;
  json mesh = {{"world_size", d.mesh.world_size},
               {"num_nodes", d.mesh.num_nodes},
               {"ranks_per_node", d.mesh.ranks_per_node},
               {"intra_shard", d.mesh.intra_shard},
               {"inter_shard", d.mesh.inter_shard},
               {"shards", d.shards},
               {"replicas", d.replicas},
               {"mode", d.mode},
               {"hpz", d.hpz},
               {"offload_cpu", d.offload_cpu},
               {"param_dtype", d.param_dtype},
               {"reduce_dtype", d.reduce_dtype},
               {"device", d.device}};
  if (!d.elastic_job.empty())
    mesh["elastic"] = {{"job", d.elastic_job},
                       {"group", d.elastic_group},
                       {"committed_step", d.elastic_step},
                       {"groups_present", d.elastic_present}};
  const OptimDesc& o = m.optim;
  json optim = {{"kind", o.kind},          {"lr", o.lr},   {"beta1", o.beta1},
                {"beta2", o.beta2},        {"eps", o.eps}, {"weight_decay", o.weight_decay},
                {"clip_norm", o.clip_norm}};
  json files = json::array();
  for (const FileDesc& f : m.files)
    files.push_back({{"name", f.name},
                     {"rank", f.rank},
                     {"shard", f.shard},
                     {"replica", f.replica},
                     {"bytes", f.bytes},
                     {"xxh64", hex64(f.xxh64)}});
  json tensors = json::array();
  for (const TensorDesc& t : m.tensors) {
    const ParamDesc& p = m.units[t.unit].params[t.param];
    json chunks = json::array();
    for (const Chunk& c : t.chunks)
      chunks.push_back(json::array({c.file, c.offset, c.start, c.count, hex64(c.xxh64)}));
    tensors.push_back({{"name", joinedName(m.units[t.unit].name, p.name)},
                       {"unit", t.unit},
                       {"param", t.param},
                       {"state", stateName(t.state)},
                       {"dtype", "float32"},
                       {"shape", p.shape},
                       {"chunks", chunks}});
  }
  json user = json::array();
  for (const UserEntry& e : m.user)
    user.push_back({{"key", e.key},
                    {"file", e.file},
                    {"offset", e.offset},
                    {"bytes", e.bytes},
                    {"xxh64", hex64(e.xxh64)}});
  json j = {{"format", kFormatName},
            {"format_version", m.semi_sync ? kSemiSyncFormatVersion : m.version},
            {"step", m.step},
            {"created", m.created},
            {"model", {{"units", units}}},
            {"mesh", mesh},
            {"optimizer", optim},
            {"files", files},
            {"tensors", tensors},
            {"user", user}};
  if (m.semi_sync) {
    const ReplicaSyncDesc& r = m.replica_sync;
    j["replica_sync"] = {{"policy", r.policy},
                         {"sync_every", r.sync_every},
                         {"fragments", r.fragments},
                         {"outer_lr", r.outer_lr},
                         {"outer_momentum", r.outer_momentum},
                         {"replicas", r.replicas},
                         {"model_units", r.model_units},
                         {"step_in_period", r.step_in_period}};
    if (r.sync_delay > 0) j["replica_sync"]["sync_delay"] = r.sync_delay;
  }
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}
}  // namespace hsdp::ckpt
