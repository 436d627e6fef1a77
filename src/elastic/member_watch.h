// The abort watch's eyes (docs/elastic.md, "The coordinator's abort watch"): a watch on a job's
// member keys that reports which incarnations of which groups ended, as etcd sees it: a member
// key deleted (its lease ended, the group left) or put again by a new incarnation (a restarted
// group replaced it). Rank 0 of every elastic group runs one beside its quorum, on a client of
// its own, so that survivors abort an in-flight replica average the moment the coordinator knows
// a member is gone instead of at the transport's deadline. Coordination only: what to abort is
// the engine's (src/engine/elastic_group.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "elastic/etcd_client.h"
#include "elastic/quorum.h"
#include "hsdp/status.h"

namespace hsdp::elastic {

// One change of a member key: every incarnation of `group` created before `revision` ended,
// except `keep` (a delete: 0; a put: the key's own incarnation, which lives on).
struct MemberEnd {
  std::string group;
  int64_t revision = 0;
  int64_t keep = 0;
  bool ends(const Member& m) const {
    return m.group == group && m.incarnation < revision && m.incarnation != keep;
  }
};

class MemberWatch {
 public:
  // Watches the members of `job` from now on (one read for the revision), on its own client.
  static StatusOr<std::unique_ptr<MemberWatch>> create(const std::string& endpoint,
                                                       const std::string& job);
  // Waits up to `timeout_ms` for member keys to change; what ended (empty when nothing did).
  // After a watch error (a compacted revision, etcd unreachable) it reads the members again and
  // watches from there: what ended in between is then seen by the quorum, not here.
  StatusOr<std::vector<MemberEnd>> next(int64_t timeout_ms);

 private:
  MemberWatch() = default;
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;    // "/hsdp/<job>/members/"
  int64_t revision_ = 0;  // the next revision to watch from
};

}  // namespace hsdp::elastic
