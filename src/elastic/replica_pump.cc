// The replica ring's frame pump (one duplex transfer under a progress deadline) and its failure
// attribution (docs/elastic.md, "The replica transport": deadlines and who is named).
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "elastic/replica_ring.h"
#include "elastic/replica_wire.h"

namespace hsdp::elastic {
namespace {

using Ms = std::chrono::milliseconds;

struct Abort {
  std::set<int> suspects;
  std::string text;
};

// Reads one abort report from a control connection; a peer's EOF or reset is an error.
StatusOr<Abort> readAbort(int fd, int size, net::Clock::time_point deadline,
                          const std::string& who) {
  char h[wire::kAbortHeaderBytes];
  HSDP_RETURN_IF_ERROR(net::readAll(fd, h, sizeof(h), deadline, who));
  if (wire::get32(h) != wire::kAbortMagic)
    return failedPrecondition(who, ": not an abort report on the control connection");
  const uint32_t n = std::min<uint32_t>(wire::get32(h + 8), 4096);
  const uint32_t len = std::min<uint32_t>(wire::get32(h + 12), 1 << 16);
  std::string body(4 * static_cast<size_t>(n) + len, '\0');
  HSDP_RETURN_IF_ERROR(net::readAll(fd, body.data(), body.size(), deadline, who));
  Abort a;
  for (uint32_t i = 0; i < n; ++i) {
    const int s = static_cast<int>(wire::get32(body.data() + 4 * i));
    if (s >= 0 && s < size) a.suspects.insert(s);
  }
  a.text = body.substr(4 * static_cast<size_t>(n));
  return a;
}

}  // namespace

Status ReplicaRing::fail(const std::string& what, std::set<int> suspects, std::set<int> dead,
                         std::string detail, int reported_by, std::set<int> reported) {
  // Tell every peer (best effort, never blocking: the control connection carries nothing else).
  std::set<int> blamed = suspects;
  blamed.insert(dead.begin(), dead.end());
  std::string frame;
  wire::put32(frame, wire::kAbortMagic);
  wire::put32(frame, op_seq_);
  wire::put32(frame, static_cast<uint32_t>(blamed.size()));
  const std::string text = strCat(describe(self_), " failed ", what, ": ", detail);
  wire::put32(frame, static_cast<uint32_t>(text.size()));
  for (int s : blamed) wire::put32(frame, static_cast<uint32_t>(s));
  frame += text;
  for (int j = 0; j < size(); ++j)
    if (j != self_ && !dead.count(j) && peers_[j].ctl.valid())
      (void)::send(peers_[j].ctl.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  // Listen to the peers' reports for a grace period: a peer that reports is alive, so it is not
  // the one that stopped; the suspects it names join ours.
  std::set<int> heard;
  std::map<int, std::string> reports;
  if (reported_by >= 0) heard.insert(reported_by);
  const int64_t grace_ms = std::clamp<int64_t>(timeout_ms_ / 10, 50, 1000);
  const auto grace_end = net::Clock::now() + Ms(grace_ms);
  while (net::Clock::now() < grace_end) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int j = 0; j < size(); ++j)
      if (j != self_ && !dead.count(j) && !heard.count(j) && !closed_.count(j) &&
          peers_[j].ctl.valid()) {
        fds.push_back({peers_[j].ctl.get(), POLLIN, 0});
        who.push_back(j);
      }
    if (fds.empty() || ::poll(fds.data(), fds.size(), net::msUntil(grace_end)) <= 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      StatusOr<Abort> a = readAbort(fds[i].fd, size(), grace_end + Ms(grace_ms), describe(who[i]));
      if (!a.ok()) {
        dead.insert(who[i]);
        continue;
      }
      heard.insert(who[i]);
      reported.insert(a->suspects.begin(), a->suspects.end());
      reports[who[i]] = a->text;
    }
  }
  std::set<int> culprits = suspects;
  culprits.insert(dead.begin(), dead.end());
  culprits.insert(reported.begin(), reported.end());
  culprits.erase(self_);
  for (int h : heard) culprits.erase(h);
  std::string msg = strCat(prefix_, ": ", what, " failed: ");
  if (culprits.empty()) msg += "no member is known to be gone";
  bool first = true;
  for (int c : culprits) {
    msg += strCat(first ? "" : "; ", describe(c),
                  dead.count(c) ? " closed its connections (EOF or reset: the process is gone)"
                  : suspects.count(c) ? strCat(" made no progress for ", timeout_ms_,
                                               " ms (HSDP_REPLICA_TIMEOUT_MS)")
                                      : std::string(" is named by the other members"));
    first = false;
  }
  culprits_.assign(culprits.begin(), culprits.end());
  msg += " [" + detail + "]";
  for (const auto& [j, t] : reports) msg += strCat("; report of ", describe(j), ": ", t);
  broken_ = failedPrecondition(msg);
  return broken_;
}

