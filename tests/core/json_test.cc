// The bounded JSON reader (core/json.h) and the escaping of what the programs print
// (files::quote / files::printable): depth limit, repeated keys with their path, the memory
// limit named before the tree is built, syntax errors, and no raw control byte or DEL out.
#include "core/json.h"

#include <gtest/gtest.h>

#include <string>

#include "hsdp/files.h"

namespace hsdp {
namespace {

std::string deep(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

std::string errorOf(std::string_view text, JsonLimits l = {}) {
  StatusOr<nlohmann::json> j = parseJson(text, "f.json", l);
  return j.ok() ? "" : j.status().message();
}

TEST(Json, DepthLimit) {
  EXPECT_EQ(errorOf(deep(64)), "");
  EXPECT_EQ(errorOf("{\"a\": " + deep(63) + "}"), "");
  const std::string e = errorOf("{\"a\": [1, " + deep(1000000) + "]}");
  EXPECT_NE(e.find("f.json: nested deeper than the limit of 64 levels at a[1]"), std::string::npos)
      << e;
  std::string objects;
  for (int i = 0; i < 1000000; ++i) objects += "{\"a\":";
  EXPECT_NE(errorOf(objects).find("limit of 64 levels at a.a.a"), std::string::npos);
  EXPECT_NE(errorOf(deep(10), {.max_depth = 5}).find("limit of 5 levels"), std::string::npos);
}

TEST(Json, RepeatedKeys) {
  EXPECT_EQ(errorOf(R"({"a": {"b": [1, {"c": 1, "c": 2}]}})"),
            "f.json: key 'c' in a.b[1] appears twice");
  EXPECT_EQ(errorOf(R"({"a": [{"k": 1}, {"k": 2}]})"), "");  // other objects
  std::string wide = "{";
  for (int i = 0; i < 1000; ++i) wide += "\"k" + std::to_string(i) + "\": 0, ";
  EXPECT_EQ(errorOf(wide + "\"z\": 1}"), "");
  EXPECT_EQ(errorOf(wide + "\"k500\": 1}"), "f.json: key 'k500' at the top level appears twice");
  // A key from a file is escaped in the message.
  const std::string e = errorOf("{\"\\u001b[2J\": 1, \"\\u001b[2J\": 2}");
  EXPECT_EQ(e.find('\x1b'), std::string::npos) << e;
}

TEST(Json, MemoryLimitNamedBeforeTheTree) {
  std::string many = "[";
  for (int i = 0; i < 100000; ++i) many += "{},";
  many += "{}]";
  const JsonCheck c = checkJson(many);
  EXPECT_EQ(c.error, "");
  EXPECT_GT(c.tree_bytes, many.size() * 20);  // [{},...] is the costliest shape: ~32 B/B
  const std::string e = errorOf(many, {.max_memory = 1 << 20});
  EXPECT_NE(e.find("would take more than the limit of 1048576 bytes of memory"), std::string::npos)
      << e;
}

TEST(Json, Syntax) {
  EXPECT_NE(errorOf("{\"a\": [1, 2").find("f.json: not valid JSON (error at byte"),
            std::string::npos);
  EXPECT_EQ(errorOf("{", {.hint = "corrupt manifest"}),
            "f.json: not valid JSON (corrupt manifest)");
  EXPECT_NE(errorOf("[1] x").find("not valid JSON"), std::string::npos);
}

TEST(Json, DumpEscapesControlBytesAndDel) {
  nlohmann::json j = {{"k\x7f", "a\x1b]0;t\x07\x7f\xff"}};
  const std::string s = dumpJsonEscaped(j, 2);
  for (char c : s) EXPECT_FALSE((c > 0 && c < 0x20 && c != '\n') || c == 0x7f) << s;
  EXPECT_NE(s.find("\\u007f"), std::string::npos) << s;
  EXPECT_TRUE(nlohmann::json::parse(s).is_object());
}

TEST(Files, PrintableKeepsNewlinesEscapesTheRest) {
  EXPECT_EQ(files::printable("a 'b' \\ c\nd"), "a 'b' \\ c\nd");
  EXPECT_EQ(files::printable("\x1b[2J\x07\t\x7f"), "\\x1b[2J\\x07\\t\\x7f");
  EXPECT_EQ(files::printable("\xc2\x9b"
                             "1m \xc3\xa9 \xff"),
            "\\u009b1m \xc3\xa9 \\xff");
  EXPECT_EQ(files::quote("a'\n\x1b"), "a\\'\\n\\x1b");
}

}  // namespace
}  // namespace hsdp
