#include "storage/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/json.h"
#include "hsdp/files.h"

namespace hsdp::ckpt {

using json = nlohmann::json;

namespace {

uint64_t dtypeBytes(const std::string& d) {
  static const std::map<std::string, uint64_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::string stem(const std::string& out) {
  const std::string ext = ".safetensors";
  if (out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0)
    return out.substr(0, out.size() - ext.size());
  return out;
}

}  // namespace

StatusOr<SafetensorsHeader> parseSafetensorsHeader(std::string_view text, uint64_t data_bytes,
                                                   const std::string& where) {
  // Depth, repeated keys (nlohmann-json keeps the last of two; Python's safetensors refuses the
  // file) and memory are checked before the tree is built (core/json.h).
  HSDP_ASSIGN_OR_RETURN(
      json j, hsdp::parseJson(text, where, {.hint = "the safetensors header is not JSON"}));
  if (!j.is_object())
    return invalidArgument(where, ": the safetensors header is not a JSON object");
  SafetensorsHeader h;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return invalidArgument(where, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return invalidArgument(where, ": __metadata__ value '", files::quote(m.key()),
                                 "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const char* what) {
      return invalidArgument(where, ": tensor '", files::quote(name), "': ", what);
    };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      return bad("needs dtype, shape and data_offsets");
    StTensor t;
    t.name = name;
    if (!v["dtype"].is_string()) return bad("dtype is not a string");
    t.dtype = v["dtype"].get<std::string>();
    const uint64_t esize = dtypeBytes(t.dtype);
    if (esize == 0) return bad("unknown dtype");
    if (!v["shape"].is_array()) return bad("shape is not an array");
    uint64_t numel = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40))
        return bad("shape holds a dimension that is not a non-negative integer in range");
      const uint64_t x = d.get<uint64_t>();
      if (x != 0 && numel > (uint64_t{1} << 56) / x) return bad("shape is too large");
      numel *= x;
      t.shape.push_back(static_cast<int64_t>(x));
    }
    const json& o = v["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      return bad("data_offsets is not [begin, end]");
    t.begin = o[0].get<uint64_t>();
    t.end = o[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_bytes)
      return bad("data_offsets lie outside the file's data");
    if (t.end - t.begin != numel * esize) return bad("data_offsets do not match dtype x shape");
    ranges.push_back({t.begin, t.end});
    h.tensors.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      return invalidArgument(where, ": two tensors' data_offsets overlap");
  return h;
}

namespace {

// An index and its shards: 64 MiB of JSON maps millions of tensors.
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

Status openOne(File f, SafetensorsSet* set, std::vector<StTensor>* out) {
  const std::string path = f.path();
  HSDP_ASSIGN_OR_RETURN(uint64_t size, f.size());
  uint64_t n = 0;
  if (size < 8) return invalidArgument(path, ": ", size, " bytes, too short for safetensors");
  HSDP_RETURN_IF_ERROR(f.preadAll(&n, 8, 0));
  if (n > kMaxSafetensorsHeader || n > size - 8)
    return invalidArgument(path, ": header length ", n, " does not fit the file (", size,
                           " bytes)");
  std::string text(n, '\0');
  HSDP_RETURN_IF_ERROR(f.preadAll(text.data(), n, 8));
  HSDP_ASSIGN_OR_RETURN(SafetensorsHeader h, parseSafetensorsHeader(text, size - 8 - n, path));
  const int idx = static_cast<int>(set->files.size());
  for (StTensor& t : h.tensors) {
    t.file = idx;
    out->push_back(std::move(t));
  }
  set->paths.push_back(path);
  set->files.push_back(std::move(f));
  set->data_start.push_back(8 + n);
  return okStatus();
}

}  // namespace

StatusOr<SafetensorsSet> openSafetensors(const std::string& path_in) {
  std::string path = path_in;
  if (files::kindOf(path) == files::Kind::kMissing &&
      files::kindOf(stem(path) + ".safetensors.index.json") != files::Kind::kMissing)
    path = stem(path) + ".safetensors.index.json";
  SafetensorsSet set;
  std::vector<StTensor> tensors;
  const bool is_index = path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  if (!is_index) {
    HSDP_ASSIGN_OR_RETURN(File f, File::openRead(path));
    HSDP_RETURN_IF_ERROR(openOne(std::move(f), &set, &tensors));
  } else {
    HSDP_ASSIGN_OR_RETURN(std::string text,
                          files::readBounded(path, kMaxIndexBytes, "safetensors index"));
    HSDP_ASSIGN_OR_RETURN(json j, hsdp::parseJson(text, files::quote(path)));
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      return invalidArgument(path, ": not a safetensors index (no weight_map object)");
    // The shards are names beside the index, opened relative to its directory (no links).
    HSDP_ASSIGN_OR_RETURN(files::PathParts parts, files::splitPath(path));
    HSDP_ASSIGN_OR_RETURN(Dir dir, Dir::open(parts.dir));
    std::map<std::string, std::string> want;
    std::set<std::string> names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string() || it.value().get<std::string>().find('/') != std::string::npos)
        return invalidArgument(path, ": weight_map['", files::quote(it.key()),
                               "'] is not a file name");
      want[it.key()] = it.value().get<std::string>();
      names.insert(it.value().get<std::string>());
    }
    std::map<std::string, int> file_index;
    for (const std::string& n : names) {
      file_index[n] = static_cast<int>(set.files.size());
      HSDP_ASSIGN_OR_RETURN(File f, File::openReadAt(dir, n));
      HSDP_RETURN_IF_ERROR(openOne(std::move(f), &set, &tensors));
    }
    for (const StTensor& t : tensors) {
      auto w = want.find(t.name);
      if (w == want.end() || file_index[w->second] != t.file)
        return invalidArgument(path, ": tensor '", files::quote(t.name), "' of ", set.paths[t.file],
                               " is not mapped to that file by the index");
    }
    if (want.size() != tensors.size())
      return invalidArgument(path, ": the index maps ", want.size(), " tensors, its files hold ",
                             tensors.size());
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!set.by_name.emplace(tensors[i].name, static_cast<int>(i)).second)
      return invalidArgument(path, ": tensor '", files::quote(tensors[i].name), "' appears twice");
  set.tensors = std::move(tensors);
  return set;
}

