// The manifest's JSON (nlohmann-json) and the layout arithmetic. The reader checks every field
// it uses, so a corrupt or hand-edited manifest is an error naming the field, never a crash (the
// fuzz target in tests/checkpoint drives parseManifest with arbitrary bytes).
#include "storage/format.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

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
      return invalidArgument(where, ": user entry '", e.key, "' lies outside its file");
    else if (e.bytes > kMaxUserEntryBytes)
      return invalidArgument(where, ": user entry '", e.key, "' is ", e.bytes,
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

namespace {

// Field readers: each checks the type (and range) and names the field on error.
struct Reader {
  const std::string& where;
  Status err;
  bool ok() const { return err.ok(); }
  void fail(const std::string& field, const std::string& what) {
    if (err.ok()) err = invalidArgument(where, ": field '", field, "' ", what);
  }
  const json* get(const json& j, const char* key, const std::string& ctx) {
    if (!j.is_object()) {
      fail(ctx, "is not an object");
      return nullptr;
    }
    auto it = j.find(key);
    if (it == j.end()) {
      fail(ctx.empty() ? key : ctx + "." + key, "is missing");
      return nullptr;
    }
    return &*it;
  }
  uint64_t u64(const json& j, const char* key, const std::string& ctx, uint64_t max) {
    const json* v = get(j, key, ctx);
    if (!v) return 0;
    if (!v->is_number_unsigned() || v->get<uint64_t>() > max) {
      fail(ctx + "." + key, strCat("is not an integer in [0, ", max, "]"));
      return 0;
    }
    return v->get<uint64_t>();
  }
  int i32(const json& j, const char* key, const std::string& ctx, int max) {
    return static_cast<int>(u64(j, key, ctx, static_cast<uint64_t>(max)));
  }
  std::string str(const json& j, const char* key, const std::string& ctx) {
    const json* v = get(j, key, ctx);
    if (!v) return {};
    if (!v->is_string()) {
      fail(ctx + "." + key, "is not a string");
      return {};
    }
    return v->get<std::string>();
  }
  bool boolean(const json& j, const char* key, const std::string& ctx) {
    const json* v = get(j, key, ctx);
    if (!v) return false;
    if (!v->is_boolean()) {
      fail(ctx + "." + key, "is not a boolean");
      return false;
    }
    return v->get<bool>();
  }
  float f32(const json& j, const char* key, const std::string& ctx) {
    const json* v = get(j, key, ctx);
    if (!v) return 0;
    if (!v->is_number()) {
      fail(ctx + "." + key, "is not a number");
      return 0;
    }
    // Converting a double beyond float's range is undefined behaviour: refuse it here.
    const double d = v->get<double>();
    if (!(std::abs(d) <= std::numeric_limits<float>::max())) {
      fail(ctx + "." + key, strCat("is ", d, ", which does not fit a float"));
      return 0;
    }
    return static_cast<float>(d);
  }
  uint64_t hash(const json& v, const std::string& ctx) {
    if (!v.is_string() || v.get_ref<const std::string&>().size() != 16) {
      fail(ctx, "is not a 16-digit hex xxh64");
      return 0;
    }
    uint64_t h = 0;
    for (char c : v.get_ref<const std::string&>()) {
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) {
        fail(ctx, "is not a 16-digit hex xxh64");
        return 0;
      }
      h = h << 4 | static_cast<uint64_t>(d);
    }
    return h;
  }
  const json* array(const json& j, const char* key, const std::string& ctx) {
    const json* v = get(j, key, ctx);
    if (v && !v->is_array()) {
      fail(ctx + "." + key, "is not an array");
      return nullptr;
    }
    return v;
  }
};

constexpr uint64_t kMaxDim = uint64_t{1} << 40;
constexpr uint64_t kMaxNumel = uint64_t{1} << 48;
constexpr uint64_t kMaxBytes = uint64_t{1} << 56;

void readUnits(Reader& r, const json& model, Manifest& m) {
  const json* units = r.array(model, "units", "model");
  if (!units) return;
  for (size_t u = 0; u < units->size() && r.ok(); ++u) {
    const std::string ctx = strCat("model.units[", u, "]");
    const json& ju = (*units)[u];
    UnitDesc d;
    d.name = r.str(ju, "name", ctx);
    d.frozen = r.boolean(ju, "frozen", ctx);
    const json* params = r.array(ju, "params", ctx);
    if (!params) return;
    if (params->empty()) r.fail(ctx + ".params", "is empty");
    uint64_t total = 0;
    for (size_t p = 0; p < params->size() && r.ok(); ++p) {
      const std::string pc = strCat(ctx, ".params[", p, "]");
      ParamDesc pd;
      pd.name = r.str((*params)[p], "name", pc);
      pd.weight_decay = r.boolean((*params)[p], "weight_decay", pc);
      const json* shape = r.array((*params)[p], "shape", pc);
      if (!shape) return;
      if (shape->empty()) r.fail(pc + ".shape", "is empty");
      uint64_t n = 1;
      for (const json& dim : *shape) {
        if (!dim.is_number_unsigned() || dim.get<uint64_t>() == 0 ||
            dim.get<uint64_t>() > kMaxDim || n > kMaxNumel / dim.get<uint64_t>()) {
          r.fail(pc + ".shape", "holds a dimension that is not a positive integer in range");
          return;
        }
        n *= dim.get<uint64_t>();
        pd.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
      }
      total += n;
      if (total > kMaxNumel) r.fail(ctx, "has too many elements");
      d.params.push_back(std::move(pd));
    }
    m.units.push_back(std::move(d));
  }
}

void readMesh(Reader& r, const json& j, MeshDesc& d) {
  const std::string c = "mesh";
  d.world_size = r.i32(j, "world_size", c, 1 << 24);
  d.num_nodes = r.i32(j, "num_nodes", c, 1 << 24);
  d.ranks_per_node = r.i32(j, "ranks_per_node", c, 1 << 24);
  d.intra_shard = r.i32(j, "intra_shard", c, 1 << 24);
  d.inter_shard = r.i32(j, "inter_shard", c, 1 << 24);
  d.shards = r.i32(j, "shards", c, 1 << 24);
  d.replicas = r.i32(j, "replicas", c, 1 << 24);
  d.mode = r.str(j, "mode", c);
  d.hpz = r.boolean(j, "hpz", c);
  d.offload_cpu = r.boolean(j, "offload_cpu", c);
  d.param_dtype = r.str(j, "param_dtype", c);
  d.reduce_dtype = r.str(j, "reduce_dtype", c);
  d.device = r.str(j, "device", c);
  if (r.ok() && (d.shards < 1 || d.replicas < 1 ||
                 static_cast<int64_t>(d.shards) * d.replicas != d.world_size))
    r.fail("mesh", strCat("shards ", d.shards, " x replicas ", d.replicas, " is not world_size ",
                          d.world_size));
}

void readOptim(Reader& r, const json& j, OptimDesc& o) {
  o.kind = r.str(j, "kind", "optimizer");
  o.lr = r.f32(j, "lr", "optimizer");
  o.beta1 = r.f32(j, "beta1", "optimizer");
  o.beta2 = r.f32(j, "beta2", "optimizer");
  o.eps = r.f32(j, "eps", "optimizer");
  o.weight_decay = r.f32(j, "weight_decay", "optimizer");
  o.clip_norm = r.f32(j, "clip_norm", "optimizer");
}

void readFiles(Reader& r, const json& files, Manifest& m) {
  for (size_t i = 0; i < files.size() && r.ok(); ++i) {
    const std::string c = strCat("files[", i, "]");
    FileDesc f;
    f.name = r.str(files[i], "name", c);
    if (r.ok() && (f.name.empty() || f.name.find('/') != std::string::npos || f.name[0] == '.'))
      r.fail(c + ".name", "is not a plain file name");
    f.rank = r.i32(files[i], "rank", c, 1 << 24);
    f.shard = r.i32(files[i], "shard", c, 1 << 24);
    f.replica = r.i32(files[i], "replica", c, 1 << 24);
    f.bytes = r.u64(files[i], "bytes", c, kMaxBytes);
    if (const json* h = r.get(files[i], "xxh64", c)) f.xxh64 = r.hash(*h, c + ".xxh64");
    m.files.push_back(std::move(f));
  }
}

void readTensors(Reader& r, const json& tensors, Manifest& m) {
  for (size_t i = 0; i < tensors.size() && r.ok(); ++i) {
    const std::string c = strCat("tensors[", i, "]");
    const json& jt = tensors[i];
    TensorDesc t;
    t.unit = r.i32(jt, "unit", c, 1 << 30);
    t.param = r.i32(jt, "param", c, 1 << 30);
    const std::string state = r.str(jt, "state", c);
    if (state == "param")
      t.state = State::kParam;
    else if (state == "exp_avg")
      t.state = State::kExpAvg;
    else if (state == "exp_avg_sq")
      t.state = State::kExpAvgSq;
    else if (r.ok())
      r.fail(c + ".state", "is not param, exp_avg or exp_avg_sq");
    if (r.ok() && r.str(jt, "dtype", c) != "float32") r.fail(c + ".dtype", "is not float32");
    const json* chunks = r.array(jt, "chunks", c);
    if (!chunks) return;
    for (size_t k = 0; k < chunks->size() && r.ok(); ++k) {
      const json& a = (*chunks)[k];
      if (!a.is_array() || a.size() != 5 || !a[0].is_number_unsigned() ||
          !a[1].is_number_unsigned() || !a[2].is_number_unsigned() || !a[3].is_number_unsigned() ||
          a[0].get<uint64_t>() > (1u << 24) || a[1].get<uint64_t>() > kMaxBytes ||
          a[2].get<uint64_t>() > kMaxNumel || a[3].get<uint64_t>() > kMaxNumel) {
        r.fail(strCat(c, ".chunks[", k, "]"), "is not [file, offset, start, count, xxh64]");
        return;
      }
      Chunk ch{static_cast<int>(a[0].get<uint64_t>()), a[1].get<uint64_t>(), a[2].get<uint64_t>(),
               a[3].get<uint64_t>(), 0};
      ch.xxh64 = r.hash(a[4], strCat(c, ".chunks[", k, "][4]"));
      t.chunks.push_back(ch);
    }
    m.tensors.push_back(std::move(t));
  }
}

// A SAX pass that stops at the first key an object repeats, keeping the path to it.
struct DuplicateKeys : nlohmann::json_sax<json> {
  struct Level {
    bool object = false;
    std::string name;  // the path to this container ("optimizer", "tensors[]")
    std::set<std::string> keys;
    std::string last;  // the last key read (objects)
  };
  std::vector<Level> stack;
  std::string found;

  std::string childName() const {
    if (stack.empty()) return "";
    const Level& l = stack.back();
    if (!l.object) return l.name + "[]";
    return l.name.empty() ? l.last : l.name + "." + l.last;
  }
  bool open(bool object) {
    stack.push_back({object, childName(), {}, {}});
    return true;
  }
  bool close() {
    stack.pop_back();
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(true); }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    Level& l = stack.back();
    l.last = k;
    if (l.keys.insert(k).second) return true;
    found = strCat("'", k, "' ", l.name.empty() ? "at the top level" : "in " + l.name);
    return false;  // stops the parse
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

}  // namespace

std::string duplicateJsonKey(std::string_view text) {
  DuplicateKeys sax;
  json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json,
                  /*strict=*/true);
  return sax.found;
}

