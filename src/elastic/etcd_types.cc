// The etcd client's value types and encodings (etcd_client.h): the comparisons and operations
// of a transaction, base64 (etcd's JSON gateway carries keys and values in it), and a prefix's
// range end.
#include <cstring>

#include "elastic/etcd_client.h"

namespace hsdp::elastic {
namespace {
const char* kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}  // namespace

Compare Compare::absent(std::string key) { return createdAt(std::move(key), 0); }
Compare Compare::createdAt(std::string key, int64_t revision) {
  return {std::move(key), Target::kCreateRevision, Result::kEqual, revision, ""};
}
Compare Compare::valueIs(std::string key, std::string value) {
  return {std::move(key), Target::kValue, Result::kEqual, 0, std::move(value)};
}
Compare Compare::versionIs(std::string key, int64_t version) {
  return {std::move(key), Target::kVersion, Result::kEqual, version, ""};
}
Compare Compare::modifiedAt(std::string key, int64_t revision) {
  return {std::move(key), Target::kModRevision, Result::kEqual, revision, ""};
}
Op Op::put(std::string key, std::string value, int64_t lease) {
  return {Kind::kPut, std::move(key), std::move(value), lease, false};
}
Op Op::get(std::string key, bool prefix) { return {Kind::kGet, std::move(key), "", 0, prefix}; }
Op Op::del(std::string key, bool prefix) { return {Kind::kDelete, std::move(key), "", 0, prefix}; }

std::string prefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return std::string(1, '\0');  // etcd: every key
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return end;
}

std::string base64Encode(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kB64[(v >> s) & 63]);
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out.push_back(kB64[(v >> 18) & 63]);
    out.push_back(kB64[(v >> 12) & 63]);
    out.push_back(i + 1 < in.size() ? kB64[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

StatusOr<std::string> base64Decode(const std::string& in) {
  if (in.size() % 4 != 0) return invalidArgument("base64 of length ", in.size(), " (not 4k)");
  size_t n = in.size();
  size_t pad = 0;
  while (pad < 2 && n > 0 && in[n - 1] == '=') --n, ++pad;
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    const char* p = in[i] != '\0' ? std::strchr(kB64, in[i]) : nullptr;
    if (p == nullptr) return invalidArgument("base64 with '", in[i], "' at ", i);
    v = (v << 6) | uint32_t(p - kB64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((v >> bits) & 0xff));
    }
  }
  return out;
}

}  // namespace hsdp::elastic