Status ReplicaRing::pump(int to, const char* send_buf, size_t send_bytes, int from, char* recv_buf,
                         size_t recv_bytes, const std::function<void(size_t, size_t)>& on_chunk,
                         const std::string& what) {
  const uint32_t seq = op_seq_;
  const auto timeout = Ms(timeout_ms_);
  // Send side: the current frame's header and payload [s_off, s_end).
  bool s_active = to >= 0 && send_bytes > 0;
  size_t s_off = 0, s_end = 0, s_hdr_off = 0;
  std::string s_hdr;
  const auto startFrame = [&] {
    s_end = std::min(s_off + chunk_bytes_, send_bytes);
    s_hdr.clear();
    wire::put32(s_hdr, wire::kDataMagic);
    wire::put32(s_hdr, seq);
    wire::put64(s_hdr, s_end - s_off);
    s_hdr_off = 0;
  };
  if (s_active) startFrame();
  // Receive side: the header being read, then the payload [r_off, r_end) of frame r_start.
  bool r_active = from >= 0 && recv_bytes > 0;
  size_t r_off = 0, r_start = 0, r_end = 0, r_hdr_got = 0;
  bool r_payload = false;
  char r_hdr[wire::kDataHeaderBytes];
  auto s_last = net::Clock::now(), r_last = s_last;
  const auto legs = [&](Ms older_than) {  // the active legs without progress for that long
    std::set<int> out;
    const auto now = net::Clock::now();
    if (s_active && now - s_last >= older_than) out.insert(to);
    if (r_active && now - r_last >= older_than) out.insert(from);
    return out;
  };
  // The poll set is rebuilt each pass, in vectors allocated once per call.
  std::vector<pollfd> fds;
  std::vector<int> ctl_of;
  fds.reserve(size() + 1);
  ctl_of.reserve(size());
  while (s_active || r_active) {
    fds.clear();
    ctl_of.clear();
    for (int j = 0; j < size(); ++j)
      if (j != self_) {
        fds.push_back({closed_.count(j) ? -1 : peers_[j].ctl.get(), POLLIN, 0});
        ctl_of.push_back(j);
      }
    const size_t si = fds.size();
    fds.push_back({s_active ? peers_[to].data.get() : -1, POLLOUT, 0});
    fds.push_back({r_active ? peers_[from].data.get() : -1, POLLIN, 0});
    auto deadline = net::Clock::time_point::max();
    if (s_active) deadline = std::min(deadline, s_last + timeout);
    if (r_active) deadline = std::min(deadline, r_last + timeout);
    const int rc = ::poll(fds.data(), fds.size(), net::msUntil(deadline));
    if (rc < 0 && errno != EINTR) return internalError(prefix_, ": poll: ", std::strerror(errno));
    if (rc <= 0) {
      if (net::Clock::now() < deadline) continue;
      const std::set<int> stalled = legs(timeout);
      std::string d = "waiting on";
      for (int s : stalled) d += " " + describe(s);
      return fail(what, stalled, {}, d, -1, {});
    }
    // Reports first: a peer that aborts sends its report before it closes its connections.
    for (size_t i = 0; i < si; ++i) {
      if (!fds[i].revents) continue;
      const int j = ctl_of[i];
      StatusOr<Abort> a = readAbort(fds[i].fd, size(), net::Clock::now() + timeout, describe(j));
      if (!a.ok()) {
        // Closed without a report: the peer finished and destroyed its ring, or died. Only a
        // leg that then lacks its bytes is an error (data already sent is read before the EOF).
        closed_.insert(j);
        continue;
      }
      return fail(what, legs(timeout / 2), {}, strCat(describe(j), " reported: ", a->text), j,
                  a->suspects);
    }
    if (s_active && fds[si].revents) {
      iovec iov[2] = {{s_hdr.data() + s_hdr_off, s_hdr.size() - s_hdr_off},
                      {const_cast<char*>(send_buf) + s_off, s_end - s_off}};
      msghdr m{};
      m.msg_iov = s_hdr_off < s_hdr.size() ? iov : iov + 1;
      m.msg_iovlen = s_hdr_off < s_hdr.size() ? 2 : 1;
      const ssize_t w = ::sendmsg(fds[si].fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && !net::wouldBlock(errno))
        return fail(what, {}, {to}, strCat("send to ", describe(to), ": ", std::strerror(errno)),
                    -1, {});
      if (w > 0) {
        size_t n = static_cast<size_t>(w);
        const size_t h = std::min(n, s_hdr.size() - s_hdr_off);
        s_hdr_off += h;
        s_off += n - h;
        s_last = net::Clock::now();
        if (s_off == s_end && s_hdr_off == s_hdr.size()) {
          if (s_off == send_bytes)
            s_active = false;
          else
            startFrame();
        }
      }
    }
    while (r_active && fds[si + 1].revents) {
      char* dst = r_payload ? recv_buf + r_off : r_hdr + r_hdr_got;
      const size_t want = r_payload ? r_end - r_off : sizeof(r_hdr) - r_hdr_got;
      const ssize_t n = ::recv(fds[si + 1].fd, dst, want, MSG_DONTWAIT);
      if (n == 0)
        return fail(what, {}, {from}, strCat(describe(from), " closed the connection (EOF)"), -1,
                    {});
      if (n < 0) {
        if (net::wouldBlock(errno)) break;
        return fail(what, {}, {from},
                    strCat("receive from ", describe(from), ": ", std::strerror(errno)), -1, {});
      }
      r_last = net::Clock::now();
      if (!r_payload) {
        r_hdr_got += static_cast<size_t>(n);
        if (r_hdr_got < sizeof(r_hdr)) continue;
        const size_t expect = std::min(chunk_bytes_, recv_bytes - r_off);
        if (wire::get32(r_hdr) != wire::kDataMagic || wire::get32(r_hdr + 4) != seq ||
            wire::get64(r_hdr + 8) != expect)
          return fail(what, {from}, {},
                      strCat(describe(from), " sent a frame of operation #", wire::get32(r_hdr + 4),
                             " with ", wire::get64(r_hdr + 8), " bytes where operation #", seq,
                             " expects ", expect, ": the members are out of step"),
                      -1, {});
        r_payload = true;
        r_start = r_off;
        r_end = r_off + expect;
        continue;
      }
      r_off += static_cast<size_t>(n);
      if (r_off < r_end) continue;
      if (on_chunk) on_chunk(r_start, r_end - r_start);
      r_payload = false;
      r_hdr_got = 0;
      if (r_off == recv_bytes) r_active = false;
    }
  }
  return okStatus();
}

}  // namespace hsdp::elastic
