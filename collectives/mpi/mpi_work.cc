#include "collectives/mpi/mpi_work.h"

#include <algorithm>

#include "collectives/mpi/mpi_check.h"
#include "core/idle_wait.h"
#include "hsdp/log.h"

namespace hsdp::mpi {

// The process-wide poll of every live RequestSet.
struct Poll {
  std::vector<RequestSet*> sets;
  uint64_t generation = 1;
  // Scratch of one MPI_Testsome, kept between calls.
  std::vector<MPI_Request> reqs;
  std::vector<MPI_Request*> where;
  std::vector<int> done;

  // One MPI_Testsome over every live set's requests; completed ones become MPI_REQUEST_NULL in
  // their sets. False if MPI reported an error (each set then tests its own, to find it).
  bool run() {
    reqs.clear();
    where.clear();
    for (RequestSet* s : sets)
      for (MPI_Request& r : s->reqs_)
        if (r != MPI_REQUEST_NULL) {
          reqs.push_back(r);
          where.push_back(&r);
        }
    ++generation;
    if (reqs.empty()) return true;
    done.resize(reqs.size());
    int outcount = 0;
    const int rc = MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &outcount, done.data(),
                                MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return false;
    if (outcount == MPI_UNDEFINED || outcount == 0) return true;
    noteProgress();  // a waiter keeps spinning while requests land (core/idle_wait.h)
    for (int i = 0; i < outcount; ++i) *where[done[i]] = reqs[done[i]];  // MPI_REQUEST_NULL
    return true;
  }
};

namespace {
Poll& poll() {
  static Poll p;
  return p;
}
}  // namespace

RequestSet::RequestSet() {
  auto lock = progressLock();
  poll().sets.push_back(this);
  seen_ = poll().generation;
}

RequestSet::~RequestSet() {
  auto lock = progressLock();
  auto& sets = poll().sets;
  sets.erase(std::remove(sets.begin(), sets.end(), this), sets.end());
}

MPI_Request* RequestSet::add() {
  reqs_.push_back(MPI_REQUEST_NULL);
  return &reqs_.back();
}

StatusOr<bool> RequestSet::test() {
  auto done = [this] {
    return std::all_of(reqs_.begin(), reqs_.end(),
                       [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
  };
  if (done()) return true;
  Poll& p = poll();
  if (seen_ == p.generation && !p.run()) {
    // An error somewhere: this set's own requests, tested alone, say whether it is ours.
    int flag = 0;
    const int rc =
        MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mpiError(rc, "MPI_Testall", __FILE__, __LINE__);
  }
  seen_ = p.generation;
  return done();
}

void RequestSet::cancel() {
  for (MPI_Request& q : reqs_)
    if (q != MPI_REQUEST_NULL) {
      MPI_Cancel(&q);
      MPI_Request_free(&q);
    }
}

void RequestWork::advance() {
  StatusOr<bool> ok = req_.test();
  if (!ok.ok()) return finish(ok.status());
  if (!*ok) return;
  if (on_complete_) on_complete_();
  finish(Status());
}

}  // namespace hsdp::mpi
