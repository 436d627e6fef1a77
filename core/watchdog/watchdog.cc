// The watchdog's life: settings, labels, waits, start-up over the world communicator, the
// watchdog thread (heartbeat, timeouts, failure notices from peers) and the end of the job.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "core/host.h"
#include "core/watchdog/watchdog_state.h"
#include "hsdp/env.h"
#include "hsdp/log.h"

namespace hsdp::watchdog {

// ---- start and the watchdog thread -------------------------------------------------------------

namespace detail {
namespace {
State* g_state = nullptr;
std::thread g_thread;

// What every rank tells the others at start.
struct PeerInfo {
  int32_t world_rank;
  int32_t pid;
  uint16_t port;
  uint16_t naddr;
  uint32_t addrs[4];
  uint64_t nonce;
  char host[64];
};

std::string handle(char type, const std::string& body) {
  State& s = *g_state;
  if (type == 'Q') return serializeGroup(readGroup(*s.table, kStaleMs));
  if (type == 'A' && body.size() >= sizeof(int32_t)) {
    int32_t from = -1;
    std::memcpy(&from, body.data(), sizeof from);
    s.table->postAbort(from, body.substr(sizeof from));
    return "K";
  }
  return "";
}

void tick();
}  // namespace

State* state() { return g_state; }
}  // namespace detail

bool running() { return detail::g_state != nullptr && detail::g_state->watching; }
bool tracing() { return detail::g_state != nullptr; }

Status start(Comm& world, const Config& cfg) {
  using detail::g_state;
  using detail::PeerInfo;
  detail::mutableConfig() = cfg;
  if (g_state != nullptr) return okStatus();
  if (!*cfg.enabled && !*cfg.check_collectives) return okStatus();
  auto s = std::make_unique<detail::State>();
  s->cfg = cfg;
  s->timeout_s.store(*cfg.timeout_s);
  s->rank = world.rank();
  s->world_size = world.size();
  std::string err;
  if (*cfg.enabled) {
    s->server = oob::Server::listen(&err);
    if (!s->server)
      HSDP_WARN(kInit, "watchdog: no out-of-band channel (", err,
                "): reports will not see other nodes");
  }
  PeerInfo mine{};
  mine.world_rank = s->rank;
  mine.pid = getpid();
  mine.port = s->server ? s->server->port() : 0;
  const std::vector<uint32_t> addrs = oob::localAddresses(4);
  mine.naddr = static_cast<uint16_t>(addrs.size());
  std::copy(addrs.begin(), addrs.end(), mine.addrs);
  if (s->rank == 0) mine.nonce = std::random_device{}() * 0x100000001ull ^ monotonicNs();
  std::snprintf(mine.host, sizeof mine.host, "%s", hostName().c_str());
  std::vector<PeerInfo> all(s->world_size);
  HSDP_RETURN_IF_ERROR(world.allGather(&mine, all.data(), sizeof mine, DType::kUInt8));
  const uint64_t nonce = all[0].nonce;

  // Ranks of one host share a table. Its first rank creates the segment, the others map it, and
  // once everyone has, the name is removed (the mapping lives on until the last rank exits).
  std::vector<int> host_ranks;
  for (int r = 0; r < s->world_size; ++r)
    if (std::strncmp(all[r].host, mine.host, sizeof mine.host) == 0) host_ranks.push_back(r);
  const int leader = host_ranks.front();
  const int local = static_cast<int>(std::find(host_ranks.begin(), host_ranks.end(), s->rank) -
                                     host_ranks.begin());
  char name[64];
  std::snprintf(name, sizeof name, "/hsdp-wd-%016llx-%d", static_cast<unsigned long long>(nonce),
                leader);
  const int members = static_cast<int>(host_ranks.size());
  if (s->rank == leader) s->table = GroupTable::create(name, nonce, members, &err);
  HSDP_RETURN_IF_ERROR(world.barrier());
  if (s->rank != leader && members > 1) s->table = GroupTable::attach(name, nonce, members, &err);
  int32_t shared = s->table != nullptr ? 1 : 0;
  std::vector<int32_t> shared_all(s->world_size);
  HSDP_RETURN_IF_ERROR(world.allGather(&shared, shared_all.data(), 1, DType::kInt32));
  if (s->rank == leader) GroupTable::unlink(name);
  if (s->table == nullptr) {
    HSDP_WARN(kInit, "watchdog: no node-local table (", err, "); this rank reports alone");
    s->table = GroupTable::create("", nonce, 1, &err);
    if (s->table == nullptr) return internalError("watchdog: no table at all: ", err);
  }
  s->my_local = shared ? local : 0;

  // The groups: a host's ranks that mapped its segment (a rank that could not is a group alone).
  s->group_of.assign(s->world_size, -1);
  for (int r = 0; r < s->world_size; ++r) {
    if (s->group_of[r] >= 0) continue;
    detail::Group g;
    g.host = all[r].host;
    for (int q = r; q < s->world_size; ++q) {
      const bool same_host = std::strncmp(all[q].host, all[r].host, sizeof mine.host) == 0;
      if (q == r || (same_host && shared_all[r] && shared_all[q] && s->group_of[q] < 0)) {
        g.ranks.push_back(q);
        s->group_of[q] = static_cast<int>(s->groups.size());
      }
      if (q == r && !shared_all[r]) break;
    }
    for (int q : g.ranks)
      for (int a = 0; a < all[q].naddr && all[q].port != 0; ++a)
        g.addresses.push_back({all[q].addrs[a], all[q].port});
    s->groups.push_back(std::move(g));
  }
  s->my_group = s->group_of[s->rank];
  RankSlot& slot = s->table->slot(s->my_local);
  slot.world_rank = s->rank;
  slot.pid = getpid();
  slot.heartbeat_ns.store(monotonicNs(), std::memory_order_release);
  g_state = s.release();
  // From here on communicators are traced: core's waits and renames reach the watchdog. Never
  // uninstalled, as the state stays after stop() for the traces still alive.
  setCommObserver(&detail::observer());
  if (*cfg.enabled) {
    // Without a server of its own (listen failed) this rank still times out and asks the
    // others; only they cannot ask it.
    if (g_state->server) g_state->server->start(detail::handle);
    g_state->watching = true;
    detail::setWatching(true);
    detail::g_thread = std::thread([] {
      while (!g_state->stop.load()) {
        detail::tick();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  HSDP_INFO(kInit, "watchdog ", *cfg.enabled ? "on" : "off", ", timeout ", *cfg.timeout_s,
            " s, collective checks ", *cfg.check_collectives ? "on" : "off", ", ",
            g_state->groups.size(), " node tables, out-of-band port ", mine.port);
  return okStatus();
}

void stop() {
  detail::State* s = detail::g_state;
  if (s == nullptr) return;
  s->stop.store(true);
  if (detail::g_thread.joinable()) detail::g_thread.join();
  detail::setWatching(false);
  s->server.reset();
  // The state stays: communicators still alive keep their table slots until destroyed.
}

// ---- the job view ------------------------------------------------------------------------------

namespace detail {

JobView snapshot(int timeout_ms) {
  State& s = *g_state;
  JobView job;
  job.ranks.resize(s.world_size);
  job.hosts.resize(s.world_size);
  // Virtual nodes (HSDP_RANKS_PER_NODE) are named as the topology names them: host/v<i>.
  StatusOr<std::optional<int64_t>> rpn = env::kRanksPerNode.get();
  const int64_t per_node = rpn.ok() && rpn->has_value() ? **rpn : 0;
  for (int r = 0; r < s.world_size; ++r) {
    job.ranks[r].world_rank = r;
    job.ranks[r].state = 'U';
    job.hosts[r] = s.groups[s.group_of[r]].host;
    if (per_node > 0) job.hosts[r] += strCat("/v", r / per_node);
  }
  auto place = [&](const std::vector<RankView>& views) {
    for (const RankView& v : views)
      if (v.world_rank >= 0 && v.world_rank < s.world_size && v.pid != 0)
        job.ranks[v.world_rank] = v;
  };
  place(readGroup(*s.table, kStaleMs));
  std::vector<std::string> replies(s.groups.size());
  std::vector<char> answered(s.groups.size(), 0);
  std::vector<std::thread> asks;
  for (size_t g = 0; g < s.groups.size(); ++g) {
    if (static_cast<int>(g) == s.my_group || s.groups[g].addresses.empty()) continue;
    asks.emplace_back([&, g] {
      answered[g] = oob::requestAny(s.groups[g].addresses, 'Q', "", timeout_ms, &replies[g]);
    });
  }
  for (std::thread& t : asks) t.join();
  for (size_t g = 0; g < s.groups.size(); ++g) {
    std::vector<RankView> views;
    if (answered[g] && parseGroup(replies[g], &views)) place(views);
  }
  return job;
}

std::vector<TraceInfo> traceInfos() {
  State& s = *g_state;
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<TraceInfo> out;
  for (const CommTrace* t : s.traces) {
    TraceInfo info;
    info.id = t->id();
    info.name = t->name();
    info.members = t->members();
    info.entered = t->entered();
    info.last_enter = t->lastEnter();
    for (uint64_t q = info.entered; q > 0 && q + kRing > info.entered; --q)
      info.ring[q % kRing] = t->fingerprint(q);
    out.push_back(std::move(info));
  }
  return out;
}

namespace {

std::string secondsText(double s) {
  return s >= 10 ? strCat(static_cast<long long>(std::llround(s)))
                 : strCat(std::round(s * 10) / 10);
}

// Every 100 ms on the watchdog thread: heartbeat, the oldest wait, notices, the timeout.
// This rank's own gaps: a tick long after the last one means the process did not run (it was
// stopped, or starved), which its own report says, since its clocks ran on meanwhile.
// After such a gap this rank's own timeout counts from the resume: a rank that was stopped for a
// while (a debugger) does not end the job on its own the moment it runs again.
int64_t g_last_tick_ns = 0;
int64_t g_gap_ns = 0;
int64_t g_gap_at_ns = 0;
int64_t g_notice_at_ns = 0;  // when another rank's abort notice was first seen
constexpr int64_t kMismatchGraceNs = 1'000'000'000;

std::string ownGap(int64_t now) {
  if (g_gap_ns < kStaleMs * 1000000 || now - g_gap_at_ns > 30'000'000'000) return "";
  return strCat("; this rank itself did not run for ", secondsText(g_gap_ns * 1e-9),
                " s (stopped?)");
}

void tick() {
  State& s = *g_state;
  const int64_t now = monotonicNs();
  if (g_last_tick_ns != 0 && now - g_last_tick_ns > kStaleMs * 1000000) {
    g_gap_ns = now - g_last_tick_ns;
    g_gap_at_ns = now;
  }
  g_last_tick_ns = now;
  RankSlot& slot = s.table->slot(s.my_local);
  slot.heartbeat_ns.store(now, std::memory_order_release);
  const WaitInfo wait = longestWait(now);
  slot.waiting_since_ns.store(wait.waiting ? now - static_cast<int64_t>(wait.seconds * 1e9) : 0,
                              std::memory_order_relaxed);
  int from = -1;
  std::string reason;
  const double timeout = s.timeout_s.load();
  // A mismatch is seen by every member of the communicator alike: a member whose own comparison
  // is under way gets a moment to print its own verdict (both ranks' collectives) first.
  const bool notice = s.table->abortNotice(&from, &reason) && from != s.rank;
  if (notice && g_notice_at_ns == 0) g_notice_at_ns = now;
  const bool mismatch = reason.rfind("collective mismatch", 0) == 0;
  if (notice && (!mismatch || now - g_notice_at_ns > kMismatchGraceNs)) {
    const std::string cause = strCat("rank ", from, ": ", reason);
    std::string line;
    if (wait.waiting)
      line = timeoutLine(s.rank, wait, traceInfos(), snapshot(1500), timeout, cause);
    else
      line = strCat("hsdp [rank ", s.rank, "]: job ends: ", cause, "; this rank was not waiting");
    fatal(line + ownGap(now), reason);
  }
  const double since_resume = g_gap_at_ns ? (now - g_gap_at_ns) * 1e-9 : wait.seconds;
  if (wait.waiting && std::min(wait.seconds, since_resume) > timeout) {
    const std::string line = timeoutLine(s.rank, wait, traceInfos(), snapshot(1500), timeout, "");
    fatal(line + ownGap(now), strCat("timeout after ", secondsText(wait.seconds), " s"));
  }
}

}  // namespace
}  // namespace detail

// ---- the end -----------------------------------------------------------------------------------

void fatal(const std::string& line, const std::string& reason) {
  static std::atomic<bool> once{false};
  if (once.exchange(true)) {
    for (;;) pause();  // another thread is ending the process
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  detail::State* sp = detail::g_state;
  if (sp == nullptr || !sp->watching) {
    // No watchdog (only HSDP_CHECK_COLLECTIVES): the others detect the same mismatch
    // themselves (every member sees the same fingerprints); give their lines a moment before
    // mpirun ends the job.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    _exit(kExitCode);
  }
  detail::State& s = *sp;
  RankSlot& slot = s.table->slot(s.my_local);
  slot.reported.store(1, std::memory_order_release);
  s.table->postAbort(s.rank, reason);
  std::string notice(sizeof(int32_t), '\0');
  const int32_t from = s.rank;
  std::memcpy(notice.data(), &from, sizeof from);
  notice += reason;
  {
    std::vector<std::thread> tell;
    for (size_t g = 0; g < s.groups.size(); ++g) {
      if (static_cast<int>(g) == s.my_group || s.groups[g].addresses.empty()) continue;
      tell.emplace_back([&, g] {
        std::string ack;
        (void)oob::requestAny(s.groups[g].addresses, 'A', notice, 1000, &ack);
      });
    }
    for (std::thread& t : tell) t.join();
  }
  // Leave once every rank that can print has printed: the first rank to exit makes mpirun end
  // the job. Stopped, gone and unreachable ranks are not waited for; at most 5 s.
  const int64_t deadline = monotonicNs() + 5'000'000'000;
  while (monotonicNs() < deadline) {
    slot.heartbeat_ns.store(monotonicNs(), std::memory_order_release);
    const JobView job = detail::snapshot(500);
    bool all = true;
    for (const RankView& r : job.ranks)
      if (r.state == 'R' && !r.reported) all = false;
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  _exit(kExitCode);
}

Status waitForPeerWork(Work& work, int poll_ms) {
  for (;;) {
    HSDP_ASSIGN_OR_RETURN(bool done, work.test());
    if (done) return okStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
}

}  // namespace hsdp::watchdog