Status SafetensorsSet::read(int t, uint64_t start, uint64_t count, float* dst) {
  const StTensor& x = tensors[t];
  const uint64_t base = data_start[x.file] + x.begin;
  if (x.dtype == "F32") return files[x.file].preadAll(dst, count * 4, base + start * 4);
  if (x.dtype != "BF16")
    return invalidArgument(paths[x.file], ": tensor '", files::quote(x.name), "' is ",
                           files::quote(x.dtype), "; hsdp reads F32 and BF16");
  buf16_.resize(count);
  HSDP_RETURN_IF_ERROR(files[x.file].preadAll(buf16_.data(), count * 2, base + start * 2));
  for (uint64_t i = 0; i < count; ++i) dst[i] = toFloat(bf16{buf16_[i]});
  return okStatus();
}

Status matchTensors(const SafetensorsSet& set, const std::vector<UnitDesc>& units, bool strict,
                    const TensorNames& names, std::vector<std::vector<int>>* index) {
  const std::string where = set.paths.empty() ? "" : set.paths[0];
  std::vector<char> used(set.tensors.size(), 0);
  index->assign(units.size(), {});
  for (size_t u = 0; u < units.size(); ++u) {
    for (const ParamDesc& p : units[u].params) {
      const std::string base = joinedName(units[u].name, p.name);
      std::string name = names.prefixes.empty() ? base : names.prefixes[0] + base;
      auto it = set.by_name.end();
      for (const std::string& prefix : names.prefixes)
        if (it == set.by_name.end()) it = set.by_name.find(name = prefix + base);
      if (it == set.by_name.end()) {
        if (strict) return invalidArgument(where, ": no tensor '", base, "' (strict load)");
        (*index)[u].push_back(-1);
        continue;
      }
      const StTensor& t = set.tensors[it->second];
      if (t.shape != p.shape) {
        std::string a, b;
        for (int64_t d : t.shape) a += strCat(a.empty() ? "" : ", ", d);
        for (int64_t d : p.shape) b += strCat(b.empty() ? "" : ", ", d);
        return invalidArgument(set.paths[t.file], ": tensor '", name, "' has shape [", a,
                               "], the model's parameter [", b, "]");
      }
      if (t.dtype != "F32" && t.dtype != "BF16")
        return invalidArgument(set.paths[t.file], ": tensor '", name, "' is ", t.dtype,
                               "; hsdp reads F32 and BF16");
      used[it->second] = 1;
      (*index)[u].push_back(it->second);
    }
  }
  for (size_t i = 0; strict && i < used.size(); ++i)
    if (!used[i] && !names.ignore.count(set.tensors[i].name))
      return invalidArgument(set.paths[set.tensors[i].file], ": tensor '",
                             files::quote(set.tensors[i].name),
                             "' is not a parameter of the model (strict load)");
  return okStatus();
}

