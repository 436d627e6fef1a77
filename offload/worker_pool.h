// Private to offload/: a fork-join pool of persistent worker threads.
//
// The CPU optimizer step runs every few milliseconds per unit; creating threads per call would
// cost tens of microseconds each and churn stacks, so the threads are created once, sleep on a
// condition variable between calls, and exit when the pool is destroyed (RAII: the destructor
// joins them). The calling thread works too (it runs part 0), so a pool of one thread has no
// worker threads at all and a call costs no wake-up.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hsdp/status.h"

namespace hsdp::offload_detail {

class WorkerPool {
 public:
  // `threads` >= 1 participants: the caller plus threads - 1 workers started now. Fails with
  // ResourceExhausted (naming the count) when the system cannot start them.
  static StatusOr<std::unique_ptr<WorkerPool>> create(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(0) .. fn(parts - 1), part 0 on the calling thread and part k on worker k, and
  // returns when all have finished. parts is clamped to [1, threads()]. Calls from several
  // threads are serialised: one fork-join at a time. fn must not throw.
  void run(int parts, const std::function<void(int)>& fn);

 private:
  WorkerPool() = default;
  void workerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one run() at a time
  std::mutex mu_;      // guards everything below
  std::condition_variable work_cv_, done_cv_;
  uint64_t generation_ = 0;  // bumped once per run(); a worker runs each generation once
  int parts_ = 0;
  int pending_ = 0;  // worker parts of the current generation not yet finished
  const std::function<void(int)>* fn_ = nullptr;
  bool stop_ = false;
};

}  // namespace hsdp::offload_detail
