// The watchdog's published table (internal to watchdog/): what every rank entered last, per
// communicator, and whether it is alive. One segment per shared-memory group (the ranks of one
// host): the group's first rank creates it, every member maps it, and it is unlinked as soon as
// all have (so no segment is ever left behind, even after SIGKILL). A stopped rank's entries stay
// readable by its node's peers; other nodes read them through the out-of-band channel
// (watch_oob.h), which serves the same bytes (serializeGroup).
//
// Writers are lock-free and cheap: entering a collective writes one fixed record into a ring and
// stores the sequence number (release). Readers run only after a failure; a record is taken when
// its sequence number reads the same before and after the copy (a seqlock without retries:
// a record being rewritten just then is skipped).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace hsdp::watchdog {

// One collective as a rank entered it. Plain bytes: it lives in shared memory and travels over
// the out-of-band channel and the HSDP_CHECK_COLLECTIVES all-gather as is.
struct Fingerprint {
  uint64_t seq = 0;      // 1-based, per communicator; 0: empty
  uint64_t comm_id = 0;  // equal on every member
  uint64_t count = 0;    // elements, as passed to the call
  int32_t root = -1;     // broadcast's root, else -1
  uint8_t kind = 0;      // OpKind
  uint8_t dtype = 0;     // DType
  uint8_t redop = 0;     // RedOp (reductions)
  uint8_t ops = 1;       // operations of a fused group
  char unit[48] = {};    // the Label's unit ("" outside a Label)
  char group[16] = {};   // the Label's group ("shard group")
};
static_assert(sizeof(Fingerprint) == 96);

// Compares what members must agree on (not the padding of the strings).
bool sameCollective(const Fingerprint& a, const Fingerprint& b);

constexpr int kMaxComms = 64;  // traced communicators per rank at once (more go untraced)
constexpr int kRing = 4;       // fingerprints kept per communicator

struct CommSlot {
  std::atomic<uint64_t> id{0};       // 0: free
  std::atomic<uint64_t> entered{0};  // seq of the last collective entered
  Fingerprint ring[kRing];           // ring[seq % kRing]
};

struct RankSlot {
  int32_t world_rank = -1;
  int32_t pid = 0;
  std::atomic<int64_t> heartbeat_ns{0};      // CLOCK_MONOTONIC of the watchdog thread's last tick
  std::atomic<int64_t> waiting_since_ns{0};  // the oldest waiting thread's clock; 0: none waits
  std::atomic<int32_t> reported{0};          // printed its final line
  CommSlot comms[kMaxComms];
};

struct GroupHeader {
  uint64_t magic = 0;
  uint64_t nonce = 0;  // the job's, from world rank 0
  int32_t members = 0;
  // A failure notice for the group: 0 none, 1 being written, 2 set (abort_from, abort_reason).
  std::atomic<int32_t> abort_state{0};
  int32_t abort_from = -1;
  char abort_reason[240] = {};
};

// A mapped group segment (or a private one for a rank alone in its group).
class GroupTable {
 public:
  // Creates (O_EXCL) and initialises the named segment for `members` ranks; `name` empty: a
  // private anonymous mapping.
  static GroupTable* create(const std::string& name, uint64_t nonce, int members,
                            std::string* error);
  // Maps a segment another rank created; null (with *error) when it is not there or not ours.
  static GroupTable* attach(const std::string& name, uint64_t nonce, int members,
                            std::string* error);
  static void unlink(const std::string& name);
  ~GroupTable();

  GroupHeader& header() { return *header_; }
  RankSlot& slot(int local) { return slots_[local]; }
  int members() const { return members_; }

  // Posts a failure notice once; false when one is already set.
  bool postAbort(int from, const std::string& reason);
  // The notice, when set.
  bool abortNotice(int* from, std::string* reason) const;

 private:
  GroupTable() = default;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  GroupHeader* header_ = nullptr;
  RankSlot* slots_ = nullptr;
  int members_ = 0;
};

// What a reader learns about one rank.
struct CommView {
  uint64_t id = 0;
  uint64_t entered = 0;
  Fingerprint ring[kRing];
  // The fingerprint of `seq`, when the ring still holds it.
  const Fingerprint* find(uint64_t seq) const;
};
struct RankView {
  int world_rank = -1;
  int pid = 0;
  char state = '?';  // 'R' alive, 'T' stopped, 'X' gone, 'U' unreachable (no answer)
  int64_t heartbeat_age_ms = -1;
  int64_t waiting_ms = -1;  // -1: not waiting
  bool reported = false;
  std::vector<CommView> comms;
  const CommView* comm(uint64_t id) const;
};

// Reads every member of `table` now. A member is 'T' when /proc says stopped or its heartbeat is
// older than `stale_ms`, 'X' when its process is gone.
std::vector<RankView> readGroup(GroupTable& table, int64_t stale_ms);
// The wire form of readGroup's result, and back; false on a malformed message.
std::string serializeGroup(const std::vector<RankView>& ranks);
bool parseGroup(const std::string& bytes, std::vector<RankView>* ranks);

int64_t monotonicNs();

}  // namespace hsdp::watchdog
