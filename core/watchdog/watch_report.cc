// The one line a rank prints when the watchdog ends the job: what it waits for, on which
// communicator and sequence number, and who has not arrived, each rank named with its node and
// what the table says of it (stopped, gone, unreachable, alive and waiting elsewhere). Made from
// this rank's traces and a snapshot of the whole job (watchdog.cc), after the failure only.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/watchdog/watchdog.h"
#include "hsdp/dtype.h"

namespace hsdp::watchdog {
namespace {

std::string field(const char* s, size_t cap) { return std::string(s, strnlen(s, cap)); }

std::string dtypeWord(uint8_t dtype, uint64_t count) {
  const auto t = static_cast<DType>(dtype);
  if (t == DType::kFloat32) return count == 1 ? "float" : "floats";
  if (t == DType::kUInt8) return count == 1 ? "byte" : "bytes";
  const std::string name = dtypeName(t);  // "?" for a value no DType has
  return name == "?" ? "elements" : name;
}

std::string seconds(double s) {
  if (s >= 10) return strCat(static_cast<long long>(std::llround(s)));
  return strCat(std::round(s * 10) / 10);
}

// How the table sees a rank, for the report.
std::string stateText(const RankView& v) {
  switch (v.state) {
    case 'U':
      return "unreachable";
    case 'X':
      return "gone";
    case 'T':
      if (v.heartbeat_age_ms >= 0)
        return strCat("stopped, no heartbeat for ", seconds(v.heartbeat_age_ms / 1e3), " s");
      return "stopped";
    default:
      if (v.waiting_ms >= 0)
        return strCat("alive, waiting for ", seconds(v.waiting_ms / 1e3), " s");
      return "alive, not waiting";
  }
}

bool faulty(const RankView& v) { return v.state == 'U' || v.state == 'T' || v.state == 'X'; }

// "rank 2 (hsdp-node0, stopped), ranks 4-7 (hsdp-node1, unreachable)": consecutive ranks with the
// same node and state share one entry.
std::string rankList(const std::vector<int>& ranks, const JobView& job, bool with_state) {
  std::vector<int> r = ranks;
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  std::string out;
  for (size_t i = 0; i < r.size();) {
    auto note = [&](int q) {
      std::string n = job.hosts[q];
      if (with_state) n += ", " + stateText(job.ranks[q]);
      return n;
    };
    size_t j = i + 1;
    const std::string ni = note(r[i]);
    // Runs of ranks that differ only in how long they have waited share the first one's note.
    auto key = [&](int q) {
      return job.hosts[q] + std::string(1, job.ranks[q].state) +
             (job.ranks[q].waiting_ms >= 0 ? "w" : "");
    };
    while (j < r.size() && r[j] == r[j - 1] + 1 && key(r[j]) == key(r[i])) ++j;
    if (!out.empty()) out += ", ";
    if (j - i == 1)
      out += strCat("rank ", r[i], " (", ni, ")");
    else
      out += strCat("ranks ", r[i], "-", r[j - 1], " (", ni, ")");
    i = j;
  }
  return out;
}

// "4-7", "0, 2, 5-6": ascending ranks, runs joined.
std::string rangeText(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i + 1;
    while (j < ranks.size() && ranks[j] == ranks[j - 1] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j - i == 1 ? strCat(ranks[i]) : strCat(ranks[i], "-", ranks[j - 1]);
    i = j;
  }
  return out;
}

struct Candidate {
  const TraceInfo* t = nullptr;
  uint64_t seq = 0;
  std::vector<int> behind;  // entered fewer collectives of it than this rank
  std::vector<int> faulty;  // stopped, gone or unreachable members
  std::string mismatch;
  int score = 0;
};

const Fingerprint* ringAt(const TraceInfo& t, uint64_t seq) {
  if (seq == 0) return nullptr;
  const Fingerprint& f = t.ring[seq % kRing];
  return f.seq == seq ? &f : nullptr;
}

}  // namespace

std::string describe(const Fingerprint& f) {
  const auto kind = static_cast<OpKind>(f.kind);
  std::string s = opKindName(kind);
  if (f.unit[0] != '\0') s += strCat(" of unit \"", field(f.unit, sizeof f.unit), "\"");
  if (kind == OpKind::kBarrier) return s;
  s += strCat(" (", f.count, " ", dtypeWord(f.dtype, f.count));
  if (f.root >= 0) s += strCat(", root ", f.root);
  if (f.ops > 1) s += strCat(", ", static_cast<int>(f.ops), " operations");
  if (kind == OpKind::kReduceScatter || kind == OpKind::kAllReduce)
    s += strCat(", ", redOpName(static_cast<RedOp>(f.redop)));
  return s + ")";
}

std::string timeoutLine(int me, const WaitInfo& wait, const std::vector<TraceInfo>& traces,
                        const JobView& job, double timeout_s, const std::string& cause) {
  const int world = static_cast<int>(job.ranks.size());
  const uint64_t wait_id = wait.comm_id;
  Candidate best;
  for (const TraceInfo& t : traces) {
    if (t.members.size() < 2 || t.entered == 0) continue;
    Candidate c;
    c.t = &t;
    uint64_t lag_min = t.entered;
    for (int m : t.members) {
      if (m == me || m < 0 || m >= world) continue;
      const RankView& v = job.ranks[m];
      if (faulty(v)) c.faulty.push_back(m);
      if (v.state == 'U') continue;
      const CommView* cv = v.comm(t.id);
      const uint64_t e = cv ? cv->entered : 0;
      if (e < t.entered) {
        c.behind.push_back(m);
        lag_min = std::min(lag_min, e);
      }
      const uint64_t q = std::min(e, t.entered);
      const Fingerprint* ours = ringAt(t, q);
      const Fingerprint* theirs = cv ? cv->find(q) : nullptr;
      if (c.mismatch.empty() && ours && theirs && !sameCollective(*ours, *theirs))
        c.mismatch = strCat("fingerprints differ at seq ", q, ": rank ", m, " entered ",
                            describe(*theirs), " where rank ", me, " entered ", describe(*ours));
    }
    c.seq = !c.behind.empty() ? lag_min + 1 : (t.id == wait_id ? wait.seq : t.entered);
    c.score = (t.id == wait_id ? 16 : 0) + (c.mismatch.empty() ? 0 : 8) +
              (c.behind.empty() ? 0 : 4) + (c.faulty.empty() ? 0 : 2);
    if (c.score == 0) continue;
    const Fingerprint* f = ringAt(t, c.seq);
    if (f && !wait.detail.empty() && wait.detail == field(f->unit, sizeof f->unit)) c.score += 1;
    // Ties: the communicator this rank entered a collective on last (when nobody can be asked,
    // that is where it waits).
    if (best.t == nullptr || c.score > best.score ||
        (c.score == best.score && t.last_enter > best.t->last_enter))
      best = std::move(c);
  }

  std::string line = strCat("hsdp [rank ", me, "]: timeout: ");
  std::vector<int> listed;
  if (best.t != nullptr) {
    const TraceInfo& t = *best.t;
    const Fingerprint* f = ringAt(t, best.seq);
    const std::string comm = t.name.empty() ? strCat("communicator ", t.id) : t.name;
    std::string where;
    if (f != nullptr && f->group[0] != '\0') where = field(f->group, sizeof f->group) + ", ";
    where += strCat(comm, ", seq ", best.seq);
    if (f != nullptr) {
      line += opKindName(static_cast<OpKind>(f->kind));
      if (f->unit[0] != '\0') line += strCat(" of unit \"", field(f->unit, sizeof f->unit), "\"");
      line += " (" + where + ")";
    } else {
      line += "collective (" + where + ")";
    }
  } else if (!wait.what.empty()) {
    line += wait.what + (wait.detail.empty() ? "" : " \"" + wait.detail + "\"");
  } else {
    line += "wait";
  }
  line += strCat(" not complete after ", seconds(wait.seconds), " s");
  if (best.t != nullptr && !wait.what.empty())
    line += " (in " + wait.what + (wait.detail.empty() ? "" : " \"" + wait.detail + "\"") + ")";
  if (best.t != nullptr) {
    std::vector<int> missing = best.behind;
    missing.insert(missing.end(), best.faulty.begin(), best.faulty.end());
    if (missing.empty())
      line += strCat("; every rank of ", best.t->name, " entered it and is alive");
    else
      line += "; not arrived: " + rankList(missing, job, true);
    listed = missing;
    if (!best.mismatch.empty()) line += "; " + best.mismatch;
  } else {
    line += "; no communicator of this rank shows a missing rank";
  }
  // Nodes that did not answer at all, once each; then failures anywhere else in the job (the
  // root cause behind a rank that waits, too).
  std::vector<std::string> cut_hosts;
  for (int r = 0; r < world; ++r) {
    const std::string& h = job.hosts[r];
    if (std::find(cut_hosts.begin(), cut_hosts.end(), h) != cut_hosts.end()) continue;
    bool all = true;
    std::vector<int> ranks;
    for (int q = 0; q < world; ++q)
      if (job.hosts[q] == h) {
        ranks.push_back(q);
        all = all && job.ranks[q].state == 'U';
      }
    if (!all) continue;
    cut_hosts.push_back(h);
    line += strCat("; unreachable: ", h, " (", ranks.size() == 1 ? "rank " : "ranks ",
                   rangeText(ranks), ")");
  }
  std::vector<int> elsewhere;
  for (int r = 0; r < world; ++r)
    if (r != me && faulty(job.ranks[r]) &&
        std::find(listed.begin(), listed.end(), r) == listed.end() &&
        std::find(cut_hosts.begin(), cut_hosts.end(), job.hosts[r]) == cut_hosts.end())
      elsewhere.push_back(r);
  if (!elsewhere.empty()) line += "; elsewhere: " + rankList(elsewhere, job, true);
  if (!cause.empty())
    line += "; job ended by " + cause;
  else
    line += strCat(" (HSDP_TIMEOUT_S=", seconds(timeout_s), ")");
  return line;
}

}  // namespace hsdp::watchdog
