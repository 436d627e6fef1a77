// hsdp-trace: the step timelines the ranks wrote (HSDP_TRACE=DIR, the examples' --trace DIR;
// docs/trace.md), on one clock:
//   hsdp-trace merge DIR -o all.json            every rank's events in one Chrome trace file
//   hsdp-trace svg DIR -o step.svg [--steps A:B] a timeline: a row per rank x lane
// Every file goes through the library's bounded JSON reader (core/json.h); a file that is not a
// trace, or holds values out of range, is an error naming it. Exit 0; 2 on bad input or usage.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/json.h"
#include "hsdp/cli.h"
#include "hsdp/files.h"
#include "hsdp/status.h"

namespace {

using hsdp::Status;
using hsdp::StatusOr;
using nlohmann::json;

constexpr uint64_t kMaxFileBytes = uint64_t{256} << 20;  // one rank's trace
constexpr uint64_t kMaxTotalBytes = uint64_t{1} << 30;   // all of them
constexpr int kMaxRanks = 1 << 16;
constexpr int kMaxLanes = 64;
constexpr int64_t kMaxTime = int64_t{1} << 53;  // µs: exact in a double
constexpr int kMaxSvgEvents = 200000;           // boxes one picture draws

struct Event {
  int rank = 0, lane = 0, step = 0, unit = -1;
  int64_t ts = 0, dur = 0;  // on rank 0's clock
  std::string name;
  json args;
};

struct Rank {
  int rank = 0, node = 0;
  int64_t offset = 0;
  std::map<int, std::string> lanes;  // tid -> name
  std::string process;
};

struct Trace {
  std::vector<Rank> ranks;  // by rank
  std::vector<Event> events;
};

Status bad(const std::string& file, const std::string& what) {
  return hsdp::invalidArgument(file, ": ", what);
}

StatusOr<int64_t> intField(const json& o, const char* key, int64_t lo, int64_t hi,
                           const std::string& file, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer())
    return bad(file, hsdp::strCat(where, ": '", key, "' is missing or not an integer"));
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return bad(file,
               hsdp::strCat(where, ": '", key, "' = ", v, " is outside [", lo, ", ", hi, "]"));
  return v;
}