StatusOr<Manifest> parseManifest(std::string_view text, const std::string& where) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalidArgument(where, ": not valid JSON (corrupt manifest)");
  if (!j.is_object()) return invalidArgument(where, ": not a JSON object");
  if (std::string dup = duplicateJsonKey(text); !dup.empty())
    return invalidArgument(where, ": key ", dup, " appears twice (a hand-edited manifest?)");
  Reader r{where, okStatus()};
  Manifest m;
  if (r.str(j, "format", "") != kFormatName && r.ok())
    return invalidArgument(where, ": not an hsdp checkpoint manifest (format is not '", kFormatName,
                           "')");
  m.version = r.i32(j, "format_version", "", 1 << 30);
  if (r.ok() && m.version != kFormatVersion)
    return invalidArgument(where, ": format_version ", m.version, "; this hsdp reads version ",
                           kFormatVersion);
  const json* step = r.get(j, "step", "");
  if (step && !step->is_number_integer()) r.fail("step", "is not an integer");
  if (step && r.ok()) m.step = step->get<int64_t>();
  if (r.ok() && m.step < 0) r.fail("step", "is negative");
  if (const json* c = r.get(j, "created", ""); c && c->is_string())
    m.created = c->get<std::string>();
  if (const json* model = r.get(j, "model", ""); model && r.ok()) readUnits(r, *model, m);
  if (const json* mesh = r.get(j, "mesh", ""); mesh && r.ok()) readMesh(r, *mesh, m.mesh);
  if (const json* o = r.get(j, "optimizer", ""); o && r.ok()) readOptim(r, *o, m.optim);
  if (const json* f = r.array(j, "files", ""); f && r.ok()) readFiles(r, *f, m);
  if (const json* t = r.array(j, "tensors", ""); t && r.ok()) readTensors(r, *t, m);
  if (const json* u = r.array(j, "user", ""); u && r.ok()) {
    for (size_t i = 0; i < u->size() && r.ok(); ++i) {
      const std::string c = strCat("user[", i, "]");
      UserEntry e;
      e.key = r.str((*u)[i], "key", c);
      e.file = r.i32((*u)[i], "file", c, 1 << 24);
      e.offset = r.u64((*u)[i], "offset", c, kMaxBytes);
      e.bytes = r.u64((*u)[i], "bytes", c, kMaxBytes);
      if (const json* h = r.get((*u)[i], "xxh64", c)) e.xxh64 = r.hash(*h, c + ".xxh64");
      m.user.push_back(std::move(e));
    }
  }
  if (!r.ok()) return r.err;
  HSDP_RETURN_IF_ERROR(checkTensorNames(m.units, where));
  HSDP_RETURN_IF_ERROR(m.finish(where));
  return m;
}

