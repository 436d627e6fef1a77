// Numbers as the user wrote them (include/hsdp/parse.h). One place decides what a number is, so
// every flag, HSDP_* value and file field is refused the same way and named as written.
#include "hsdp/parse.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace hsdp {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool allDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "%g" that keeps 1e-05 readable and 0.9 as 0.9.
std::string real(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// A byte count for messages: "16.0 TiB".
std::string bytes(long double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof buf, u ? "%.1Lf %s" : "%.0Lf %s", b, units[u]);
  return buf;
}

Status belowMin(std::string_view name, std::string_view text, long double lo) {
  // Flags say "must be positive" for a minimum of one (the wording train_mlp always used).
  if (lo == 1 && !name.empty() && name[0] == '-')
    return invalidArgument(namedValue(name, text, false), " must be positive");
  return invalidArgument(namedValue(name, text, false),
                         " must be >= ", strCat(static_cast<long long>(lo)));
}

// A whole number with an optional sign: digits only (no hex, no octal, no units, no '.').
// *negative and the magnitude's digits; false when it is not such a number.
bool splitSign(std::string_view s, bool* negative, std::string_view* digits) {
  *negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    *negative = s[0] == '-';
    s.remove_prefix(1);
  }
  *digits = s;
  return allDigits(s);
}

template <class T>
Status aboveMax(std::string_view name, std::string_view text, T hi) {
  return invalidArgument(namedValue(name, text, false), " is too large (at most ", hi, ")");
}

// A whole number as written: the trimmed text, its sign and its magnitude, with from_chars'
// verdict on the magnitude (result_out_of_range beyond 2^64 - 1). InvalidArgument when it is
// not a whole number.
struct Whole {
  std::string_view text;
  bool negative = false;
  uint64_t magnitude = 0;
  std::errc ec{};
};
StatusOr<Whole> splitWhole(std::string_view text, std::string_view name) {
  Whole w;
  w.text = trim(text);
  std::string_view digits;
  if (!splitSign(w.text, &w.negative, &digits))
    return invalidArgument(namedValue(name, w.text, true), " is not an integer");
  w.ec = std::from_chars(digits.data(), digits.data() + digits.size(), w.magnitude).ec;
  return w;
}

}  // namespace

std::string namedValue(std::string_view name, std::string_view text, bool quote) {
  const bool is_env = !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
  std::string out(name);
  out += is_env ? "=" : " ";
  if (quote) out += "'";
  out += text;
  if (quote) out += "'";
  return out;
}

StatusOr<int64_t> parseInt64(std::string_view text, std::string_view name, int64_t lo, int64_t hi) {
  HSDP_ASSIGN_OR_RETURN(const Whole w, splitWhole(text, name));
  const std::string_view s = w.text;
  const uint64_t mag = w.magnitude;
  // Magnitude first (beyond 2^64 is out of any range), then the sign.
  if (w.ec == std::errc::result_out_of_range) {
    if (w.negative) return belowMin(name, s, lo);
    return aboveMax(name, s, hi);
  }
  if (w.negative) {
    if (mag > uint64_t{1} << 63 || -static_cast<__int128>(mag) < lo) return belowMin(name, s, lo);
    // A range entirely below zero bounds negatives from above too ("-0" is 0).
    if (-static_cast<__int128>(mag) > hi) return aboveMax(name, s, hi);
    return static_cast<int64_t>(-static_cast<__int128>(mag));
  }
  if (mag > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      static_cast<int64_t>(mag) > hi)
    return aboveMax(name, s, hi);
  if (static_cast<int64_t>(mag) < lo) return belowMin(name, s, lo);
  return static_cast<int64_t>(mag);
}

StatusOr<uint64_t> parseUint64(std::string_view text, std::string_view name, uint64_t lo,
                               uint64_t hi) {
  HSDP_ASSIGN_OR_RETURN(const Whole w, splitWhole(text, name));
  if (w.negative && (w.ec != std::errc() || w.magnitude != 0))  // "-0" is 0
    return belowMin(name, w.text, lo);
  if (w.ec == std::errc::result_out_of_range || w.magnitude > hi) return aboveMax(name, w.text, hi);
  if (w.magnitude < lo) return belowMin(name, w.text, lo);
  return w.magnitude;
}

