// Setup (the handshake) and the operations of the replica ring; the frame pump and the failure
// attribution are in replica_pump.cc. Wire formats: docs/elastic.md, "The replica transport".
#include "elastic/replica_ring.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "elastic/replica_wire.h"
#include "hsdp/env.h"

namespace hsdp::elastic {
namespace {

const env::IntParam kTimeoutMs{
    "HSDP_REPLICA_TIMEOUT_MS", 10000, 10, 3600000,
    "Deadline of every blocking step of the elastic replica transport (connect, handshake, a "
    "frame without progress), milliseconds: a peer that stops is named after it."};

constexpr size_t kMaxJob = 128;

}  // namespace

StatusOr<int64_t> replicaTimeoutMs() { return kTimeoutMs.value(); }

namespace {

std::string encodeHello(uint16_t kind, uint32_t channel, uint32_t from, uint32_t to, uint32_t size,
                        const ReplicaRing::Options& o, const std::string& reason) {
  std::string b;
  wire::put32(b, wire::kHelloMagic);
  wire::put16(b, wire::kVersion);
  wire::put16(b, kind);
  wire::put32(b, channel);
  wire::put32(b, from);
  wire::put32(b, to);
  wire::put32(b, size);
  wire::put64(b, static_cast<uint64_t>(o.step));
  wire::put64(b, static_cast<uint64_t>(o.attempt));
  wire::put32(b, static_cast<uint32_t>(o.job.size()));
  std::string job = o.job;
  job.resize(kMaxJob, '\0');
  b += job;
  wire::put32(b, static_cast<uint32_t>(reason.size()));
  return b + reason;
}

struct Hello {
  uint32_t magic = 0, channel = 0, from = 0, to = 0, size = 0, reason_len = 0;
  uint16_t version = 0, kind = 0;
  int64_t step = 0, attempt = 0;
  std::string job;
  std::string str() const {
    return strCat("member ", from, " of ", size, ", job '", job, "' step ", step, " attempt ",
                  attempt);
  }
};

Hello decodeHello(const char* p) {
  Hello h;
  h.magic = wire::get32(p);
  h.version = wire::get16(p + 4);
  h.kind = wire::get16(p + 6);
  h.channel = wire::get32(p + 8);
  h.from = wire::get32(p + 12);
  h.to = wire::get32(p + 16);
  h.size = wire::get32(p + 20);
  h.step = static_cast<int64_t>(wire::get64(p + 24));
  h.attempt = static_cast<int64_t>(wire::get64(p + 32));
  const uint32_t job_len = std::min<uint32_t>(wire::get32(p + 40), kMaxJob);
  h.job.assign(p + 44, job_len);
  h.reason_len = wire::get32(p + 44 + kMaxJob);
  return h;
}

// Where `h`'s ring stands against ours: < 0 earlier (step, attempt), 0 the same, > 0 later.
// Another job compares as the same (then refused by name).
int ringOrder(const Hello& h, const ReplicaRing::Options& o) {
  if (h.job != o.job || (h.step == o.step && h.attempt == o.attempt)) return 0;
  return (h.step < o.step || (h.step == o.step && h.attempt < o.attempt)) ? -1 : 1;
}

Status superseded(const std::string& prefix, const std::string& who, const Hello& h) {
  return failedPrecondition(prefix, ": superseded: ", who, " is in step ", h.step, " attempt ",
                            h.attempt, " already (this attempt is over)");
}

// Why the acceptor refuses `h`, or "" when it is a member of this ring.
std::string refusal(const Hello& h, int self, int size, const ReplicaRing::Options& o) {
  if (h.magic != wire::kHelloMagic || h.version != wire::kVersion)
    return strCat("not an hsdp replica hello of version ", wire::kVersion);
  if (h.job != o.job || h.step != o.step || h.attempt != o.attempt)
    return strCat("connection from ", h.str(), " refused: member ", self, " is in job '", o.job,
                  "' step ", o.step, " attempt ", o.attempt);
  if (static_cast<int>(h.size) != size || static_cast<int>(h.to) != self ||
      static_cast<int>(h.from) <= self || static_cast<int>(h.from) >= size || h.channel > 1)
    return strCat("connection from ", h.str(), " to member ", h.to, " channel ", h.channel,
                  " refused: member ", self, " of ", size, " accepts members ", self + 1, "..",
                  size - 1);
  return "";
}

}  // namespace

std::string ReplicaRing::describe(int member) const {
  return strCat("member ", member, " (", addresses_[member], ")");
}

StatusOr<std::unique_ptr<ReplicaRing>> ReplicaRing::create(int self,
                                                           std::vector<std::string> addresses,
                                                           ReplicaListener& listener,
                                                           Options options,
                                                           std::vector<int>* culprits) {
  const int size = static_cast<int>(addresses.size());
  if (size < 1 || size > 4096) return invalidArgument("replica ring of ", size, " members");
  if (self < 0 || self >= size)
    return invalidArgument("replica ring member ", self, " not in 0..", size - 1);
  if (options.job.size() > kMaxJob)
    return invalidArgument("replica ring job name of ", options.job.size(), " bytes (max 128)");
  std::unique_ptr<ReplicaRing> r(new ReplicaRing());
  r->timeout_ms_ = options.timeout_ms;
  if (r->timeout_ms_ <= 0) {
    HSDP_ASSIGN_OR_RETURN(r->timeout_ms_, kTimeoutMs.value());
  }
  r->chunk_bytes_ = std::max<size_t>(4, options.chunk_bytes / 4 * 4);
  r->self_ = self;
  r->addresses_ = std::move(addresses);
  r->options_ = std::move(options);
  r->peers_.resize(size);
  r->streams_sent_.assign(size, 0);
  r->streams_received_.assign(size, 0);
  r->prefix_ = strCat("replica ring (job '", r->options_.job, "' step ", r->options_.step,
                      " attempt ", r->options_.attempt, ", member ", self, " of ", size, ")");
  const auto deadline = net::Clock::now() + std::chrono::milliseconds(r->timeout_ms_);
  const Options& o = r->options_;
  auto failWith = [&](Status st, std::vector<int> who) -> Status {
    if (culprits != nullptr) *culprits = std::move(who);
    return st;
  };
  // Connects both channels to lower member j, one after the other, each with its answer read
  // before the next: a member still in an earlier ring refuses, and the channel is dialled
  // again (no connection is left behind unanswered); one in a later ring ends ours. Waiting for
  // a lower member's answer cannot deadlock: member 0 dials nobody, and member j dials only
  // lower members, which answer once their own dialling is done.
  auto dial = [&](int j) -> Status {
    for (uint32_t ch = 0; ch < 2; ++ch) {
      const std::string who = strCat(r->prefix_, ": the answer of ", r->describe(j));
      while (true) {
        StatusOr<net::Fd> fd = net::connectTo(r->addresses_[j], deadline, !o.refused_is_dead);
        if (!fd.ok())
          return failWith(
              fd.status().withContext(strCat(r->prefix_, ": connecting to ", r->describe(j))), {j});
        const std::string hello = encodeHello(wire::kHello, ch, self, j, size, o, "");
        Status st = net::writeAll(fd->get(), hello.data(), hello.size(), deadline,
                                  strCat(r->prefix_, ": hello to ", r->describe(j)));
        if (!st.ok()) return failWith(st, {j});
        char buf[wire::kHelloBytes];
        if (st = net::readAll(fd->get(), buf, sizeof(buf), deadline, who); !st.ok())
          return failWith(st, {j});
        const Hello h = decodeHello(buf);
        std::string reason(std::min<uint32_t>(h.reason_len, 4096), '\0');
        if (st = net::readAll(fd->get(), reason.data(), reason.size(), deadline, who); !st.ok())
          return failWith(st, {j});
        const bool refused = h.magic != wire::kHelloMagic || h.kind == wire::kRefuse;
        const int order = h.magic == wire::kHelloMagic ? ringOrder(h, o) : 0;
        if (refused && order > 0) return failWith(superseded(r->prefix_, r->describe(j), h), {});
        if (refused && order < 0) {  // it has not reached our ring yet
          if (net::Clock::now() >= deadline)
            return failWith(failedPrecondition(r->prefix_, ": ", r->describe(j),
                                               " did not reach this ring within ", r->timeout_ms_,
                                               " ms (HSDP_REPLICA_TIMEOUT_MS)"),
                            {j});
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          continue;
        }
        if (refused)
          return failWith(
              failedPrecondition(r->prefix_, ": ", r->describe(j), " refused us: ", reason), {});
        if (static_cast<int>(h.from) != j || h.step != o.step || h.attempt != o.attempt ||
            h.job != o.job)
          return failWith(
              failedPrecondition(r->prefix_, ": ", r->describe(j), " answered as ", h.str()), {});
        (ch == 0 ? r->peers_[j].data : r->peers_[j].ctl) = std::move(*fd);
        break;
      }
    }
    return okStatus();
  };
  // 1. Dial every lower member.
  for (int j = 0; j < self; ++j) HSDP_RETURN_IF_ERROR(dial(j));
  // 2. Accept every higher member's two connections; refuse others by name and go on.
  std::vector<std::string> refused;
  int missing = 2 * (size - 1 - self);
  while (missing > 0) {
    StatusOr<net::Fd> fd =
        net::acceptBefore(listener.fd(), deadline, strCat("listener ", listener.address()));
    if (!fd.ok()) {
      std::string who;
      std::vector<int> silent;
      for (int j = self + 1; j < size; ++j)
        if (!r->peers_[j].data.valid() || !r->peers_[j].ctl.valid()) {
          who += (who.empty() ? "" : ", ") + r->describe(j);
          silent.push_back(j);
        }
      std::string why;
      for (const std::string& s : refused) why += "; " + s;
      return failWith(failedPrecondition(r->prefix_, ": ", who, " did not connect within ",
                                         r->timeout_ms_, " ms (HSDP_REPLICA_TIMEOUT_MS)", why),
                      silent);
    }
    char buf[wire::kHelloBytes];
    Status st = net::readAll(fd->get(), buf, sizeof(buf), deadline, "an incoming connection");
    if (!st.ok()) {
      refused.push_back(st.message());
      continue;
    }
    const Hello h = decodeHello(buf);
    const int order = ringOrder(h, o);
    std::string why = order != 0
                          ? strCat("connection from ", h.str(), " refused: member ", self,
                                   " is in job '", o.job, "' step ", o.step, " attempt ", o.attempt)
                          : refusal(h, self, size, o);
    net::Fd* slot = nullptr;
    if (why.empty()) {
      slot = h.channel == 0 ? &r->peers_[h.from].data : &r->peers_[h.from].ctl;
      if (slot->valid()) why = strCat("a second connection from ", h.str(), " refused");
    }
    const std::string reply = encodeHello(why.empty() ? wire::kAccept : wire::kRefuse, h.channel,
                                          self, h.from, size, o, why);
    (void)net::writeAll(fd->get(), reply.data(), reply.size(), deadline, "refused peer");
    if (order > 0) return failWith(superseded(r->prefix_, h.str(), h), {});
    if (!why.empty()) {
      refused.push_back(why);
      continue;
    }
    *slot = std::move(*fd);
    --missing;
  }
  return r;
}

Status ReplicaRing::checkUsable(const char* op) const {
  if (!broken_.ok())
    return failedPrecondition(prefix_, ": ", op, " on a ring broken by an earlier error (",
                              broken_.message(), "): build a new ring");
  return okStatus();
}

Status ReplicaRing::allReduce(float* data, size_t count, Op op) {
  HSDP_RETURN_IF_ERROR(checkUsable("all-reduce"));
  const uint32_t seq = ++op_seq_;
  const int n = size();
  const auto begin = [&](int k) {  // segment k of n: [begin(k), begin(k+1)), balanced
    return static_cast<size_t>(k) * (count / n) + std::min<size_t>(k, count % n);
  };
  const auto seg = [&](int k) { return ((k % n) + n) % n; };
  const char* opname = op == Op::kSum ? "sum" : "average";
  if (n > 1) {
    const int next = (self_ + 1) % n, prev = (self_ + n - 1) % n;
    // Reduce-scatter: in step s, send segment self-s to next, receive segment self-s-1 from prev
    // and add it into ours. Segment k is summed in ring order x_k + x_{k+1} + ... + x_{k-1},
    // finished on member k-1, which alone computes it: the all-gather then copies it.
    // The received segment lands in scratch_, kept by the ring and grown only for a larger
    // segment: no fresh pages to fault in at each step's reduction.
    const size_t max_seg = begin(1) - begin(0);
    if (scratch_.size() < max_seg) scratch_.resize(max_seg);
    std::vector<float>& scratch = scratch_;
    for (int s = 0; s < n - 1; ++s) {
      const int ks = seg(self_ - s), kr = seg(self_ - s - 1);
      float* dst = data + begin(kr);
      const auto add = [&](size_t off, size_t len) {
        const float* a = scratch.data() + off / 4;
        float* d = dst + off / 4;
        for (size_t e = 0; e < len / 4; ++e) d[e] = a[e] + d[e];
      };
      const std::string what = strCat("all-reduce #", seq, " (", opname, " of ", count,
                                      " floats), reduce-scatter step ", s + 1, " of ", n - 1);
      HSDP_RETURN_IF_ERROR(pump(next, reinterpret_cast<const char*>(data + begin(ks)),
                                4 * (begin(ks + 1 == n ? n : ks + 1) - begin(ks)), prev,
                                reinterpret_cast<char*>(scratch.data()),
                                4 * (begin(kr + 1) - begin(kr)), add, what));
    }
    if (op == Op::kAvg) {
      const int own = seg(self_ + 1);
      for (size_t e = begin(own); e < begin(own + 1); ++e)
        data[e] = data[e] / static_cast<float>(n);
    }
    // All-gather: in step s, send segment self+1-s, receive segment self-s.
    for (int s = 0; s < n - 1; ++s) {
      const int ks = seg(self_ + 1 - s), kr = seg(self_ - s);
      const std::string what = strCat("all-reduce #", seq, " (", opname, " of ", count,
                                      " floats), all-gather step ", s + 1, " of ", n - 1);
      HSDP_RETURN_IF_ERROR(pump(next, reinterpret_cast<const char*>(data + begin(ks)),
                                4 * (begin(ks + 1) - begin(ks)), prev,
                                reinterpret_cast<char*>(data + begin(kr)),
                                4 * (begin(kr + 1) - begin(kr)), nullptr, what));
    }
  }
  return okStatus();
}

StatusOr<ReplicaRing::Transfer> ReplicaRing::send(int to, const void* data, size_t bytes) {
  HSDP_RETURN_IF_ERROR(checkUsable("send"));
  if (to < 0 || to >= size() || to == self_)
    return invalidArgument(prefix_, ": send to member ", to);
  // A stream between two members only: its tag counts that pair's streams (kStreamTag set), so
  // the ring's all-reduce numbering stays the same on every member, streams or not.
  const uint32_t n = ++streams_sent_[to];
  const uint32_t collective_seq = std::exchange(op_seq_, kStreamTag | n);
  const auto t0 = net::Clock::now();
  Status st = pump(to, static_cast<const char*>(data), bytes, -1, nullptr, 0, nullptr,
                   strCat("send #", n, " of ", bytes, " bytes to ", describe(to)));
  op_seq_ = collective_seq;
  HSDP_RETURN_IF_ERROR(st);
  return Transfer{bytes, std::chrono::duration<double>(net::Clock::now() - t0).count()};
}

StatusOr<ReplicaRing::Transfer> ReplicaRing::recv(int from, void* data, size_t bytes) {
  HSDP_RETURN_IF_ERROR(checkUsable("recv"));
  if (from < 0 || from >= size() || from == self_)
    return invalidArgument(prefix_, ": recv from member ", from);
  const uint32_t n = ++streams_received_[from];
  const uint32_t collective_seq = std::exchange(op_seq_, kStreamTag | n);
  const auto t0 = net::Clock::now();
  Status st = pump(-1, nullptr, 0, from, static_cast<char*>(data), bytes, nullptr,
                   strCat("recv #", n, " of ", bytes, " bytes from ", describe(from)));
  op_seq_ = collective_seq;
  HSDP_RETURN_IF_ERROR(st);
  return Transfer{bytes, std::chrono::duration<double>(net::Clock::now() - t0).count()};
}

}  // namespace hsdp::elastic
