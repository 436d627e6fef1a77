#include "core/watchdog/watch_table.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

namespace hsdp::watchdog {
namespace {

constexpr uint64_t kMagic = 0x68736470'77646731ull;  // "hsdpwdg1"

size_t segmentBytes(int members) {
  return sizeof(GroupHeader) + static_cast<size_t>(members) * sizeof(RankSlot);
}

// 'T' (stopped or traced), 'X' (gone or a zombie) or 'R', from /proc/<pid>/stat.
char processState(int pid) {
  if (pid <= 0) return '?';
  if (kill(pid, 0) != 0 && errno == ESRCH) return 'X';
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return 'R';  // no /proc: the heartbeat decides
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* close = std::strrchr(buf, ')');  // the command name may hold spaces
  if (close == nullptr || close[1] == '\0' || close[2] == '\0') return 'R';
  switch (close[2]) {
    case 'T':
    case 't':
      return 'T';
    case 'Z':
    case 'X':
      return 'X';
    default:
      return 'R';
  }
}

template <typename T>
void put(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}
template <typename T>
bool take(const std::string& in, size_t* at, T* v) {
  if (*at + sizeof(T) > in.size()) return false;
  std::memcpy(v, in.data() + *at, sizeof(T));
  *at += sizeof(T);
  return true;
}

// Fixed part of a rank on the wire.
struct WireRank {
  int32_t world_rank, pid, state, reported;
  int64_t heartbeat_age_ms, waiting_ms;
  int32_t comms, pad;
};

}  // namespace

int64_t monotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

bool sameCollective(const Fingerprint& a, const Fingerprint& b) {
  return a.seq == b.seq && a.comm_id == b.comm_id && a.count == b.count && a.root == b.root &&
         a.kind == b.kind && a.dtype == b.dtype && a.redop == b.redop && a.ops == b.ops &&
         std::strncmp(a.unit, b.unit, sizeof a.unit) == 0 &&
         std::strncmp(a.group, b.group, sizeof a.group) == 0;
}

GroupTable* GroupTable::create(const std::string& name, uint64_t nonce, int members,
                               std::string* error) {
  const size_t bytes = segmentBytes(members);
  void* base = MAP_FAILED;
  if (name.empty()) {
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  } else {
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      *error = std::string("shm_open(") + name + "): " + std::strerror(errno);
      return nullptr;
    }
    if (ftruncate(fd, static_cast<off_t>(bytes)) == 0)
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) *error = std::string("ftruncate/mmap: ") + std::strerror(errno);
    close(fd);
    if (base == MAP_FAILED) {
      shm_unlink(name.c_str());
      return nullptr;
    }
  }
  if (base == MAP_FAILED) {
    *error = std::string("mmap: ") + std::strerror(errno);
    return nullptr;
  }
  auto* t = new GroupTable();
  t->base_ = base;
  t->bytes_ = bytes;
  t->members_ = members;
  t->header_ = new (base) GroupHeader();
  t->slots_ = reinterpret_cast<RankSlot*>(static_cast<char*>(base) + sizeof(GroupHeader));
  for (int i = 0; i < members; ++i) new (&t->slots_[i]) RankSlot();
  t->header_->nonce = nonce;
  t->header_->members = members;
  std::atomic_thread_fence(std::memory_order_release);
  t->header_->magic = kMagic;
  return t;
}

GroupTable* GroupTable::attach(const std::string& name, uint64_t nonce, int members,
                               std::string* error) {
  const size_t bytes = segmentBytes(members);
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    *error = std::string("shm_open(") + name + "): " + std::strerror(errno);
    return nullptr;
  }
  struct stat st;
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes)
    base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    *error = "segment " + name + " has the wrong size or cannot be mapped";
    return nullptr;
  }
  auto* h = static_cast<GroupHeader*>(base);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h->magic != kMagic || h->nonce != nonce || h->members != members) {
    munmap(base, bytes);
    *error = "segment " + name + " belongs to another job";
    return nullptr;
  }
  auto* t = new GroupTable();
  t->base_ = base;
  t->bytes_ = bytes;
  t->members_ = members;
  t->header_ = h;
  t->slots_ = reinterpret_cast<RankSlot*>(static_cast<char*>(base) + sizeof(GroupHeader));
  return t;
}

void GroupTable::unlink(const std::string& name) {
  if (!name.empty()) shm_unlink(name.c_str());
}

GroupTable::~GroupTable() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