StatusOr<SafetensorsWriter> SafetensorsWriter::create(const std::string& out,
                                                      std::vector<Tensor> tensors, DType dtype,
                                                      uint64_t max_shard_bytes) {
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16)
    return invalidArgument("export: dtype ", dtypeName(dtype), " is neither float32 nor bf16");
  if (tensors.empty()) return invalidArgument("export: no tensors");
  // Two tensors of one name would leave one of them unreadable (safetensors keys are unique).
  std::set<std::string> seen;
  for (const Tensor& t : tensors)
    if (!seen.insert(t.name).second)
      return invalidArgument("export: two tensors are named '", files::quote(t.name), "'");
  SafetensorsWriter w;
  w.out_ = out;
  w.dtype_ = dtype;
  const uint64_t esize = dtype == DType::kFloat32 ? 4 : 2;
  uint64_t in_shard = 0;
  size_t shards = 1;
  for (const Tensor& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    if (in_shard > 0 && in_shard + n * esize > max_shard_bytes) {
      ++shards;
      in_shard = 0;
    }
    in_shard += n * esize;
    w.total_bytes_ += n * esize;
    w.shard_of_.push_back(shards - 1);
  }
  if (shards == 1) {
    w.names_.push_back(out);
  } else {
    for (size_t s = 0; s < shards; ++s) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", s + 1, shards);
      w.names_.push_back(stem(out) + buf);
    }
  }
  w.tensors_ = std::move(tensors);
  return w;
}

Status SafetensorsWriter::openShard(size_t shard) {
  const uint64_t esize = dtype_ == DType::kFloat32 ? 4 : 2;
  json h = json::object();
  h["__metadata__"] = {{"format", "pt"}};
  uint64_t at = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (shard_of_[i] != shard) continue;
    uint64_t n = 1;
    for (int64_t d : tensors_[i].shape) n *= static_cast<uint64_t>(d);
    h[tensors_[i].name] = {{"dtype", dtype_ == DType::kFloat32 ? "F32" : "BF16"},
                           {"shape", tensors_[i].shape},
                           {"data_offsets", {at, at + n * esize}}};
    at += n * esize;
  }
  std::string text = h.dump(-1, ' ', false, json::error_handler_t::replace);
  text.append((8 - (text.size() % 8)) % 8, ' ');  // the data starts 8-byte aligned
  if (!dir_) {
    HSDP_ASSIGN_OR_RETURN(files::PathParts parts, files::splitPath(out_));
    HSDP_ASSIGN_OR_RETURN(Dir d, Dir::open(parts.dir));
    dir_ = std::make_unique<Dir>(std::move(d));
  }
  HSDP_ASSIGN_OR_RETURN(files::PathParts name, files::splitPath(names_[shard]));
  const std::string tmp = files::tempName(name.name);
  HSDP_RETURN_IF_ERROR(dir_->removeFile(tmp));  // this job's own leftover only
  HSDP_ASSIGN_OR_RETURN(file_, File::createNewAt(*dir_, tmp));
  temps_.push_back(tmp);
  const uint64_t n = text.size();
  HSDP_RETURN_IF_ERROR(file_.writeAll(&n, 8));
  HSDP_RETURN_IF_ERROR(file_.writeAll(text.data(), text.size()));
  shard_ = shard;
  return okStatus();
}

