// The manifest's JSON reader (nlohmann-json). It checks every field it uses, so a corrupt or
// hand-edited manifest is an error naming the field, never a crash (the fuzz target in
// tests/storage drives parseManifest with arbitrary bytes). The model and the writer are
// format.cc.
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/json.h"
#include "hsdp/files.h"
#include "storage/format.h"

namespace hsdp::ckpt {

using json = nlohmann::json;

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

void readMesh(Reader& r, const json& j, SavedUnder& d) {
  const std::string c = "mesh";
  d.mesh.world_size = r.i32(j, "world_size", c, 1 << 24);
  d.mesh.num_nodes = r.i32(j, "num_nodes", c, 1 << 24);
  d.mesh.ranks_per_node = r.i32(j, "ranks_per_node", c, 1 << 24);
  d.mesh.intra_shard = r.i32(j, "intra_shard", c, 1 << 24);
  d.mesh.inter_shard = r.i32(j, "inter_shard", c, 1 << 24);
  d.shards = r.i32(j, "shards", c, 1 << 24);
  d.replicas = r.i32(j, "replicas", c, 1 << 24);
  d.mode = r.str(j, "mode", c);
  d.hpz = r.boolean(j, "hpz", c);
  d.offload_cpu = r.boolean(j, "offload_cpu", c);
  d.param_dtype = r.str(j, "param_dtype", c);
  d.reduce_dtype = r.str(j, "reduce_dtype", c);
  d.device = r.str(j, "device", c);
  // Optional: an elastic group's save names its membership (written by hsdp; informational).
  // Every field is type-checked: a hostile manifest is an error naming the field, not a throw.
  if (auto e = j.find("elastic"); e != j.end()) {
    const std::string ec = "mesh.elastic";
    if (!e->is_object()) {
      r.fail(ec, "is not an object");
      return;
    }
    d.elastic_job = r.str(*e, "job", ec);
    d.elastic_group = r.i32(*e, "group", ec, 1 << 20);
    const json* step = r.get(*e, "committed_step", ec);
    if (step != nullptr && !(step->is_number_integer() && step->get<int64_t>() >= -1))
      r.fail(ec + ".committed_step", "is not an integer >= -1");
    else if (step != nullptr)
      d.elastic_step = step->get<int64_t>();
    const json* present = r.get(*e, "groups_present", ec);
    if (present != nullptr && !present->is_array()) r.fail(ec + ".groups_present", "is not a list");
    if (present != nullptr && present->is_array() && r.ok()) {
      for (const json& g : *present) {
        if (!g.is_number_unsigned() || g.get<uint64_t>() > (1u << 20)) {
          r.fail(ec + ".groups_present", "holds an entry that is not a group index");
          break;
        }
        d.elastic_present.push_back(static_cast<int>(g.get<uint64_t>()));
      }
    }
  }
  if (r.ok() && (d.shards < 1 || d.replicas < 1 ||
                 static_cast<int64_t>(d.shards) * d.replicas != d.mesh.world_size))
    r.fail("mesh", strCat("shards ", d.shards, " x replicas ", d.replicas, " is not world_size ",
                          d.mesh.world_size));
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

// format_version 2: the replica policy; step_in_period is checked against step once both are read.
void readReplicaSync(Reader& r, const json& j, Manifest& m) {
  ReplicaSyncDesc& d = m.replica_sync;
  const std::string c = "replica_sync";
  d.policy = r.str(j, "policy", c);
  if (r.ok() && d.policy != "local_sgd" && d.policy != "diloco")
    r.fail(c + ".policy", strCat("is '", files::quote(d.policy, 64), "', not local_sgd or diloco"));
  d.sync_every = r.i32(j, "sync_every", c, 1 << 30);
  d.fragments = r.i32(j, "fragments", c, 1 << 24);
  d.replicas = r.i32(j, "replicas", c, 1 << 24);
  d.model_units = r.i32(j, "model_units", c, 1 << 24);
  d.outer_lr = r.f32(j, "outer_lr", c);
  d.outer_momentum = r.f32(j, "outer_momentum", c);
  d.step_in_period = static_cast<int64_t>(r.u64(j, "step_in_period", c, uint64_t{1} << 30));
  if (j.contains("sync_delay")) d.sync_delay = r.i32(j, "sync_delay", c, 1 << 30);
  if (r.ok() && (d.sync_every < 1 || d.fragments < 1 || d.replicas < 2))
    r.fail(c, strCat("has sync_every ", d.sync_every, ", fragments ", d.fragments, " and replicas ",
                     d.replicas, " (need >= 1, >= 1 and >= 2)"));
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

}  // namespace

std::string duplicateJsonKey(std::string_view text) {
  const std::string e = hsdp::checkJson(text).error;
  const std::string_view head = "key ", tail = " appears twice";
  if (e.size() < head.size() + tail.size() || e.compare(0, head.size(), head) != 0 ||
      e.compare(e.size() - tail.size(), tail.size(), tail) != 0)
    return "";
  return e.substr(head.size(), e.size() - head.size() - tail.size());
}

StatusOr<Manifest> parseManifest(std::string_view text, const std::string& where) {
  // Depth, repeated keys and memory are checked before the tree is built (core/json.h).
  HSDP_ASSIGN_OR_RETURN(json j, hsdp::parseJson(text, where, {.hint = "corrupt manifest"}));
  if (!j.is_object()) return invalidArgument(where, ": not a JSON object");
  Reader r{where, okStatus()};
  Manifest m;
  if (r.str(j, "format", "") != kFormatName && r.ok())
    return invalidArgument(where, ": not an hsdp checkpoint manifest (format is not '", kFormatName,
                           "')");
  m.version = r.i32(j, "format_version", "", 1 << 30);
  if (r.ok() && m.version != kFormatVersion && m.version != kSemiSyncFormatVersion)
    return invalidArgument(where, ": format_version ", m.version, "; this hsdp reads versions ",
                           kFormatVersion, " and ", kSemiSyncFormatVersion);
  m.semi_sync = m.version == kSemiSyncFormatVersion;
  if (r.ok() && m.semi_sync != j.contains("replica_sync"))
    return invalidArgument(where, ": format_version ", m.version,
                           m.semi_sync ? " needs" : " has no", " field 'replica_sync'");
  if (r.ok() && m.semi_sync) readReplicaSync(r, j["replica_sync"], m);
  const json* step = r.get(j, "step", "");
  if (step && !step->is_number_integer()) r.fail("step", "is not an integer");
  if (step && r.ok()) m.step = step->get<int64_t>();
  if (r.ok() && m.step < 0) r.fail("step", "is negative");
  if (const json* c = r.get(j, "created", ""); c && c->is_string())
    m.created = c->get<std::string>();
  if (const json* model = r.get(j, "model", ""); model && r.ok()) readUnits(r, *model, m);
  if (const json* mesh = r.get(j, "mesh", ""); mesh && r.ok()) readMesh(r, *mesh, m.saved);
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
  if (m.semi_sync) {  // the units: every replica's copy, then (diloco) two per trainable unit
    const ReplicaSyncDesc& d = m.replica_sync;
    if (d.step_in_period != m.step % d.sync_every)
      return invalidArgument(where, ": replica_sync.step_in_period ", d.step_in_period,
                             " is not step ", m.step, " mod sync_every ", d.sync_every);
    const uint64_t base = uint64_t(d.model_units) * d.replicas;
    if (base > m.units.size() || (d.policy == "local_sgd" && base != m.units.size()) ||
        (d.policy == "diloco" && (m.units.size() - base) % 2 != 0))
      return invalidArgument(where, ": ", m.units.size(), " units do not fit replica_sync (",
                             d.replicas, " replicas of ", d.model_units, " units, policy ",
                             d.policy, ")");
  }
  HSDP_RETURN_IF_ERROR(checkTensorNames(m.units, where));
  HSDP_RETURN_IF_ERROR(m.finish(where));
  return m;
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