bool GroupTable::postAbort(int from, const std::string& reason) {
  int32_t none = 0;
  if (!header_->abort_state.compare_exchange_strong(none, 1)) return false;
  header_->abort_from = from;
  std::snprintf(header_->abort_reason, sizeof header_->abort_reason, "%s", reason.c_str());
  header_->abort_state.store(2, std::memory_order_release);
  return true;
}

bool GroupTable::abortNotice(int* from, std::string* reason) const {
  if (header_->abort_state.load(std::memory_order_acquire) != 2) return false;
  *from = header_->abort_from;
  *reason = std::string(header_->abort_reason,
                        strnlen(header_->abort_reason, sizeof header_->abort_reason));
  return true;
}

const Fingerprint* CommView::find(uint64_t seq) const {
  if (seq == 0) return nullptr;
  const Fingerprint& f = ring[seq % kRing];
  return f.seq == seq ? &f : nullptr;
}

const CommView* RankView::comm(uint64_t id) const {
  for (const CommView& c : comms)
    if (c.id == id) return &c;
  return nullptr;
}

std::vector<RankView> readGroup(GroupTable& table, int64_t stale_ms) {
  const int64_t now = monotonicNs();
  std::vector<RankView> out;
  for (int i = 0; i < table.members(); ++i) {
    RankSlot& s = table.slot(i);
    RankView v;
    v.world_rank = s.world_rank;
    v.pid = s.pid;
    const int64_t beat = s.heartbeat_ns.load(std::memory_order_acquire);
    v.heartbeat_age_ms = beat > 0 ? (now - beat) / 1000000 : -1;
    const int64_t since = s.waiting_since_ns.load(std::memory_order_relaxed);
    v.waiting_ms = since > 0 ? (now - since) / 1000000 : -1;
    v.reported = s.reported.load(std::memory_order_acquire) != 0;
    v.state = processState(v.pid);
    if (v.state == 'R' && v.heartbeat_age_ms > stale_ms) v.state = 'T';
    for (const CommSlot& c : s.comms) {
      const uint64_t id = c.id.load(std::memory_order_acquire);
      if (id == 0) continue;
      CommView cv;
      cv.id = id;
      cv.entered = c.entered.load(std::memory_order_acquire);
      for (int k = 0; k < kRing; ++k) {
        uint64_t& seq = const_cast<uint64_t&>(c.ring[k].seq);
        const uint64_t before = std::atomic_ref<uint64_t>(seq).load(std::memory_order_acquire);
        std::memcpy(&cv.ring[k], &c.ring[k], sizeof(Fingerprint));
        std::atomic_thread_fence(std::memory_order_acquire);
        const uint64_t after = std::atomic_ref<uint64_t>(seq).load(std::memory_order_relaxed);
        if (before != after || cv.ring[k].seq != before) cv.ring[k] = Fingerprint();
      }
      v.comms.push_back(cv);
    }
    out.push_back(std::move(v));
  }
  return out;
}

std::string serializeGroup(const std::vector<RankView>& ranks) {
  std::string out;
  put(&out, static_cast<int32_t>(ranks.size()));
  for (const RankView& r : ranks) {
    WireRank w{r.world_rank,
               r.pid,
               r.state,
               r.reported ? 1 : 0,
               r.heartbeat_age_ms,
               r.waiting_ms,
               static_cast<int32_t>(r.comms.size()),
               0};
    put(&out, w);
    for (const CommView& c : r.comms) {
      put(&out, c.id);
      put(&out, c.entered);
      out.append(reinterpret_cast<const char*>(c.ring), sizeof c.ring);
    }
  }
  return out;
}

bool parseGroup(const std::string& bytes, std::vector<RankView>* ranks) {
  size_t at = 0;
  int32_t n = 0;
  if (!take(bytes, &at, &n) || n < 0 || n > (1 << 20)) return false;
  ranks->clear();
  for (int32_t i = 0; i < n; ++i) {
    WireRank w;
    if (!take(bytes, &at, &w) || w.comms < 0 || w.comms > kMaxComms) return false;
    RankView r;
    r.world_rank = w.world_rank;
    r.pid = w.pid;
    r.state = static_cast<char>(w.state);
    r.reported = w.reported != 0;
    r.heartbeat_age_ms = w.heartbeat_age_ms;
    r.waiting_ms = w.waiting_ms;
    for (int32_t k = 0; k < w.comms; ++k) {
      CommView c;
      if (!take(bytes, &at, &c.id) || !take(bytes, &at, &c.entered) || !take(bytes, &at, &c.ring))
        return false;
      r.comms.push_back(c);
    }
    ranks->push_back(std::move(r));
  }
  return at == bytes.size();
}

}  // namespace hsdp::watchdog
