// The layout arithmetic of checkpoints (format.h): which rank writes which elements of which
// tensor where in its data file, and the model comparison every reader starts with. Used by the
// engine's save and load, the offline reshard and export, so all of them agree by construction.
#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "storage/format.h"

namespace hsdp::ckpt {

uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string dataFileName(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "data-%05d.bin", rank);
  return buf;
}

std::vector<TensorDesc> tensorList(const std::vector<UnitDesc>& units) {
  std::vector<TensorDesc> t;
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t p = 0; p < units[u].params.size(); ++p)
      for (int s = 0; s < units[u].states(); ++s)
        t.push_back({static_cast<int>(u), static_cast<int>(p), static_cast<State>(s), {}});
  return t;
}

std::string shapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += strCat(i ? ", " : "", shape[i]);
  return s + "]";
}

Status compareUnits(const std::vector<UnitDesc>& saved, const std::vector<UnitDesc>& model,
                    const std::string& dir, bool moments) {
  auto differ = [&](auto&&... what) {
    return invalidArgument("checkpoint '", dir, "' does not match the model: ", what...);
  };
  for (size_t u = 0; u < std::max(saved.size(), model.size()); ++u) {
    if (u >= saved.size())
      return differ("the model's unit ", u, " '", model[u].name, "' is not in the checkpoint (",
                    saved.size(), " units)");
    if (u >= model.size())
      return differ("the checkpoint's unit ", u, " '", saved[u].name, "' is not in the model (",
                    model.size(), " units)");
    const UnitDesc &a = saved[u], &b = model[u];
    if (a.name != b.name)
      return differ("unit ", u, " is '", a.name, "' in the checkpoint, '", b.name,
                    "' in the model");
    for (size_t p = 0; p < std::max(a.params.size(), b.params.size()); ++p) {
      if (p >= a.params.size())
        return differ("parameter '", b.name, ".", b.params[p].name, "' is not in the checkpoint");
      if (p >= b.params.size())
        return differ("the checkpoint's parameter '", a.name, ".", a.params[p].name,
                      "' is not in the model");
      if (a.params[p].name != b.params[p].name)
        return differ("parameter ", p, " of unit '", a.name, "' is '", a.params[p].name,
                      "' in the checkpoint, '", b.params[p].name, "' in the model");
      if (a.params[p].shape != b.params[p].shape)
        return differ("parameter '", a.name, ".", a.params[p].name, "' has shape ",
                      shapeString(a.params[p].shape), " in the checkpoint, ",
                      shapeString(b.params[p].shape), " in the model");
    }
    if (moments && a.frozen && !b.frozen)
      return differ("unit '", a.name,
                    "' was frozen when saved (no optimizer state) but is "
                    "trainable in the model; load with LoadOptions::optimizer_state = false");
  }
  return okStatus();
}

std::string joinedName(std::string_view unit, std::string_view param) {
  if (unit.empty()) return std::string(param);
  std::string s;
  s.reserve(unit.size() + 1 + param.size());
  s.append(unit).append(".").append(param);
  return s;
}

Status checkTensorNames(const std::vector<UnitDesc>& units, const std::string& where) {
  auto fail = [&](auto&&... what) {
    return invalidArgument(where.empty() ? "" : where + ": ", what...);
  };
  std::map<std::string, size_t> unit_names;
  // Joined name -> (unit, param): the name a checkpoint and a safetensors file give the tensor.
  std::map<std::string, std::pair<size_t, size_t>> joined;
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitDesc& d = units[u];
    if (auto [it, fresh] = unit_names.emplace(d.name, u); !fresh)
      return fail("units ", it->second, " and ", u, " are both named '", d.name, "'");
    std::map<std::string, size_t> param_names;
    for (size_t p = 0; p < d.params.size(); ++p)
      if (auto [it, fresh] = param_names.emplace(d.params[p].name, p); !fresh)
        return fail("unit '", d.name, "' has two parameters named '", d.params[p].name,
                    "' (parameters ", it->second, " and ", p, ")");
    for (size_t p = 0; p < d.params.size(); ++p) {
      const std::string name = joinedName(d.name, d.params[p].name);
      auto [it, fresh] = joined.emplace(name, std::pair{u, p});
      if (fresh) continue;
      const UnitDesc& o = units[it->second.first];
      return fail("unit '", o.name, "' parameter '", o.params[it->second.second].name,
                  "' and unit '", d.name, "' parameter '", d.params[p].name,
                  "' are both the tensor '", name,
                  "' (checkpoints and safetensors name a tensor <unit>.<parameter>)");
    }
  }
  return okStatus();
}

Piece pieceOf(uint64_t numel, int shards, int replicas, int shard, int replica) {
  const uint64_t s = (numel + shards - 1) / shards;
  const uint64_t p = (s + replicas - 1) / replicas;
  const uint64_t b = static_cast<uint64_t>(shard) * s + std::min(s, replica * p);
  const uint64_t e = static_cast<uint64_t>(shard) * s + std::min(s, (replica + 1) * p);
  return {std::min(b, numel), std::min(e, numel)};
}

FilePlan planFile(const std::vector<UnitDesc>& units, int shards, int replicas, int shard,
                  int replica) {
  FilePlan plan;
  int tensor = 0;
  for (const UnitDesc& u : units) {
    const Piece piece = pieceOf(u.numel(), shards, replicas, shard, replica);
    const int states = u.states();
    for (int s = 0; s < states; ++s) {
      uint64_t off = 0;
      for (size_t p = 0; p < u.params.size(); ++p) {
        const uint64_t n = u.params[p].numel();
        const uint64_t b = std::max(piece.begin, off), e = std::min(piece.end, off + n);
        for (uint64_t x = b; x < e; x += kChunkElems) {
          const uint64_t count = std::min(kChunkElems, e - x);
          plan.bytes = alignUp(plan.bytes);
          plan.chunks.push_back(
              {tensor + static_cast<int>(p) * states + s, x - off, count, x, plan.bytes});
          plan.bytes += count * sizeof(float);
        }
        off += n;
      }
    }
    tensor += static_cast<int>(u.params.size()) * states;
  }
  return plan;
}

}  // namespace hsdp::ckpt

namespace hsdp::ckpt {

std::string replicaUnitName(int replica, std::string_view unit) {
  return strCat("replica", replica, "/", unit);
}

std::string outerUnitName(bool momentum, std::string_view unit) {
  return strCat(momentum ? "outer_momentum/" : "outer_anchor/", unit);
}

Status refuseSemiSync(const Manifest& m, const std::string& dir, std::string_view verb) {
  if (!m.semi_sync) return okStatus();
  return invalidArgument(verb, ": checkpoint '", dir, "' was saved with replica policy ",
                         m.replica_sync.policy, " (", m.replica_sync.replicas,
                         " replicas, each its own parameters and moments; format_version ",
                         kSemiSyncFormatVersion,
                         "), not one copy of the model: only a job with the same policy loads "
                         "it (verify, inspect and diff read it)");
}

}  // namespace hsdp::ckpt