bool RealRange::contains(double v) const {
  if (!std::isfinite(v)) return false;
  const bool above_lo = lo_open ? v > lo : v >= lo;
  const bool below_hi = hi_open ? v < hi : v <= hi;
  return above_lo && below_hi;
}

std::string RealRange::describe() const {
  constexpr double kMax = std::numeric_limits<double>::max();
  const bool has_lo = lo != -kMax, has_hi = hi != kMax;
  if (has_lo && has_hi)
    return strCat("must be in ", lo_open ? "(" : "[", real(lo), ", ", real(hi),
                  hi_open ? ")" : "]");
  if (has_lo) return strCat("must be ", lo_open ? "> " : ">= ", real(lo));
  if (has_hi) return strCat("must be ", hi_open ? "< " : "<= ", real(hi));
  return "must be finite";
}

StatusOr<double> parseReal(std::string_view text, std::string_view name, RealRange range,
                           bool as_float) {
  const std::string s(trim(text));
  // Decimal or e-notation only: strtod would also take "inf", "nan", "0x1p3" and leading blanks.
  const bool shaped = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-';
  });
  errno = 0;
  char* end = nullptr;
  double v = shaped ? std::strtod(s.c_str(), &end) : 0.0;
  const bool whole = shaped && end == s.c_str() + s.size();
  if (!whole) {
    std::string lower = s;
    std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
    if (lower.find("inf") != std::string::npos || lower.find("nan") != std::string::npos)
      return invalidArgument(namedValue(name, s, true), " is not a finite number");
    return invalidArgument(namedValue(name, s, true), " is not a number");
  }
  if (errno == ERANGE && std::fabs(v) > 1.0)  // overflow; an underflow reads as (nearly) 0
    return invalidArgument(namedValue(name, s, false), " is too large (not a finite number)");
  if (as_float) {
    if (std::fabs(v) > std::numeric_limits<float>::max())
      return invalidArgument(namedValue(name, s, false), " does not fit a float (at most ",
                             real(std::numeric_limits<float>::max()), ")");
    v = static_cast<float>(v);
  }
  if (!range.contains(v)) return invalidArgument(namedValue(name, s, false), " ", range.describe());
  return v;
}

StatusOr<bool> parseBool(std::string_view text, std::string_view name) {
  std::string lower(trim(text));
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") return true;
  if (lower == "0" || lower == "false" || lower == "off" || lower == "no") return false;
  return invalidArgument(namedValue(name, text, true),
                         " is not a boolean (1/0, true/false, on/off, yes/no)");
}

namespace {
// A finite number in decimal or e-notation (plain digits exact below 2^64).
bool parseMagnitude(const std::string& s, long double* out) {
  if (allDigits(s)) {
    uint64_t v = 0;
    if (std::from_chars(s.data(), s.data() + s.size(), v).ec != std::errc()) return false;
    *out = static_cast<long double>(v);
    return true;
  }
  // A sign is read (a negative count is "must be positive", not "not a number").
  if (s.empty() || !(s[0] == '.' || s[0] == '+' || s[0] == '-' || (s[0] >= '0' && s[0] <= '9')))
    return false;
  if (s.find_first_of("xXnNiI") != std::string::npos) return false;  // hex, nan, inf
  errno = 0;
  char* end = nullptr;
  long double v = std::strtold(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno != 0 || !std::isfinite(v)) return false;
  *out = v;
  return true;
}
constexpr long double kTwo64 = 18446744073709551616.0L;
}  // namespace