Status SafetensorsWriter::append(const float* data, size_t n) {
  while (n > 0) {
    if (tensor_ >= tensors_.size()) return internalError("export: more data than tensors");
    if (!file_.path().empty() && shard_of_[tensor_] != shard_) {
      HSDP_RETURN_IF_ERROR(file_.sync());
      HSDP_RETURN_IF_ERROR(file_.close());
      file_ = File();
    }
    if (file_.path().empty()) HSDP_RETURN_IF_ERROR(openShard(shard_of_[tensor_]));
    uint64_t numel = 1;
    for (int64_t d : tensors_[tensor_].shape) numel *= static_cast<uint64_t>(d);
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, numel - done_));
    if (dtype_ == DType::kFloat32) {
      HSDP_RETURN_IF_ERROR(file_.writeAll(data, take * 4));
    } else {
      buf16_.resize(take);
      for (size_t i = 0; i < take; ++i) buf16_[i] = toBf16(data[i]).bits;
      HSDP_RETURN_IF_ERROR(file_.writeAll(buf16_.data(), take * 2));
    }
    data += take;
    n -= take;
    done_ += take;
    if (done_ == numel) {
      ++tensor_;
      done_ = 0;
    }
  }
  return okStatus();
}

SafetensorsWriter::~SafetensorsWriter() {
  if (!dir_) return;
  for (const std::string& t : temps_)
    if (!t.empty()) (void)dir_->removeFile(t);
}

Status SafetensorsWriter::checkTargets(const std::vector<std::string>& inputs) const {
  for (const std::string& f : plannedFiles())
    HSDP_RETURN_IF_ERROR(files::checkOutputTarget(f, {}, inputs).withContext("export"));
  return okStatus();
}

std::vector<std::string> SafetensorsWriter::plannedFiles() const {
  std::vector<std::string> f = names_;
  if (names_.size() > 1) f.push_back(stem(out_) + ".safetensors.index.json");
  return f;
}

StatusOr<std::vector<std::string>> SafetensorsWriter::finish() {
  if (tensor_ != tensors_.size()) return internalError("export: tensors left unwritten");
  HSDP_RETURN_IF_ERROR(file_.sync());
  HSDP_RETURN_IF_ERROR(file_.close());
  std::vector<std::string> done;
  for (size_t i = 0; i < names_.size(); ++i) {
    HSDP_ASSIGN_OR_RETURN(files::PathParts name, files::splitPath(names_[i]));
    // Checked before writing (checkTargets); checked again: a directory, device or link that
    // appeared meanwhile is not replaced.
    const files::Kind k = dir_->kindOf(name.name);
    if (k != files::Kind::kMissing && k != files::Kind::kRegular)
      return invalidArgument("export: '", files::quote(names_[i]), "' is ", files::kindName(k),
                             "; not replaced");
    HSDP_RETURN_IF_ERROR(dir_->rename(temps_[i], name.name, Dir::Rename::kReplace));
    temps_[i].clear();
    done.push_back(names_[i]);
  }
  HSDP_RETURN_IF_ERROR(dir_->sync());
  if (names_.size() > 1) {
    json map = json::object();
    for (size_t i = 0; i < tensors_.size(); ++i)
      map[tensors_[i].name] = names_[shard_of_[i]].substr(names_[shard_of_[i]].rfind('/') + 1);
    json index = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", map}};
    const std::string path = stem(out_) + ".safetensors.index.json";
    HSDP_ASSIGN_OR_RETURN(files::PathParts name, files::splitPath(path));
    HSDP_RETURN_IF_ERROR(dir_->replaceFile(
        name.name, index.dump(2, ' ', false, json::error_handler_t::replace) + "\n"));
    done.push_back(path);
  }
  return done;
}

}  // namespace hsdp::ckpt
