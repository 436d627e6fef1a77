#include "offload/worker_pool.h"

#include <system_error>

namespace hsdp::offload_detail {

StatusOr<std::unique_ptr<WorkerPool>> WorkerPool::create(int threads) {
  if (threads < 1) return invalidArgument("worker pool of ", threads, " threads (must be >= 1)");
  std::unique_ptr<WorkerPool> pool(new WorkerPool());
  try {
    pool->workers_.reserve(threads - 1);
    for (int k = 1; k < threads; ++k)
      pool->workers_.emplace_back([p = pool.get(), k] { p->workerLoop(k); });
  } catch (const std::system_error& e) {
    // The destructor stops and joins the workers already started.
    return Status(StatusCode::kResourceExhausted,
                  strCat("starting ", threads - 1, " worker threads: ", e.what(), " (started ",
                         pool->workers_.size(), ")"));
  }
  return pool;
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void WorkerPool::workerLoop(int index) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= parts_) continue;  // this call needs fewer threads
    const std::function<void(int)>* fn = fn_;
    lock.unlock();
    (*fn)(index);
    lock.lock();
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void WorkerPool::run(int parts, const std::function<void(int)>& fn) {
  if (parts > threads()) parts = threads();
  if (parts <= 1) {
    fn(0);
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    parts_ = parts;
    pending_ = parts - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  fn(0);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
}

}  // namespace hsdp::offload_detail
