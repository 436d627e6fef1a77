// Command lines (CLI11) on hsdp's number parsing (hsdp/parse.h), and CLI11's own errors in the
// project's style. Every program (tools/, bench/, examples/, and yours) adds its numeric flags
// through these, so a number is refused the same way everywhere: in the type it is used as,
// inside its range, finite, named as the user wrote it:
//   hsdp-topo: error: --ranks-per-host 100000000 is too large (at most 4096)
//   train_mlp [rank 3]: error: --lr 'inf' is not a finite number
// and every parse error exits 2 (reportParseError; --help exits 0). The flags hsdp's programs
// share (mesh, precision, offload, checkpoint, failure) are declared once, in hsdp/flags.h.
// Header-only, installed with the package's CLI component: find_package(hsdp COMPONENTS CLI),
// link hsdp::cli (it brings CLI11::CLI11).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "hsdp/files.h"
#include "hsdp/parse.h"

namespace hsdp::cli {

constexpr int kExitBadInput = 2;
constexpr int kExitRuntime = 3;

// The tools' exit code for a failed Status: a failure of the machine (a failing disk, the
// open-file limit, too little memory, a foreign library: kInternal, kResourceExhausted) is 3,
// everything else (a file or value that can never work) is bad input, 2.
inline int exitCodeOf(const Status& s) {
  return s.code() == StatusCode::kInternal || s.code() == StatusCode::kResourceExhausted
             ? kExitRuntime
             : kExitBadInput;
}

// "-b,--minbytes" -> "--minbytes": the spelling errors name (the long one).
inline std::string flagName(const std::string& names) {
  std::string best, item;
  std::stringstream ss(names);
  while (std::getline(ss, item, ','))
    if (item.size() > best.size()) best = item;
  return best;
}

namespace detail {
template <class T>
std::string show(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
// The value is parsed by `parse` (a StatusOr<T>(const std::string&)); a bad one is a
// CLI::ValidationError whose text is the whole message (no CLI11 prefix).
template <class T, class Parse>
CLI::Option* add(CLI::App& app, const std::string& names, T& out, const std::string& help,
                 const char* type, Parse parse) {
  CLI::Option* o = app.add_option(
      names,
      [&out, parse](const CLI::results_t& r) {
        auto v = parse(r.back());
        if (!v.ok()) throw CLI::ValidationError(std::string(v.status().message()));
        out = *v;
        return true;
      },
      help);
  o->type_name(type);
  o->default_str(show(out));
  return o;
}
}  // namespace detail

// A whole number read as T, in [lo, hi] (default: the whole type).
template <class T>
CLI::Option* addInt(CLI::App& app, const std::string& names, T& out, const std::string& help,
                    T lo = std::numeric_limits<T>::min(), T hi = std::numeric_limits<T>::max()) {
  const std::string flag = flagName(names);
  return detail::add(
      app, names, out, help, std::is_signed_v<T> ? "INT" : "UINT",
      [flag, lo, hi](const std::string& s) { return parseInteger<T>(s, flag, lo, hi); });
}

// A finite real read as T (float or double) inside `range`.
template <class T>
CLI::Option* addReal(CLI::App& app, const std::string& names, T& out, const std::string& help,
                     RealRange range = RealRange::any()) {
  const std::string flag = flagName(names);
  return detail::add(app, names, out, help, "REAL", [flag, range](const std::string& s) {
    return parseFloating<T>(s, flag, range);
  });
}

// A byte size ("64M", "1GiB", "4096") kept as written in `out` (the program parses it later with
// parseByteSize) but checked now, so a bad one is a parse error like any other. `zero_ok`: "0"
// is accepted too (a flag where 0 means off).
inline CLI::Option* addByteSize(CLI::App& app, const std::string& names, std::string& out,
                                const std::string& help, bool zero_ok = false) {
  const std::string flag = flagName(names);
  return detail::add(app, names, out, help, "BYTES",
                     [flag, zero_ok](const std::string& s) -> StatusOr<std::string> {
                       if (zero_ok && s == "0") return s;
                       HSDP_RETURN_IF_ERROR(parseByteSize(s, flag).status());
                       return s;
                     });
}

// Comma-separated lists (hsdp::parseList: an empty element, from a leading, trailing or doubled
// comma or only whitespace, is refused by position: "--dims '32,64,': element 3 is empty"). Their
// type in --help is LIST, which tests/examples/bad_input_classes.py reads to give every list flag
// its bad values.
// Kept as written in `out` (the program reads the elements later with parseList or
// parseIntegerList) but checked now, so a malformed list is a parse error like any other.
inline CLI::Option* addList(CLI::App& app, const std::string& names, std::string& out,
                            const std::string& help) {
  const std::string flag = flagName(names);
  return detail::add(app, names, out, help, "LIST",
                     [flag](const std::string& s) -> StatusOr<std::string> {
                       HSDP_RETURN_IF_ERROR(parseList(s, flag).status());
                       return s;
                     });
}

namespace detail {
template <class T>
std::string join(const std::vector<T>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  return os.str();
}
template <class T, class Parse>
CLI::Option* addVector(CLI::App& app, const std::string& names, std::vector<T>& out,
                       const std::string& help, Parse parse) {
  CLI::Option* o = app.add_option(
      names,
      [&out, parse](const CLI::results_t& r) {
        auto v = parse(r.back());
        if (!v.ok()) throw CLI::ValidationError(std::string(v.status().message()));
        out = std::move(*v);
        return true;
      },
      help);
  o->type_name("LIST");
  o->default_str(join(out));
  return o;
}
}  // namespace detail

// The elements of a list of words (their meaning is the program's to check).
inline CLI::Option* addList(CLI::App& app, const std::string& names, std::vector<std::string>& out,
                            const std::string& help) {
  const std::string flag = flagName(names);
  return detail::addVector(app, names, out, help,
                           [flag](const std::string& s) { return parseList(s, flag); });
}

// A list of whole numbers read as T, each in [lo, hi].
template <class T>
CLI::Option* addIntList(CLI::App& app, const std::string& names, std::vector<T>& out,
                        const std::string& help, T lo = std::numeric_limits<T>::min(),
                        T hi = std::numeric_limits<T>::max()) {
  const std::string flag = flagName(names);
  return detail::addVector(app, names, out, help, [flag, lo, hi](const std::string& s) {
    return parseIntegerList<T>(s, flag, lo, hi);
  });
}

// Prints a CLI11 parse error as "<program>[ [rank r]]: error: <what>" on stderr (rank < 0: no
// rank) and returns the exit code: 0 for --help (printed by CLI11 when print_help), else 2.
inline int reportParseError(const CLI::App& app, const CLI::ParseError& e, const char* program,
                            int rank = -1, bool print_help = true) {
  if (dynamic_cast<const CLI::CallForHelp*>(&e) || dynamic_cast<const CLI::CallForAllHelp*>(&e) ||
      dynamic_cast<const CLI::CallForVersion*>(&e)) {
    if (print_help) app.exit(e);
    return 0;
  }
  if (rank >= 0)
    std::fprintf(stderr, "%s [rank %d]: error: %s\n", program, rank,
                 hsdp::files::printable(e.what()).c_str());
  else
    std::fprintf(stderr, "%s: error: %s\n", program, hsdp::files::printable(e.what()).c_str());
  std::fflush(stderr);
  return kExitBadInput;
}

}  // namespace hsdp::cli