// One rank's file: its metadata and its events, shifted onto rank 0's clock.
Status readRank(const std::string& file, int file_rank, Trace* t) {
  HSDP_ASSIGN_OR_RETURN(std::string text, hsdp::files::readBounded(file, kMaxFileBytes, "trace"));
  HSDP_ASSIGN_OR_RETURN(json doc, hsdp::parseJson(text, file));
  text.clear();
  if (!doc.is_object()) return bad(file, "not a JSON object");
  auto other = doc.find("otherData");
  auto events = doc.find("traceEvents");
  if (other == doc.end() || !other->is_object())
    return bad(file, "no 'otherData' object (not an hsdp trace)");
  if (events == doc.end() || !events->is_array()) return bad(file, "no 'traceEvents' array");
  Rank r;
  HSDP_ASSIGN_OR_RETURN(int64_t rank,
                        intField(*other, "rank", 0, kMaxRanks - 1, file, "otherData"));
  if (rank != file_rank)
    return bad(file,
               hsdp::strCat("otherData: rank ", rank, " but the file is rank ", file_rank, "'s"));
  r.rank = static_cast<int>(rank);
  HSDP_ASSIGN_OR_RETURN(int64_t node,
                        intField(*other, "node", 0, kMaxRanks - 1, file, "otherData"));
  r.node = static_cast<int>(node);
  HSDP_ASSIGN_OR_RETURN(
      r.offset, intField(*other, "clock_offset_us", -kMaxTime, kMaxTime, file, "otherData"));
  for (size_t k = 0; k < events->size(); ++k) {
    const json& e = (*events)[k];
    const std::string where = hsdp::strCat("traceEvents[", k, "]");
    if (!e.is_object()) return bad(file, where + ": not an object");
    auto ph = e.find("ph");
    auto name = e.find("name");
    if (ph == e.end() || !ph->is_string() || name == e.end() || !name->is_string())
      return bad(file, where + ": 'ph' and 'name' must be strings");
    HSDP_ASSIGN_OR_RETURN(int64_t pid, intField(e, "pid", 0, kMaxRanks - 1, file, where));
    if (pid != rank) return bad(file, hsdp::strCat(where, ": pid ", pid, " is not rank ", rank));
    HSDP_ASSIGN_OR_RETURN(int64_t tid, intField(e, "tid", 0, kMaxLanes - 1, file, where));
    const std::string p = ph->get<std::string>(), n = name->get<std::string>();
    if (p == "M") {
      auto a = e.find("args");
      if (a == e.end() || !a->is_object()) return bad(file, where + ": metadata without 'args'");
      auto an = a->find("name");
      if (n == "process_name" && an != a->end() && an->is_string()) r.process = *an;
      if (n == "thread_name" && an != a->end() && an->is_string())
        r.lanes[static_cast<int>(tid)] = an->get<std::string>();
      continue;
    }
    if (p != "X") return bad(file, where + ": phase '" + p + "' (an hsdp trace has X and M only)");
    Event ev;
    ev.rank = r.rank, ev.lane = static_cast<int>(tid), ev.name = n;
    HSDP_ASSIGN_OR_RETURN(int64_t ts, intField(e, "ts", 0, kMaxTime, file, where));
    HSDP_ASSIGN_OR_RETURN(ev.dur, intField(e, "dur", 0, kMaxTime, file, where));
    ev.ts = ts - r.offset;
    auto a = e.find("args");
    if (a != e.end()) {
      if (!a->is_object()) return bad(file, where + ": 'args' is not an object");
      HSDP_ASSIGN_OR_RETURN(int64_t step, intField(*a, "step", 0, kMaxTime, file, where + ".args"));
      ev.step = static_cast<int>(std::min<int64_t>(step, INT32_MAX));
      ev.args = *a;
    }
    t->events.push_back(std::move(ev));
  }
  if (r.lanes.empty()) return bad(file, "no thread_name metadata: its lanes are unnamed");
  t->ranks.push_back(std::move(r));
  return hsdp::okStatus();
}

StatusOr<Trace> readDir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return hsdp::notFound(dir, ": not a directory");
  static const std::regex kName(R"(trace\.rank([0-9]{1,6})\.json)");
  std::map<int, std::string> files;
  uint64_t total = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::smatch m;
    const std::string name = it->path().filename().string();
    if (!std::regex_match(name, m, kName)) continue;
    const int rank = std::stoi(m[1]);
    if (rank >= kMaxRanks) return bad(it->path().string(), "rank beyond the limit");
    // A trace file is a regular file of ours: a link, FIFO, device or socket is refused by name
    // (file_size would block on none of them, but it fails with a message naming no file).
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (!fs::is_regular_file(st))
      return bad(it->path().string(), "not a regular file (a link, FIFO, device or socket)");
    const uint64_t size = it->file_size(ec);
    if (ec) break;
    total += size;
    if (total > kMaxTotalBytes)
      return bad(dir, hsdp::strCat("the traces hold more than ", kMaxTotalBytes, " bytes"));
    files[rank] = it->path().string();
  }
  if (ec) return bad(dir, ec.message());
  if (files.empty()) return hsdp::notFound(dir, ": no trace.rank<N>.json files");
  Trace t;
  for (const auto& [rank, file] : files) HSDP_RETURN_IF_ERROR(readRank(file, rank, &t));
  return t;
}

