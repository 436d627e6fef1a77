#include "engine/group_alarm.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "hsdp/log.h"

namespace hsdp::engine {
namespace {

constexpr uint32_t kMagic = 0x41445348;  // "HSDA"
constexpr uint32_t kMaxReason = 1024;
// On the wire: magic, sender's rank, reason length (u32 each), tag (u64), then the reason.
struct Header {
  uint32_t magic;
  uint32_t rank;
  uint32_t length;
  uint32_t pad;
  uint64_t tag;
};

}  // namespace

StatusOr<std::unique_ptr<GroupAlarm>> GroupAlarm::create(UnitCollectives& control,
                                                         const std::string& host, Handler handler) {
  std::unique_ptr<GroupAlarm> a(new GroupAlarm());
  a->rank_ = control.controlRank();
  a->handler_ = std::move(handler);
  // Every rank opens its listener; the outcome is agreed before the addresses are exchanged.
  int64_t mine = -1;
  Status local = [&]() -> Status {
    HSDP_ASSIGN_OR_RETURN(sockaddr_in at, net::resolve(host, 0));
    HSDP_ASSIGN_OR_RETURN(net::Listening l, net::listenOn(at, 16));
    a->listener_ = std::move(l.fd);
    // IPv4 (network order) and port in one integer.
    mine = (static_cast<int64_t>(at.sin_addr.s_addr) << 16) | static_cast<int64_t>(l.port);
    int fds[2];
    if (::pipe(fds) != 0) return internalError("the group alarm's pipe: ", std::strerror(errno));
    a->wake_[0] = net::Fd(fds[0]);
    a->wake_[1] = net::Fd(fds[1]);
    return okStatus();
  }();
  HSDP_RETURN_IF_ERROR(control.agree(local.withContext(strCat("the group alarm on ", host))));
  std::vector<int64_t> all(control.controlSize());
  HSDP_RETURN_IF_ERROR(control.controlAllGather(&mine, all.data(), 1, DType::kInt64));
  for (int64_t v : all)
    a->peers_.push_back(net::ipv4(static_cast<uint32_t>(v >> 16), static_cast<uint16_t>(v)));
  a->thread_ = std::thread([p = a.get()] { p->serve(); });
  return a;
}

GroupAlarm::~GroupAlarm() {
  if (wake_[1].valid()) {
    const char c = 0;
    (void)!::write(wake_[1].get(), &c, 1);
  }
  if (thread_.joinable()) thread_.join();
}

int GroupAlarm::raise(uint64_t tag, const std::string& reason, int64_t deadline_ms) {
  Header h{kMagic, static_cast<uint32_t>(rank_),
           static_cast<uint32_t>(std::min<size_t>(reason.size(), kMaxReason)), 0, tag};
  int told = 0;
  for (size_t r = 0; r < peers_.size(); ++r) {
    if (static_cast<int>(r) == rank_) continue;
    const std::string who = strCat("group rank ", r, "'s alarm");
    const net::Deadline deadline = net::after(deadline_ms);
    StatusOr<net::Fd> fd = net::connectTo(peers_[r], who, deadline, /*retry_refused=*/false);
    Status st = fd.ok() ? net::writeAll(fd->get(), &h, sizeof(h), deadline, who) : fd.status();
    if (st.ok()) st = net::writeAll(fd->get(), reason.data(), h.length, deadline, who);
    if (st.ok())
      ++told;
    else
      HSDP_INFO(kShard, "elastic: the alarm did not reach ", who, ": ", st.message());
  }
  return told;
}

void GroupAlarm::serve() {
  while (true) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_[0].get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      HSDP_WARN(kShard, "elastic: the group alarm stops: poll: ", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;  // the destructor
    if ((fds[0].revents & POLLIN) == 0) continue;
    // One message per connection, read within a short bound: a sender that stalls is dropped.
    StatusOr<net::Fd> fd = net::acceptBefore(listener_.get(), net::after(100), "group alarm");
    if (!fd.ok()) continue;
    const net::Deadline deadline = net::after(1000);
    Header h{};
    Status st = net::readAll(fd->get(), &h, sizeof(h), deadline, "a group alarm");
    if (st.ok() && (h.magic != kMagic || h.length > kMaxReason))
      st = invalidArgument("a group alarm with a bad header");
    std::string reason(st.ok() ? h.length : 0, '\0');
    if (st.ok())
      st = net::readAll(fd->get(), reason.data(), reason.size(), deadline, "a group alarm");
    if (!st.ok()) {
      HSDP_INFO(kShard, "elastic: a group alarm dropped: ", st.message());
      continue;
    }
    received_.fetch_add(1, std::memory_order_relaxed);
    handler_(h.tag, strCat("rank ", h.rank, " of this group: ", reason));
  }
}

}  // namespace hsdp::engine
