// The one JSON reader of the library: every JSON hsdp reads from a file or a peer (checkpoint
// manifests and part files, safetensors headers and indexes, topology snapshots, the elastic
// coordinator's answers) goes through parseJson. Before anything is built it makes one SAX pass
// over the text (nlohmann's sax_parse, no tree) that stops at
//   - the first container nested deeper than JsonLimits::max_depth (64: hsdp's own formats nest
//     at most 5 deep),
//   - the first key an object holds twice (nlohmann keeps the last one silently); only the keys
//     of the objects still open are kept, so this costs memory bounded by the input,
//   - a syntax error,
// and estimates the bytes the tree will take (each value, container and string as libstdc++ and
// glibc's malloc lay them out); an input whose tree would need more than JsonLimits::max_memory
// is refused naming the limit. So the memory a JSON input costs is at most a small constant
// times its size (docs/checkpoint.md, "File rules": K measured) and never a std::bad_alloc.
// Errors are kInvalidArgument "<where>: <what> ..." naming the limit and the path in the
// document ("tensors[3].chunks[0]"), file content escaped (files::quote).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "hsdp/status.h"

namespace hsdp {

// The deepest nesting of arrays and objects accepted ({"a": [1]} is 2 deep).
constexpr int kJsonMaxDepth = 64;
// The most memory a parsed document may take (the estimate of its tree, in bytes).
constexpr uint64_t kJsonMaxMemory = uint64_t{2} << 30;

struct JsonLimits {
  int max_depth = kJsonMaxDepth;
  uint64_t max_memory = kJsonMaxMemory;
  // Appended to "not valid JSON (...)" (e.g. "corrupt manifest"); empty: the byte offset.
  std::string_view hint = {};
};

// What the SAX pass saw: its error ("" when the text is within the limits), the deepest
// nesting, the values and the estimated bytes of the tree.
struct JsonCheck {
  std::string error;  // "nested deeper than ...", "key 'k' in a.b appears twice", ...
  int depth = 0;
  uint64_t values = 0;
  uint64_t tree_bytes = 0;
};
JsonCheck checkJson(std::string_view text, const JsonLimits& limits = {});

// The document, or InvalidArgument "<where>: <why>". Never throws.
StatusOr<nlohmann::json> parseJson(std::string_view text, std::string_view where,
                                   const JsonLimits& limits = {});

// `j` serialized for a terminal or a file: nlohmann's dump with every string's control bytes
// and 0x7f escaped (\u001b, \u007f) and bytes that are not UTF-8 replaced by U+FFFD. Never throws.
std::string dumpJsonEscaped(const nlohmann::json& j, int indent = -1);

}  // namespace hsdp