Status merge(const Trace& t, const std::string& out) {
  json events = json::array();
  for (const Rank& r : t.ranks) {
    events.push_back({{"ph", "M"},
                      {"pid", r.rank},
                      {"tid", 0},
                      {"name", "process_name"},
                      {"args", {{"name", r.process}}}});
    events.push_back({{"ph", "M"},
                      {"pid", r.rank},
                      {"tid", 0},
                      {"name", "process_sort_index"},
                      {"args", {{"sort_index", r.rank}}}});
    for (const auto& [tid, name] : r.lanes)
      events.push_back({{"ph", "M"},
                        {"pid", r.rank},
                        {"tid", tid},
                        {"name", "thread_name"},
                        {"args", {{"name", name}}}});
  }
  for (const Event& e : t.events)
    events.push_back({{"ph", "X"},
                      {"pid", e.rank},
                      {"tid", e.lane},
                      {"name", e.name},
                      {"cat", e.name},
                      {"ts", e.ts},
                      {"dur", e.dur},
                      {"args", e.args}});
  json doc = {{"displayTimeUnit", "ms"},
              {"otherData",
               {{"format", "hsdp-trace merged 1"},
                {"ranks", t.ranks.size()},
                {"clock", "rank 0's steady clock, us"}}},
              {"traceEvents", std::move(events)}};
  return hsdp::files::writeFileAtomically(out, hsdp::dumpJsonEscaped(doc) + "\n");
}

const char* colourOf(const std::string& kind) {
  static const std::map<std::string, const char*> kColours = {{"compute", "#4e79a7"},
                                                              {"wait gather", "#e15759"},
                                                              {"wait reduce-scatter", "#e15759"},
                                                              {"wait replica", "#e15759"},
                                                              {"optimizer", "#59a14f"},
                                                              {"gather", "#f28e2b"},
                                                              {"reduce-scatter", "#edc948"},
                                                              {"replica all-reduce", "#b07aa1"},
                                                              {"snapshot", "#9c755f"},
                                                              {"step", "#bab0ac"}};
  auto it = kColours.find(kind);
  return it == kColours.end() ? "#76b7b2" : it->second;
}

std::string xmlEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<')
      o += "&lt;";
    else if (c == '>')
      o += "&gt;";
    else if (c == '&')
      o += "&amp;";
    else if (c == '"')
      o += "&quot;";
    else if (static_cast<unsigned char>(c) >= 0x20)
      o += c;
  }
  return o;
}

Status svg(const Trace& t, const std::string& out, int first, int last) {
  std::vector<const Event*> shown;
  for (const Event& e : t.events)
    if (e.step >= first && e.step <= last) shown.push_back(&e);
  if (shown.empty())
    return hsdp::invalidArgument("--steps ", first, ":", last, ": no events in those steps");
  if (shown.size() > kMaxSvgEvents)
    return hsdp::invalidArgument("--steps ", first, ":", last, ": ", shown.size(),
                                 " events, more than one picture draws (", kMaxSvgEvents,
                                 "); choose fewer steps");
  int64_t t0 = INT64_MAX, t1 = INT64_MIN;
  for (const Event* e : shown) t0 = std::min(t0, e->ts), t1 = std::max(t1, e->ts + e->dur);
  const double span = std::max<int64_t>(t1 - t0, 1);
  constexpr double kLeft = 170, kWidth = 1400, kRow = 16, kTop = 40;
  // One row per rank x lane, in rank then lane order.
  std::map<std::pair<int, int>, int> row;
  std::string rows;
  for (const Rank& r : t.ranks)
    for (const auto& [tid, name] : r.lanes) {
      const int k = static_cast<int>(row.size());
      row[{r.rank, tid}] = k;
      char b[256];
      std::snprintf(b, sizeof b, "<text x=\"4\" y=\"%.1f\" font-size=\"11\">rank %d %s</text>\n",
                    kTop + k * kRow + 12, r.rank, xmlEscape(name).c_str());
      rows += b;
    }
  const double height = kTop + row.size() * kRow + 30;
  std::string s;
  char b[512];
  std::snprintf(b, sizeof b,
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/"
                "svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\">\n<title>hsdp "
                "steps %d-%d, %zu ranks</title>\n",
                kLeft + kWidth + 20, height, first, last, t.ranks.size());
  s += b;
  s += rows;
  for (const auto& [key, k] : row) {  // one group per row, its boxes inside
    std::snprintf(b, sizeof b, "<g class=\"row\" data-rank=\"%d\" data-lane=\"%d\">\n", key.first,
                  key.second);
    s += b;
    for (const Event* e : shown) {
      if (e->rank != key.first || e->lane != key.second) continue;
      const double x = kLeft + (e->ts - t0) / span * kWidth;
      const double w = std::max(0.5, e->dur / span * kWidth);
      std::snprintf(b, sizeof b,
                    "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>"
                    "%s step %d unit %s: %.3f ms</title></rect>\n",
                    x, kTop + k * kRow + 2, w, kRow - 4, colourOf(e->name),
                    xmlEscape(e->name).c_str(), e->step,
                    e->args.contains("unit") ? e->args["unit"].dump().c_str() : "-", e->dur / 1e3);
      s += b;
    }
    s += "</g>\n";
  }
  // The time axis in ms: about ten ticks at a round step.
  const double ms = span / 1e3;
  double tick = 1e-3;
  for (int k = 0; ms / tick > 12; ++k)  // 1, 2, 5 x 10^n µs
    tick = (k % 3 == 0 ? 2 : k % 3 == 1 ? 5 : 10) * std::pow(10.0, k / 3 - 3);
  s += "<g class=\"axis\">\n";
  for (double v = 0; v <= ms; v += tick) {
    const double x = kLeft + v / ms * kWidth;
    std::snprintf(b, sizeof b,
                  "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#ccc\"/><text "
                  "x=\"%.2f\" y=\"%.1f\" font-size=\"10\">%g ms</text>\n",
                  x, kTop - 4, x, height - 24, x, kTop - 8, v);
    s += b;
  }
  s += "</g>\n<g class=\"steps\">\n";
  for (const Event* e : shown)  // step boundaries: where rank 0's steps end
    if (e->name == "step" && e->rank == t.ranks.front().rank) {
      const double x = kLeft + (e->ts + e->dur - t0) / span * kWidth;
      std::snprintf(b, sizeof b,
                    "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"black\" "
                    "stroke-dasharray=\"4 2\"/><text x=\"%.2f\" y=\"%.1f\" font-size=\"10\">end "
                    "of step %d</text>\n",
                    x, kTop, x, height - 24, x + 2, height - 10, e->step);
      s += b;
    }
  s += "</g>\n</svg>\n";
  return hsdp::files::writeFileAtomically(out, s);
}

