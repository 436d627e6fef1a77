#include "collectives/progress.h"

#include <sched.h>

#include <algorithm>
#include <vector>

namespace hsdp {
namespace {

// In start order. A work removes itself when destroyed; completed ones are dropped after a pass.
std::vector<ProgressiveWork*>& active() {
  static std::vector<ProgressiveWork*> list;
  return list;
}

bool g_in_progress = false;

}  // namespace

ProgressiveWork::ProgressiveWork() { active().push_back(this); }

ProgressiveWork::~ProgressiveWork() {
  auto& a = active();
  a.erase(std::remove(a.begin(), a.end(), this), a.end());
}

void ProgressiveWork::finish(Status s) {
  status_ = std::move(s);
  done_ = true;
}

bool ProgressiveWork::progressAll() {
  if (g_in_progress) return false;
  g_in_progress = true;
  bool any = false;
  auto& a = active();
  // Index loop over the live list: works started during the pass are appended (and advanced in
  // this pass), works destroyed during it remove themselves.
  for (size_t i = 0; i < a.size(); ++i) {
    ProgressiveWork* w = a[i];
    if (w->done_) continue;
    w->advance();
    any = any || w->done_;
  }
  a.erase(std::remove_if(a.begin(), a.end(), [](ProgressiveWork* w) { return w->done_; }),
          a.end());
  g_in_progress = false;
  return any;
}

StatusOr<bool> ProgressiveWork::isComplete(Work& w) {
  if (auto* p = dynamic_cast<ProgressiveWork*>(&w)) {
    if (p->done_ && !p->status_.ok()) return p->status_;
    return p->done_;
  }
  return w.test();  // another transport's work: it progresses itself
}

Status ProgressiveWork::wait() {
  while (!done_) {
    if (g_in_progress) {
      advance();  // nested inside a pass: only this work can move here
    } else if (!progressAll() && !done_) {
      // Ranks may outnumber cores (virtual nodes): let the peers we wait for run.
      sched_yield();
    }
  }
  return status_;
}

StatusOr<bool> ProgressiveWork::test() {
  if (!done_) progressAll();
  if (done_ && !status_.ok()) return status_;
  return done_;
}

}  // namespace hsdp