std::string serializeManifest(const Manifest& m) {
  json units = json::array();
  for (const UnitDesc& u : m.units) {
    json params = json::array();
    for (const ParamDesc& p : u.params)
      params.push_back({{"name", p.name}, {"shape", p.shape}, {"weight_decay", p.weight_decay}});
    units.push_back({{"name", u.name}, {"frozen", u.frozen}, {"params", params}});
  }
  const MeshDesc& d = m.mesh;
  json mesh = {{"world_size", d.world_size},
               {"num_nodes", d.num_nodes},
               {"ranks_per_node", d.ranks_per_node},
               {"intra_shard", d.intra_shard},
               {"inter_shard", d.inter_shard},
               {"shards", d.shards},
               {"replicas", d.replicas},
               {"mode", d.mode},
               {"hpz", d.hpz},
               {"offload_cpu", d.offload_cpu},
               {"param_dtype", d.param_dtype},
               {"reduce_dtype", d.reduce_dtype},
               {"device", d.device}};
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
    tensors.push_back({{"name", m.units[t.unit].name + "." + p.name},
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
            {"format_version", m.version},
            {"step", m.step},
            {"created", m.created},
            {"model", {{"units", units}}},
            {"mesh", mesh},
            {"optimizer", optim},
            {"files", files},
            {"tensors", tensors},
            {"user", user}};
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

StatusOr<Manifest> readManifest(const std::string& dir) {
  HSDP_ASSIGN_OR_RETURN(files::Dir d, files::Dir::open(dir));
  if (d.kindOf(kManifestName) == files::Kind::kMissing)
    return notFound("'", files::quote(dir), "' has no ", kManifestName,
                    " (not a committed checkpoint)");
  HSDP_ASSIGN_OR_RETURN(std::string text, d.readFile(kManifestName, kMaxManifestBytes, "manifest"));
  return parseManifest(text, d.join(kManifestName));
}

}  // namespace hsdp::ckpt