int fail(const Status& s) {
  std::fprintf(stderr, "hsdp-trace: error: %s\n", s.message().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hsdp step timelines: merge the ranks' traces onto one clock, draw steps as SVG",
               "hsdp-trace"};
  app.require_subcommand(1);
  std::string dir, out, steps;
  CLI::App* m = app.add_subcommand("merge", "One Chrome trace file, every rank on rank 0's clock");
  m->add_option("DIR", dir, "Directory of trace.rank<N>.json (HSDP_TRACE, --trace)")->required();
  m->add_option("-o,--output", out, "Merged JSON file")->required();
  CLI::App* v = app.add_subcommand("svg", "An SVG timeline: a row per rank x lane");
  v->add_option("DIR", dir, "Directory of trace.rank<N>.json")->required();
  v->add_option("-o,--output", out, "SVG file")->required();
  v->add_option("--steps", steps, "A:B, the steps drawn (0-based, inclusive; default all)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return hsdp::cli::reportParseError(app, e, "hsdp-trace");
  }
  int first = 0, last = INT32_MAX;
  if (!steps.empty()) {
    static const std::regex kRange(R"(([0-9]{1,9}):([0-9]{1,9}))");
    std::smatch sm;
    if (!std::regex_match(steps, sm, kRange) || std::stoi(sm[1]) > std::stoi(sm[2])) {
      std::fprintf(stderr, "hsdp-trace: error: --steps '%s' is not A:B with 0 <= A <= B\n",
                   steps.c_str());
      return 2;
    }
    first = std::stoi(sm[1]), last = std::stoi(sm[2]);
  }
  auto t = readDir(dir);
  if (!t.ok()) return fail(t.status());
  Status s = m->parsed() ? merge(*t, out) : svg(*t, out, first, last);
  if (!s.ok()) return fail(s);
  std::printf("hsdp-trace: %zu ranks, %zu events -> %s\n", t->ranks.size(), t->events.size(),
              out.c_str());
  return 0;
}
