// The replica transport between elastic groups (docs/elastic.md, "The replica transport"): rank
// i of every group in a step's quorum builds one ReplicaRing over TCP from the members' published
// addresses, and runs the replica all-reduce and rank-to-rank streams on it. No MPI and no
// global state: a new quorum destroys the ring and creates another on the same listener.
//
//   auto listener = ReplicaListener::open("10.0.0.5");     // address() goes into the member key
//   auto ring = ReplicaRing::create(i, addresses, *listener, {job, step, attempt});
//   ring->allReduce(data, n, ReplicaRing::Op::kAvg);      // bitwise equal on every member
//
// Every blocking call ends by the deadline (HSDP_REPLICA_TIMEOUT_MS without progress): a peer
// that dies (EOF, reset) or stops is named in the Status (its index and address, and what was in
// flight). After an error the ring is broken (every later call says so): build a new one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "elastic/replica_socket.h"
#include "hsdp/status.h"

namespace hsdp::elastic {

// HSDP_REPLICA_TIMEOUT_MS, checked: the replica level's deadline without progress.
StatusOr<int64_t> replicaTimeoutMs();

class ReplicaRing {
 public:
  struct Options {
    std::string job;               // at most 128 bytes; checked in the handshake
    int64_t step = 0;              // the quorum's step and attempt: a connection from another
    int64_t attempt = 0;           // step or attempt is refused by name
    int64_t timeout_ms = 0;        // <= 0: HSDP_REPLICA_TIMEOUT_MS
    size_t chunk_bytes = 1 << 20;  // one data frame's payload (rounded down to 4 bytes)
    // A refused connection means the member is gone (every member's listener is open before it
    // is in any ring: elastic groups open it when they join), not that it is still starting.
    bool refused_is_dead = false;
  };
  enum class Op { kSum, kAvg };
  struct Transfer {
    size_t bytes = 0;
    double seconds = 0;
  };

  // Connects member `self` to every other member of `addresses` (a full mesh: a data and a
  // control connection per pair; the higher index connects, the lower accepts on `listener`).
  // Fails by the deadline naming the members that did not join and any connection refused; the
  // members found gone or silent go into `culprits` (when given). Rings are ordered by (step,
  // attempt): a member that meets a peer already in a later ring fails at once, "superseded"
  // (its own attempt is over; nobody is blamed), and waits for a peer still in an earlier one.
  static StatusOr<std::unique_ptr<ReplicaRing>> create(int self, std::vector<std::string> addresses,
                                                       ReplicaListener& listener, Options options,
                                                       std::vector<int>* culprits = nullptr);
  ReplicaRing(const ReplicaRing&) = delete;
  ReplicaRing& operator=(const ReplicaRing&) = delete;

  int self() const { return self_; }
  int size() const { return static_cast<int>(addresses_.size()); }
  const std::string& address(int member) const { return addresses_[member]; }
  int64_t timeoutMs() const { return timeout_ms_; }
  std::string describe(int member) const;  // "member 2 (host:port)"

  // In-place sum or average over the members of float32 `data`; any count, every member gets the
  // same bits (the ring reduce-scatter computes each element once, then it is copied).
  Status allReduce(float* data, size_t count, Op op);
  // A stream of `bytes` from this member to `to` (matched by recv on `to`).
  StatusOr<Transfer> send(int to, const void* data, size_t bytes);
  StatusOr<Transfer> recv(int from, void* data, size_t bytes);
  // After a failed call: the members it named as gone or stalled (indexes, ascending).
  const std::vector<int>& culprits() const { return culprits_; }

 private:
  struct Peer {
    net::Fd data;  // the frames of all-reduce and send/recv
    net::Fd ctl;   // abort reports only, so they never interleave with a data frame
  };
  // One duplex transfer: `send_bytes` to `to` and `recv_bytes` from `from` (either may be -1),
  // in frames of chunk_bytes_; on_chunk(offset, length) after each received frame.
  Status pump(int to, const char* send_buf, size_t send_bytes, int from, char* recv_buf,
              size_t recv_bytes, const std::function<void(size_t, size_t)>& on_chunk,
              const std::string& what);
  // Reports the failure to every peer, listens to theirs for a grace period and returns the
  // error naming the members that are dead or stalled (docs/elastic.md: failure attribution).
  Status fail(const std::string& what, std::set<int> suspects, std::set<int> dead,
              std::string detail, int reported_by, std::set<int> reported);
  Status checkUsable(const char* op) const;

  ReplicaRing() = default;
  int self_ = 0;
  std::vector<std::string> addresses_;
  Options options_;
  int64_t timeout_ms_ = 10000;
  size_t chunk_bytes_ = 1 << 20;
  std::vector<Peer> peers_;  // by member index; peers_[self_] holds nothing
  uint32_t op_seq_ = 0;      // all-reduces started on this ring: the tag of their frames
  // Streams (send/recv) per peer; their frames carry kStreamTag | count.
  static constexpr uint32_t kStreamTag = 0x80000000u;
  std::vector<uint32_t> streams_sent_, streams_received_;
  std::set<int> closed_;        // peers whose control connection ended without a report
  std::vector<float> scratch_;  // all-reduce: the segment received from prev, reused
  Status broken_;
  std::vector<int> culprits_;
  std::string prefix_;  // "replica ring (job j, step s attempt a, member i of R)"
};

}  // namespace hsdp::elastic
