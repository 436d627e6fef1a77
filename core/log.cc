#include "hsdp/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/host.h"
#include "hsdp/env.h"
#include "hsdp/parse.h"

namespace hsdp::log {
namespace {

const env::StringParam kDebug{"HSDP_DEBUG", env::StringParam::Kind::kEnum, "WARN",
                              "Log level: NONE, WARN, INFO or TRACE (to stderr)."};
const env::StringParam kDebugSubsys{
    "HSDP_DEBUG_SUBSYS", env::StringParam::Kind::kString, "ALL",
    "Comma-separated log subsystems: INIT, MESH, COLL, SHARD, OPTIM, OFFLOAD, TOPO, ALL; a "
    "leading ^ excludes the listed ones."};

struct Settings {
  Level level = Level::kWarn;
  unsigned mask = kAll;
  std::string host;
};

unsigned subsysBit(const std::string& name) {
  static const struct {
    const char* name;
    unsigned bit;
  } kNames[] = {{"INIT", kInit},   {"MESH", kMesh},       {"COLL", kColl}, {"SHARD", kShard},
                {"OPTIM", kOptim}, {"OFFLOAD", kOffload}, {"TOPO", kTopo}, {"ALL", kAll}};
  for (const auto& n : kNames)
    if (name == n.name) return n.bit;
  return 0;
}

StatusOr<Level> parseLevel(const std::string& level) {
  if (level == "INFO") return Level::kInfo;
  if (level == "TRACE") return Level::kTrace;
  if (level == "NONE") return Level::kNone;
  if (level.empty() || level == "WARN") return Level::kWarn;
  return invalidArgument("HSDP_DEBUG='", level, "' is not NONE, WARN, INFO or TRACE");
}

// The subsystem mask of HSDP_DEBUG_SUBSYS (one list parser: hsdp::parseList).
StatusOr<unsigned> parseMask(const std::string& subsys) {
  if (subsys.empty()) return unsigned{kAll};
  const bool exclude = subsys[0] == '^';
  HSDP_ASSIGN_OR_RETURN(std::vector<std::string> items,
                        parseList(exclude ? subsys.substr(1) : subsys, "HSDP_DEBUG_SUBSYS"));
  unsigned mask = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const unsigned bit = subsysBit(items[i]);
    if (bit == 0)
      return invalidArgument("HSDP_DEBUG_SUBSYS='", subsys, "': element ", i + 1, " '", items[i],
                             "' is not INIT, MESH, COLL, SHARD, OPTIM, OFFLOAD, TOPO or ALL");
    mask |= bit;
  }
  return exclude ? ~mask : mask;
}

const Settings& settings() {
  // Read once: logging must not re-parse the environment on every line.
  static const Settings s = [] {
    Settings out;
    const std::string level = kDebug.get();
    StatusOr<Level> l = parseLevel(level);
    if (l.ok())
      out.level = *l;
    else
      std::fprintf(stderr, "hsdp WARN %s; using WARN\n", l.status().message().c_str());
    StatusOr<unsigned> mask = parseMask(kDebugSubsys.get());
    out.mask = mask.ok() ? *mask : unsigned{kAll};
    out.host = hostName();
    return out;
  }();
  return s;
}

}  // namespace

Status checkSettings() {
  HSDP_RETURN_IF_ERROR(parseLevel(kDebug.get()).status());
  return parseMask(kDebugSubsys.get()).status();
}

namespace {

std::atomic<int> g_rank{-1};

const char* levelName(Level l) {
  switch (l) {
    case Level::kWarn:
      return "WARN";
    case Level::kInfo:
      return "INFO";
    case Level::kTrace:
      return "TRACE";
    default:
      return "";
  }
}

const char* subsysName(Subsys s) {
  switch (s) {
    case kInit:
      return "INIT";
    case kMesh:
      return "MESH";
    case kColl:
      return "COLL";
    case kShard:
      return "SHARD";
    case kOptim:
      return "OPTIM";
    case kOffload:
      return "OFFLOAD";
    case kTopo:
      return "TOPO";
    default:
      return "ALL";
  }
}

}  // namespace

void setRank(int rank) { g_rank = rank; }

bool enabled(Level level, Subsys subsys) {
  const Settings& s = settings();
  return level != Level::kNone && level <= s.level && (s.mask & subsys) != 0;
}

void write(Level level, Subsys subsys, const std::string& message) {
  static std::mutex mu;  // keeps lines from two threads of one rank whole
  const Settings& s = settings();
  int rank = g_rank.load();
  std::lock_guard<std::mutex> lock(mu);
  if (rank >= 0)
    std::fprintf(stderr, "%s:%d [%d] hsdp %s %s %s\n", s.host.c_str(), getpid(), rank,
                 levelName(level), subsysName(subsys), message.c_str());
  else
    std::fprintf(stderr, "%s:%d [-] hsdp %s %s %s\n", s.host.c_str(), getpid(), levelName(level),
                 subsysName(subsys), message.c_str());
}

}  // namespace hsdp::log