StatusOr<uint64_t> parseCount(std::string_view text, std::string_view what) {
  const std::string s(trim(text));
  if (allDigits(s)) {
    uint64_t v = 0;
    if (std::from_chars(s.data(), s.data() + s.size(), v).ec != std::errc())
      return invalidArgument(what, " '", s, "' is too large");
    if (v == 0) return invalidArgument(what, " '", s, "' must be positive");
    return v;
  }
  long double v = 0;
  if (!parseMagnitude(s, &v))
    return invalidArgument(what, " '", s, "' is not a number (e.g. 7500000000 or 7.5e9)");
  if (v <= 0) return invalidArgument(what, " '", s, "' must be positive");
  if (v != std::floor(v)) return invalidArgument(what, " '", s, "' is not a whole number");
  if (v >= kTwo64) return invalidArgument(what, " '", s, "' is too large");
  return static_cast<uint64_t>(v);
}

StatusOr<uint64_t> parseByteSize(std::string_view text, std::string_view what) {
  const std::string s(trim(text));
  size_t split = s.size();
  while (split > 0 && std::isalpha(static_cast<unsigned char>(s[split - 1]))) --split;
  const std::string num = s.substr(0, split), unit = s.substr(split);
  long double mul = -1;
  std::string u;
  for (char c : unit) u += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const char* prefixes = "KMGT";
  if (u.empty() || u == "B") {
    mul = 1;
  } else if (const char* p = std::strchr(prefixes, u[0]); p != nullptr) {
    const int power = static_cast<int>(p - prefixes) + 1;
    const std::string rest = u.substr(1);
    if (rest.empty() || rest == "IB" || rest == "I")
      mul = std::pow(1024.0L, power);
    else if (rest == "B")
      mul = std::pow(1000.0L, power);
  }
  long double v = 0;
  if (mul < 0 || !parseMagnitude(num, &v) || !(v > 0))
    return invalidArgument(what, " '", s,
                           "' is not a positive byte size (e.g. 80G or 80GiB = 80*2^30, 80GB = "
                           "80*10^9, 85899345920)");
  const long double b = std::floor(v * mul);
  if (b >= kTwo64) return invalidArgument(what, " '", s, "' is too large");
  if (b < 1) return invalidArgument(what, " '", s, "' is less than one byte");
  return static_cast<uint64_t>(b);
}

StatusOr<std::vector<std::string>> parseList(std::string_view text, std::string_view name) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string_view item = trim(
        text.substr(start, comma == std::string_view::npos ? text.size() - start : comma - start));
    if (item.empty())
      return invalidArgument(namedValue(name, text, true), ": element ", out.size() + 1,
                             " is empty");
    out.emplace_back(item);
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

namespace detail {
std::string listElementName(size_t index) { return strCat("element ", index + 1); }
Status listElementError(std::string_view name, std::string_view text, const Status& element) {
  return invalidArgument(namedValue(name, text, true), ": ", element.message());
}
}  // namespace detail

uint64_t allocatableBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t limit = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : UINT64_MAX;
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY)
    limit = std::min<uint64_t>(limit, as.rlim_cur);
  return limit;
}

StatusOr<uint64_t> checkedAllocation(uint64_t count, uint64_t elem_bytes, std::string_view what) {
  const uint64_t limit = allocatableBytes();
  const auto total = checkedMul(count, elem_bytes);
  if (!total || *total > limit) {
    rlimit as{};
    const bool by_rlimit =
        getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY && as.rlim_cur == limit;
    return invalidArgument(what, " needs ", bytes(static_cast<long double>(count) * elem_bytes),
                           " (", count, " x ", elem_bytes, " B), more than the ", bytes(limit),
                           " this process may allocate (",
                           by_rlimit ? "RLIMIT_AS" : "physical memory", ")");
  }
  return *total;
}

std::string hexBytes(const uint8_t* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

StatusOr<std::vector<uint8_t>> parseHexBytes(std::string_view text, std::string_view what) {
  auto digit = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  if (text.empty() || text.size() % 2)
    return invalidArgument(what, " is not an even number of hex digits: '", text, "'");
  std::vector<uint8_t> out(text.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return invalidArgument(what, " is not hex: '", text, "'");
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return out;
}

}  // namespace hsdp
