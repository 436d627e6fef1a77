// The registry of declared HSDP_* parameters (hsdp/env.h) and their typed reads.
#include "hsdp/env.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "hsdp/parse.h"

namespace hsdp::env {

namespace {

// Filled by the declarations' constructors during static initialization (a function-local
// static, so it exists before the first of them runs, whatever the order of the files).
std::vector<Param>& table() {
  static std::vector<Param> params;
  return params;
}

void add(const Param& p) {
  std::vector<Param>& t = table();
  auto at = std::upper_bound(t.begin(), t.end(), p, [](const Param& a, const Param& b) {
    return std::strcmp(a.name, b.name) < 0;
  });
  t.insert(at, p);
}

std::string rawValue(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

}  // namespace

const std::vector<Param>& registry() { return table(); }

Declared::Declared(const Param& param) : param_(param) { add(param_); }

std::string Declared::raw() const { return rawValue(param_.name); }

bool Declared::isSet() const {
  const char* v = std::getenv(param_.name);
  return v != nullptr && *v != '\0';
}

// The default as hsdp-env prints it: the decimal text of the value, kept for the program's life
// (the registry holds a pointer to it).
static const char* decimalText(int64_t v) {
  static std::vector<std::unique_ptr<std::string>> texts;
  texts.push_back(std::make_unique<std::string>(std::to_string(v)));
  return texts.back()->c_str();
}

IntParam::IntParam(const char* name, int64_t default_value, int64_t min, int64_t max,
                   const char* doc)
    : Declared({name, "int", decimalText(default_value), doc, min, max}), default_(default_value) {}

IntParam::IntParam(const char* name, Unset unset, int64_t min, int64_t max, const char* doc)
    : Declared({name, "int", unset.meaning, doc, min, max}) {}

StatusOr<std::optional<int64_t>> IntParam::get() const {
  if (!isSet()) return default_;
  HSDP_ASSIGN_OR_RETURN(int64_t x, parseInt64(raw(), param_.name, param_.min, param_.max));
  return std::optional<int64_t>(x);
}

StatusOr<int64_t> IntParam::value() const {
  HSDP_ASSIGN_OR_RETURN(std::optional<int64_t> v, get());
  if (!v) return failedPrecondition(param_.name, " has no default: read it with get()");
  return *v;
}

BoolParam::BoolParam(const char* name, bool default_value, const char* doc)
    : Declared({name, "bool", default_value ? "1" : "0", doc}), default_(default_value) {}

StatusOr<bool> BoolParam::get() const {
  if (!isSet()) return default_;
  return parseBool(raw(), param_.name);
}

StringParam::StringParam(const char* name, Kind kind, const char* default_value, const char* doc)
    : Declared({name, kind == Kind::kEnum ? "enum" : "string", default_value, doc}) {}

std::string StringParam::get() const { return isSet() ? raw() : std::string(param_.default_value); }

NumberParam::NumberParam(const char* name, const char* default_text, const char* what,
                         const char* doc)
    : Declared({name, "number", default_text, doc}), what_(what) {}

StatusOr<std::optional<double>> NumberParam::get() const {
  if (!isSet()) return std::optional<double>();
  const std::string v = raw();
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (errno != 0 || end == v.c_str() || *end != '\0' || !std::isfinite(x) || x <= 0)
    return invalidArgument(param_.name, "='", v, "' is not ", what_);
  return std::optional<double>(x);
}

const IntParam kRanksPerNode{
    "HSDP_RANKS_PER_NODE", Unset{""}, 1, 1 << 20,
    "Virtual nodes for one-machine runs: group consecutive world ranks into nodes of this many "
    "ranks instead of grouping by shared-memory host. Must divide the world size."};

}  // namespace hsdp::env
