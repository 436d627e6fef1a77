// Numbers a user writes (a flag, an HSDP_* value, a field of a file) read into the type they are
// used as, with range checks. A value that is not a number, not finite, does not fit the type or
// lies outside the range is an InvalidArgument naming it as written:
//   --steps 'ten' is not an integer          HSDP_RANKS_PER_NODE='abc' is not an integer
//   --intra-shard 0 must be positive         HSDP_PIPELINE_CHUNKS=0 must be >= 1
//   --steps 4294967296 is too large (at most 2147483647)
//   --lr 'inf' is not a finite number        --beta2 1 must be in [0, 1)
// `name` is how the user wrote the setting: a flag ("--steps": the value follows after a space),
// an environment variable ("HSDP_CHUNKS": after '='), or any other label ("units.txt:3 count").
// Surrounding whitespace is ignored; nothing else is (no trailing units on a plain integer, no
// hex, no octal: "010" is ten).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "hsdp/status.h"

namespace hsdp {

// "--steps 'ten'" or "HSDP_X='ten'" (quoted: the text is not a valid value), "--steps 5" or
// "HSDP_X=5" (a number out of range).
std::string namedValue(std::string_view name, std::string_view text, bool quote);

// Whole numbers in [lo, hi]. Below lo: "must be positive" (lo == 1), "must be >= lo"; above hi:
// "is too large (at most hi)".
StatusOr<int64_t> parseInt64(std::string_view text, std::string_view name, int64_t lo, int64_t hi);
StatusOr<uint64_t> parseUint64(std::string_view text, std::string_view name, uint64_t lo,
                               uint64_t hi);

// Into any integer type; the default range is the whole type (a 64-bit value read for an int is
// refused, never wrapped; a negative one for an unsigned type is refused).
template <class T>
StatusOr<T> parseInteger(std::string_view text, std::string_view name,
                         T lo = std::numeric_limits<T>::min(),
                         T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if constexpr (std::is_signed_v<T>) {
    HSDP_ASSIGN_OR_RETURN(int64_t v, parseInt64(text, name, lo, hi));
    return static_cast<T>(v);
  } else {
    HSDP_ASSIGN_OR_RETURN(uint64_t v, parseUint64(text, name, lo, hi));
    return static_cast<T>(v);
  }
}

// A closed, open or half-open interval of finite reals.
struct RealRange {
  double lo = -std::numeric_limits<double>::max();
  double hi = std::numeric_limits<double>::max();
  bool lo_open = false, hi_open = false;
  static RealRange any() { return {}; }
  static RealRange atLeast(double lo) { return {lo, std::numeric_limits<double>::max()}; }
  static RealRange above(double lo) { return {lo, std::numeric_limits<double>::max(), true}; }
  static RealRange closed(double lo, double hi) { return {lo, hi}; }
  static RealRange halfOpen(double lo, double hi) { return {lo, hi, false, true}; }
  bool contains(double v) const;
  // "must be > 0", "must be >= 0", "must be in [0, 1)"
  std::string describe() const;
};

// A finite real (decimal or e-notation; "inf" and "nan" are not values) that fits `float` when
// as_float (the value is checked after rounding to float: 1e39 does not fit, 1e-50 becomes 0).
StatusOr<double> parseReal(std::string_view text, std::string_view name, RealRange range,
                           bool as_float = false);
template <class T>
StatusOr<T> parseFloating(std::string_view text, std::string_view name,
                          RealRange range = RealRange::any()) {
  static_assert(std::is_floating_point_v<T>);
  HSDP_ASSIGN_OR_RETURN(double v, parseReal(text, name, range, std::is_same_v<T, float>));
  return static_cast<T>(v);
}

// 1/0, true/false, on/off, yes/no (any case).
StatusOr<bool> parseBool(std::string_view text, std::string_view name);

// "7500000000", "7.5e9", "1e6": a whole, positive count (beyond 2^53 exact in plain digits).
// Errors name `what` and the text.
StatusOr<uint64_t> parseCount(std::string_view text, std::string_view what);
// "80G", "80GiB" (binary: K, M, G, T, with or without "iB"), "80GB" (decimal), "1e9", "4096": a
// positive byte count below 2^64.
StatusOr<uint64_t> parseByteSize(std::string_view text, std::string_view what);

// ---- lists ----------------------------------------------------------------------------------
// A comma-separated list as the user wrote it ("--dims 32,64,10", "--algo hier,flat"): the one
// list syntax of every flag and HSDP_* value. Elements are trimmed of surrounding whitespace; an
// empty one (a leading, trailing or doubled comma, an element of only whitespace, an empty value)
// is an InvalidArgument naming the setting, the value as written and the element by position
// (from 1):
//   --dims '32,64,': element 3 is empty        HSDP_X=',a': element 1 is empty
StatusOr<std::vector<std::string>> parseList(std::string_view text, std::string_view name);

// A list of whole numbers in [lo, hi], each read as parseInteger reads one; an element that is
// not such a number names the list and the element:
//   --dims '32,x,10': element 2 'x' is not an integer
//   --threads '1,0': element 2 0 must be >= 1
template <class T>
StatusOr<std::vector<T>> parseIntegerList(std::string_view text, std::string_view name,
                                          T lo = std::numeric_limits<T>::min(),
                                          T hi = std::numeric_limits<T>::max());

// ---- arithmetic on user values --------------------------------------------------------------
// Products and sums of user values that size memory, a loop or a message: nullopt when the
// result does not fit T (the caller names the values in its error).
template <class T>
[[nodiscard]] std::optional<T> checkedMul(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
template <class T>
[[nodiscard]] std::optional<T> checkedAdd(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// What one process may allocate: the smaller of physical memory and RLIMIT_AS (its soft limit).
uint64_t allocatableBytes();
// `count` elements of `elem_bytes` each, for the value `what` names (e.g. "--elements 1e12"):
// the byte count when it fits 64 bits and allocatableBytes(), else InvalidArgument naming the
// value, the bytes it needs and the limit ("needs 16.0 TiB, more than the 23.4 GiB this process
// may allocate (physical memory)").
StatusOr<uint64_t> checkedAllocation(uint64_t count, uint64_t elem_bytes, std::string_view what);

// Bytes as lowercase hex ({0x0a, 0xff} -> "0aff"), and back: text that is empty or not an even
// number of hex digits is an InvalidArgument naming `what` and the text.
std::string hexBytes(const uint8_t* p, size_t n);
StatusOr<std::vector<uint8_t>> parseHexBytes(std::string_view text, std::string_view what);

// ---- templates ----------------------------------------------------------------------------------
namespace detail {
// "--dims '32,x,10': " + the element's own message (named "element 2").
Status listElementError(std::string_view name, std::string_view text, const Status& element);
std::string listElementName(size_t index);  // "element 3" (index from 0)
}  // namespace detail

template <class T>
StatusOr<std::vector<T>> parseIntegerList(std::string_view text, std::string_view name, T lo,
                                          T hi) {
  HSDP_ASSIGN_OR_RETURN(std::vector<std::string> items, parseList(text, name));
  std::vector<T> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    StatusOr<T> v = parseInteger<T>(items[i], detail::listElementName(i), lo, hi);
    if (!v.ok()) return detail::listElementError(name, text, v.status());
    out.push_back(*v);
  }
  return out;
}

}  // namespace hsdp
