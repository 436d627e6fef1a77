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
};

const std::vector<Param>& registry();

// Raw value ("" when unset). Registered names only.
std::string getString(const char* name);

// Parsed integer; nullopt when unset. A value that is not an integer, or below `min`, is an
// InvalidArgument error naming the variable and the value.
StatusOr<std::optional<int64_t>> getInt(const char* name, int64_t min = INT64_MIN);

// Parsed boolean (1/0, true/false, on/off, yes/no); the registered default when unset.
StatusOr<bool> getBool(const char* name);

}  // namespace hsdp::env
