#include "hsdp/log.h"

#include "hsdp/host.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "hsdp/env.h"

namespace hsdp::log {
namespace {

struct Settings {
  Level level = Level::kWarn;
  unsigned mask = kAll;
  std::string host;
};

unsigned subsysBit(const std::string& name) {
  static const struct { const char* name; unsigned bit; } kNames[] = {
      {"INIT", kInit}, {"MESH", kMesh}, {"COLL", kColl}, {"SHARD", kShard},
      {"OPTIM", kOptim}, {"OFFLOAD", kOffload}, {"TOPO", kTopo}, {"ALL", kAll}};
  for (const auto& n : kNames)
    if (name == n.name) return n.bit;
  return 0;
}

const Settings& settings() {
  // Read once: logging must not re-parse the environment on every line.
  static const Settings s = [] {
    Settings out;
    std::string level = env::getString("HSDP_DEBUG");
    if (level == "INFO") out.level = Level::kInfo;
    else if (level == "TRACE") out.level = Level::kTrace;
    else if (level == "NONE") out.level = Level::kNone;
    else if (level.empty() || level == "WARN") out.level = Level::kWarn;
    else std::fprintf(stderr, "hsdp WARN HSDP_DEBUG='%s' is not WARN|INFO|TRACE; using WARN\n",
                      level.c_str());
    std::string subsys = env::getString("HSDP_DEBUG_SUBSYS");
    if (!subsys.empty()) {
      bool exclude = subsys[0] == '^';
      unsigned mask = 0;
      std::stringstream ss(exclude ? subsys.substr(1) : subsys);
      for (std::string item; std::getline(ss, item, ',');) mask |= subsysBit(item);
      out.mask = exclude ? ~mask : mask;
    }
    out.host = hostName();
    return out;
  }();
  return s;
}

std::atomic<int> g_rank{-1};

const char* levelName(Level l) {
  switch (l) {
    case Level::kWarn: return "WARN";
    case Level::kInfo: return "INFO";
    case Level::kTrace: return "TRACE";
    default: return "";
  }
}

const char* subsysName(Subsys s) {
  switch (s) {
    case kInit: return "INIT";
    case kMesh: return "MESH";
    case kColl: return "COLL";
    case kShard: return "SHARD";
    case kOptim: return "OPTIM";
    case kOffload: return "OFFLOAD";
    case kTopo: return "TOPO";
    default: return "ALL";
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
