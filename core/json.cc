#include "core/json.h"

#include <algorithm>
#include <string>
#include <vector>

#include "hsdp/files.h"

namespace hsdp {

using nlohmann::json;

namespace {

// What the tree costs per element (libstdc++ on x86-64, glibc malloc: 16 bytes of chunk header,
// sizes rounded up to 16). A json value is 16 bytes; an array keeps its elements in a vector
// that grows by doubling (up to 2x); an object's member is a std::map node (32 bytes of links, a
// std::string key, the value) in its own chunk; an array, object or string value owns one heap
// object (std::vector 24, std::map 48, std::string 32 bytes) plus, for a string or key longer
// than the 15 bytes kept inline, its characters.
constexpr uint64_t kChunk = 16;
uint64_t chunk(uint64_t bytes) { return (bytes + 8 + kChunk - 1) / kChunk * kChunk; }
uint64_t heapChars(uint64_t n) { return n > 15 ? chunk(n + 1) : 0; }
constexpr uint64_t kArrayElement = 2 * 16;  // a value in a vector of capacity <= 2x its size
uint64_t objectMember(uint64_t key) { return chunk(32 + 32 + 16) + heapChars(key); }

class CheckSax : public nlohmann::json_sax<json> {
 public:
  explicit CheckSax(const JsonLimits& l) : limits_(l) {}

  JsonCheck result;

  bool null() override { return value(0); }
  bool boolean(bool) override { return value(0); }
  bool number_integer(number_integer_t) override { return value(0); }
  bool number_unsigned(number_unsigned_t) override { return value(0); }
  bool number_float(number_float_t, const string_t&) override { return value(0); }
  bool string(string_t& s) override { return value(chunk(32) + heapChars(s.size())); }
  bool binary(binary_t&) override { return value(0); }
  bool start_object(std::size_t) override { return open(true, chunk(48)); }
  bool start_array(std::size_t) override { return open(false, chunk(24)); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    Level& l = stack_.back();
    l.key = k;
    result.tree_bytes += objectMember(k.size());
    // Small objects (every object hsdp writes): a linear scan finds a repeat at once; a wide
    // object's keys are sorted and compared when it closes.
    if (l.keys.size() < kScanKeys)
      for (const std::string& seen : l.keys)
        if (seen == k) return duplicate(k);
    l.keys.push_back(k);
    return memoryOk();
  }
  bool parse_error(std::size_t pos, const std::string&,
                   const nlohmann::detail::exception&) override {
    syntax_pos_ = pos;
    syntax_ = true;
    return false;
  }
  bool syntaxError() const { return syntax_; }
  size_t syntaxPos() const { return syntax_pos_; }

 private:
  struct Level {
    bool object = false;
    uint64_t index = 0;             // arrays: elements begun so far
    std::string key;                // objects: the key being read
    std::vector<std::string> keys;  // objects: the keys read so far
  };
  static constexpr size_t kScanKeys = 16;

  // A value begins in the innermost container: count it, step its array index.
  void element() {
    ++result.values;
    if (stack_.empty()) return;
    Level& l = stack_.back();
    if (!l.object) {
      ++l.index;
      result.tree_bytes += kArrayElement;
    }
  }
  bool value(uint64_t own) {
    element();
    result.tree_bytes += own;
    return memoryOk();
  }
  bool open(bool object, uint64_t own) {
    element();
    result.tree_bytes += own;
    if (static_cast<int>(stack_.size()) >= limits_.max_depth) {
      result.error = strCat("nested deeper than the limit of ", limits_.max_depth, " levels at ",
                            path(), " (hsdp's JSON depth limit)");
      return false;
    }
    stack_.push_back({object, 0, {}, {}});
    if (static_cast<int>(stack_.size()) > result.depth)
      result.depth = static_cast<int>(stack_.size());
    return memoryOk();
  }
  bool close() {
    Level& l = stack_.back();
    if (l.keys.size() > kScanKeys) {
      std::sort(l.keys.begin(), l.keys.end());
      auto d = std::adjacent_find(l.keys.begin(), l.keys.end());
      if (d != l.keys.end()) return duplicate(*d);
    }
    stack_.pop_back();
    return true;
  }
  bool duplicate(const std::string& k) {
    result.error = strCat("key '", files::quote(k, 64), "' ", where(), " appears twice");
    return false;
  }
  bool memoryOk() {
    if (result.tree_bytes <= limits_.max_memory) return true;
    result.error = strCat("would take more than the limit of ", limits_.max_memory,
                          " bytes of memory to hold (", result.values, " values read so far, at ",
                          path(), ")");
    return false;
  }
  // The path of the innermost open container: "tensors[3].chunks[0]", "the top level".
  // With `inner`, down to the value the innermost container is reading; else the innermost
  // container itself.
  std::string path(bool inner = true) const {
    std::string p;
    for (size_t i = 0; i < stack_.size(); ++i) {
      const Level& l = stack_[i];
      if (!inner && i + 1 == stack_.size()) break;
      if (l.object) {
        if (l.key.empty() && l.keys.empty()) continue;  // no key read yet
        if (!p.empty()) p += '.';
        p += l.key;
      } else {
        p += strCat("[", l.index == 0 ? 0 : l.index - 1, "]");
      }
      if (p.size() > files::kEchoBytes) break;  // quote() cuts it anyway
    }
    return p.empty() ? "the top level" : files::quote(p);
  }
  std::string where() const {
    const std::string p = path(/*inner=*/false);
    return p == "the top level" ? "at the top level" : "in " + p;
  }

  const JsonLimits& limits_;
  std::vector<Level> stack_;
  size_t syntax_pos_ = 0;
  bool syntax_ = false;
};

}  // namespace

JsonCheck checkJson(std::string_view text, const JsonLimits& limits) {
  CheckSax sax(limits);
  json::sax_parse(text.begin(), text.end(), &sax, json::input_format_t::json, /*strict=*/true);
  if (sax.syntaxError()) {
    sax.result.error = limits.hint.empty()
                           ? strCat("not valid JSON (error at byte ", sax.syntaxPos(), ")")
                           : strCat("not valid JSON (", limits.hint, ")");
  }
  return sax.result;
}

StatusOr<json> parseJson(std::string_view text, std::string_view where, const JsonLimits& limits) {
  const JsonCheck c = checkJson(text, limits);
  if (!c.error.empty()) return invalidArgument(where, ": ", c.error);
  try {
    json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalidArgument(where, ": not valid JSON");
    return j;
  } catch (const std::bad_alloc&) {  // under the limit, but the machine has less
    return Status(
        StatusCode::kResourceExhausted,
        strCat(where, ": too little memory to hold its ", c.values, " JSON values (estimated ",
               c.tree_bytes, " bytes, within the limit of ", limits.max_memory, ")"));
  }
}

std::string dumpJsonEscaped(const json& j, int indent) {
  std::string s = j.dump(indent, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  // dump escapes bytes below 0x20 in strings; a raw 0x7f can only be inside a string (it is never
  // part of a multi-byte UTF-8 sequence), so escaping every one keeps the JSON valid.
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    if (ch == '\x7f')
      out += "\\u007f";
    else
      out += ch;
  }
  return out;
}

}  // namespace hsdp
