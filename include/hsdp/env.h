// The one registry of HSDP_* environment parameters. Every variable hsdp reads is declared here
// with its type, default and documentation; `hsdp-env` prints the table. Reading an unregistered
// name is a programming error caught in tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hsdp/status.h"

namespace hsdp::env {

struct Param {
  const char* name;
  const char* type;           // "int", "bool", "string", "enum"
  const char* default_value;  // as the user would write it; "" when unset means "not used"
  const char* doc;
  // "int" parameters: the values accepted (parsed into int64 without wrapping; anything outside
  // is an error naming the variable and the value as written). Every int has a finite maximum,
  // so no setting can size a loop or an allocation without bound.
  int64_t min = 0;
  int64_t max = 0;
};

const std::vector<Param>& registry();

// Raw value ("" when unset). Registered names only.
std::string getString(const char* name);

// Parsed integer (hsdp/parse.h); nullopt when unset. A value that is not an integer, or outside
// the registered [min, max], is an InvalidArgument error naming the variable and the value.
StatusOr<std::optional<int64_t>> getInt(const char* name);

// Parsed boolean (1/0, true/false, on/off, yes/no); the registered default when unset.
StatusOr<bool> getBool(const char* name);

}  // namespace hsdp::env
