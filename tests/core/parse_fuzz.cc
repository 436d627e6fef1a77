// libFuzzer target for the parsers of user numbers (hsdp/parse.h: flags, environment values,
// file fields). Beyond "never crash" (built with AddressSanitizer), every accepted value is
// checked against what the parser promises:
//   - an integer is inside its [lo, hi], and printing it and parsing that gives it back;
//   - a real is finite and inside its range, and a float one survives rounding to float;
//   - a byte size or a count is at least 1;
//   - a refusal is an InvalidArgument or OutOfRange whose message names the setting.
// The first input bytes pick the parser and its range; the rest is the text.
// Run longer by hand: build/tests/core/parse_fuzz -max_total_time=600 corpus/
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "hsdp/parse.h"

namespace {

constexpr std::string_view kName = "--fuzzed";

[[noreturn]] void violated(const char* what, std::string_view text) {
  std::fprintf(stderr, "parse_fuzz: %s for input '%.*s'\n", what, static_cast<int>(text.size()),
               text.data());
  std::abort();
}

// A refusal must name the setting and be a bad-input code.
void checkRefusal(const hsdp::Status& s, std::string_view name, std::string_view text) {
  if (s.code() != hsdp::StatusCode::kInvalidArgument && s.code() != hsdp::StatusCode::kOutOfRange)
    violated("a refusal that is not InvalidArgument/OutOfRange", text);
  if (s.message().find(name) == std::string::npos)
    violated("a refusal not naming the setting", text);
}

int64_t pickSigned(uint8_t b) {
  switch (b % 6) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return -1000;
    case 3:
      return std::numeric_limits<int32_t>::max();
    case 4:
      return std::numeric_limits<int64_t>::min();
    default:
      return std::numeric_limits<int64_t>::max();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t which = data[0], a = data[1], b = data[2];
  const std::string_view text(reinterpret_cast<const char*>(data + 3), size - 3);
  switch (which % 6) {
    case 0: {  // signed integers in a range
      int64_t lo = pickSigned(a), hi = pickSigned(b);
      if (lo > hi) std::swap(lo, hi);
      hsdp::StatusOr<int64_t> v = hsdp::parseInt64(text, kName, lo, hi);
      if (!v.ok()) return checkRefusal(v.status(), kName, text), 0;
      if (*v < lo || *v > hi) violated("an integer outside its range", text);
      hsdp::StatusOr<int64_t> again = hsdp::parseInt64(std::to_string(*v), kName, lo, hi);
      if (!again.ok() || *again != *v) violated("an integer that does not round-trip", text);
      break;
    }
    case 1: {  // unsigned integers
      const uint64_t hi = b % 2 ? std::numeric_limits<uint64_t>::max() : 4096;
      hsdp::StatusOr<uint64_t> v = hsdp::parseUint64(text, kName, a % 3, hi);
      if (!v.ok()) return checkRefusal(v.status(), kName, text), 0;
      if (*v < static_cast<uint64_t>(a % 3) || *v > hi)
        violated("an unsigned outside its range", text);
      hsdp::StatusOr<uint64_t> again = hsdp::parseUint64(std::to_string(*v), kName, a % 3, hi);
      if (!again.ok() || *again != *v) violated("an unsigned that does not round-trip", text);
      break;
    }
    case 2: {  // reals, in double or float
      const hsdp::RealRange ranges[] = {hsdp::RealRange::any(), hsdp::RealRange::atLeast(0),
                                        hsdp::RealRange::above(0), hsdp::RealRange::halfOpen(0, 1)};
      const hsdp::RealRange& r = ranges[a % 4];
      const bool as_float = b % 2;
      hsdp::StatusOr<double> v = hsdp::parseReal(text, kName, r, as_float);
      if (!v.ok()) return checkRefusal(v.status(), kName, text), 0;
      if (!std::isfinite(*v)) violated("a real that is not finite", text);
      if (!r.contains(*v)) violated("a real outside its range", text);
      if (as_float && !std::isfinite(static_cast<float>(*v)))
        violated("a float that overflows", text);
      break;
    }
    case 3: {  // booleans
      hsdp::StatusOr<bool> v = hsdp::parseBool(text, kName);
      if (!v.ok()) checkRefusal(v.status(), kName, text);
      break;
    }
    case 4: {  // byte sizes ("64M", "1GiB")
      hsdp::StatusOr<uint64_t> v = hsdp::parseByteSize(text, kName);
      if (!v.ok()) return checkRefusal(v.status(), kName, text), 0;
      if (*v < 1) violated("a byte size below one byte", text);
      break;
    }
    default: {  // counts ("7.5e9")
      hsdp::StatusOr<uint64_t> v = hsdp::parseCount(text, kName);
      if (!v.ok()) return checkRefusal(v.status(), kName, text), 0;
      if (*v < 1) violated("a count below one", text);
      break;
    }
  }
  return 0;
}
