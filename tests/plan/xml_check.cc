#include "tests/plan/xml_check.h"

#include <cctype>
#include <string>
#include <vector>

namespace hsdp::test {
namespace {

bool nameStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
bool nameChar(char c) {
  return nameStart(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.';
}

// Checks an entity reference at s[i] == '&'; returns its length or 0.
size_t entity(std::string_view s, size_t i) {
  for (std::string_view e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
    if (s.substr(i, e.size()) == e) return e.size();
  if (s.substr(i, 2) == "&#") {
    size_t j = i + 2;
    while (j < s.size() && std::isxdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i + 2 && j < s.size() && s[j] == ';') return j + 1 - i;
  }
  return 0;
}

}  // namespace

std::string checkWellFormedXml(std::string_view s) {
  std::vector<std::string> open;
  bool root_seen = false, root_closed = false;
  size_t i = 0;
  auto where = [&](size_t at) { return " at byte " + std::to_string(at); };
  if (s.substr(0, 5) == "<?xml") {
    size_t e = s.find("?>");
    if (e == std::string_view::npos) return "unterminated XML declaration";
    i = e + 2;
  }
  while (i < s.size()) {
    const char c = s[i];
    if (c != '<') {
      if (c == '&') {
        size_t n = entity(s, i);
        if (n == 0) return "bad entity" + where(i);
        i += n;
        continue;
      }
      if (c == '>') return "stray '>'" + where(i);
      if (open.empty() && !std::isspace(static_cast<unsigned char>(c)))
        return "text outside the root element" + where(i);
      ++i;
      continue;
    }
    if (s.substr(i, 4) == "<!--") {
      size_t e = s.find("-->", i + 4);
      if (e == std::string_view::npos) return "unterminated comment" + where(i);
      i = e + 3;
      continue;
    }
    if (s.substr(i, 2) == "</") {
      size_t j = i + 2, b = j;
      while (j < s.size() && nameChar(s[j])) ++j;
      std::string name(s.substr(b, j - b));
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size() || s[j] != '>') return "bad end tag" + where(i);
      if (open.empty() || open.back() != name)
        return "end tag </" + name + "> does not match <" + (open.empty() ? "" : open.back()) +
               ">" + where(i);
      open.pop_back();
      if (open.empty()) root_closed = true;
      i = j + 1;
      continue;
    }
    // Start tag.
    size_t j = i + 1;
    if (j >= s.size() || !nameStart(s[j])) return "bad start tag" + where(i);
    size_t b = j;
    while (j < s.size() && nameChar(s[j])) ++j;
    std::string name(s.substr(b, j - b));
    if (open.empty()) {
      if (root_closed || root_seen) return "second root element <" + name + ">" + where(i);
      root_seen = true;
    }
    std::vector<std::string> attrs;
    for (;;) {
      size_t k = j;
      while (j < s.size() && std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      if (j >= s.size()) return "unterminated tag <" + name + ">";
      if (s[j] == '>') {
        open.push_back(name);
        ++j;
        break;
      }
      if (s.substr(j, 2) == "/>") {
        j += 2;
        if (open.empty()) root_closed = true;
        break;
      }
      if (k == j) return "attributes of <" + name + "> not separated by space" + where(j);
      if (!nameStart(s[j])) return "bad attribute in <" + name + ">" + where(j);
      size_t ab = j;
      while (j < s.size() && nameChar(s[j])) ++j;
      std::string attr(s.substr(ab, j - ab));
      for (const std::string& a : attrs)
        if (a == attr) return "duplicate attribute " + attr + " in <" + name + ">" + where(j);
      attrs.push_back(attr);
      if (j >= s.size() || s[j] != '=') return "attribute " + attr + " without '='" + where(j);
      ++j;
      if (j >= s.size() || (s[j] != '"' && s[j] != '\''))
        return "unquoted attribute " + attr + where(j);
      const char q = s[j++];
      while (j < s.size() && s[j] != q) {
        if (s[j] == '<') return "'<' in attribute " + attr + where(j);
        if (s[j] == '&') {
          size_t n = entity(s, j);
          if (n == 0) return "bad entity in attribute " + attr + where(j);
          j += n;
        } else {
          ++j;
        }
      }
      if (j >= s.size()) return "unterminated attribute " + attr;
      ++j;
    }
    i = j;
  }
  if (!open.empty()) return "unclosed element <" + open.back() + ">";
  if (!root_seen) return "no root element";
  return "";
}

int countElements(std::string_view doc, std::string_view name) {
  int n = 0;
  const std::string open = "<" + std::string(name);
  for (size_t p = doc.find(open); p != std::string_view::npos; p = doc.find(open, p + 1)) {
    const size_t after = p + open.size();
    if (after < doc.size() && !nameChar(doc[after])) ++n;
  }
  return n;
}

}  // namespace hsdp::test
