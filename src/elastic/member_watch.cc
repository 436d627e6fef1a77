#include "elastic/member_watch.h"

#include <algorithm>

namespace hsdp::elastic {

StatusOr<std::unique_ptr<MemberWatch>> MemberWatch::create(const std::string& endpoint,
                                                           const std::string& job) {
  if (!Quorum::validName(job)) return invalidArgument("elastic job name '", job, "'");
  std::unique_ptr<MemberWatch> w(new MemberWatch());
  w->prefix_ = "/hsdp/" + job + "/members/";
  HSDP_ASSIGN_OR_RETURN(w->client_, EtcdClient::create(endpoint));
  HSDP_ASSIGN_OR_RETURN(RangeResult r, w->client_->getPrefix(w->prefix_));
  w->revision_ = r.revision + 1;
  return w;
}

StatusOr<std::vector<MemberEnd>> MemberWatch::next(int64_t timeout_ms) {
  StatusOr<WatchResult> w = client_->waitForChange(prefix_, revision_, timeout_ms);
  if (!w.ok()) {
    HSDP_ASSIGN_OR_RETURN(RangeResult r, client_->getPrefix(prefix_));
    revision_ = r.revision + 1;
    return w.status();
  }
  revision_ = std::max(revision_, w->next_revision);
  std::vector<MemberEnd> out;
  for (const WatchEvent& e : w->events) {
    if (e.kv.key.size() <= prefix_.size()) continue;
    MemberEnd end{e.kv.key.substr(prefix_.size()), e.kv.mod_revision, 0};
    // A put: a join or an update of the live key, whose incarnation lives on (a restart that
    // replaces a stale key deletes it first: an event of its own).
    if (e.type == WatchEvent::Type::kPut) end.keep = e.kv.create_revision;
    out.push_back(std::move(end));
  }
  return out;
}

}  // namespace hsdp::elastic
