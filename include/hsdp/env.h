// HSDP_* environment parameters, declared where they are read (in the spirit of NCCL_PARAM).
//
// Each variable hsdp reads is one typed object, declared once at namespace scope in the file (or
// the module header) of its reader, with its default, its range and one line of documentation:
//
//   const env::IntParam kQuantBlock{"HSDP_QUANT_BLOCK", 2048, 16, 1048576,
//                                   "Elements per fp32 scale of the int8/int4 wires."};
//   HSDP_ASSIGN_OR_RETURN(int64_t block, kQuantBlock.value());
//
// Declaring registers the parameter; registry() lists every declared parameter of the program
// and `hsdp-env` prints them. There is no way to read a variable by name: a read of an
// undeclared variable does not compile, and the env.declared test fails on a name declared twice
// or read around this header (std::getenv("HSDP_...")).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hsdp/status.h"

namespace hsdp::env {

// What hsdp-env prints of a parameter.
struct Param {
  const char* name;
  const char* type;           // "int", "bool", "string", "enum", "number"
  const char* default_value;  // as the user would write it; "" when unset means "not used"
  const char* doc;
  // "int" parameters: the values accepted (parsed into int64 without wrapping; anything outside
  // is an error naming the variable and the value as written). Every int has a finite maximum,
  // so no setting can size a loop or an allocation without bound.
  int64_t min = 0;
  int64_t max = 0;
};

// Every parameter declared in this program, sorted by name (a name declared twice is listed
// twice, so that the registry test finds it).
const std::vector<Param>& registry();

// The common part of the declarations below: the name, the registry entry and the raw value.
class Declared {
 public:
  Declared(const Declared&) = delete;
  Declared& operator=(const Declared&) = delete;

  const char* name() const { return param_.name; }
  const Param& param() const { return param_; }
  // The value as set; "" when unset.
  std::string raw() const;
  // Set to something other than "".
  bool isSet() const;

 protected:
  explicit Declared(const Param& param);  // registers `param`
  Param param_;
};

// No typed default: what unset means, as hsdp-env prints it ("auto", or "" for "not used").
struct Unset {
  const char* meaning;
};

// An integer in [min, max]. With a default, value() is the default when unset; declared with
// Unset{...}, get() is nullopt when unset.
class IntParam : public Declared {
 public:
  IntParam(const char* name, int64_t default_value, int64_t min, int64_t max, const char* doc);
  IntParam(const char* name, Unset unset, int64_t min, int64_t max, const char* doc);
  // The value, else the default (nullopt when there is none). Not an integer in [min, max]: an
  // InvalidArgument naming the variable and the value as written.
  StatusOr<std::optional<int64_t>> get() const;
  // get() of a parameter declared with a default.
  StatusOr<int64_t> value() const;

 private:
  std::optional<int64_t> default_;
};

// 1/0, true/false, on/off, yes/no (any case); the default when unset.
class BoolParam : public Declared {
 public:
  BoolParam(const char* name, bool default_value, const char* doc);
  StatusOr<bool> get() const;

 private:
  bool default_;
};

// Free text ("string") or one of a set of words the reader parses ("enum"). get() is the value,
// else the default ("" when the default is "not set").
class StringParam : public Declared {
 public:
  enum class Kind { kString, kEnum };
  StringParam(const char* name, Kind kind, const char* default_value, const char* doc);
  std::string get() const;
};

// A positive finite real; nullopt when unset. A value that is not one is an InvalidArgument
// "<NAME>='<value>' is not <what>" (e.g. what = "a positive number of seconds").
class NumberParam : public Declared {
 public:
  NumberParam(const char* name, const char* default_text, const char* what, const char* doc);
  StatusOr<std::optional<double>> get() const;

 private:
  const char* what_;
};

// Parameters read by more than one module, declared by the lowest of them.
// HSDP_RANKS_PER_NODE: virtual nodes of k consecutive ranks (topology, the watchdog).
extern const IntParam kRanksPerNode;

}  // namespace hsdp::env
