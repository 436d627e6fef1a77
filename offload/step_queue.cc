#include "offload/step_queue.h"

#include <chrono>

namespace hsdp {

StepQueue::StepQueue() : worker_([this] { run(); }) {}

StepQueue::~StepQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

int64_t StepQueue::submit(Job job) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.emplace_back(++submitted_, std::move(job));
  cv_.notify_all();
  return submitted_;
}

bool StepQueue::done(int64_t ticket) const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= ticket;
}

Status StepQueue::waitFor(int64_t ticket) {
  auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= ticket; });
  blocked_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return first_error_;
}

Status StepQueue::waitAll() {
  int64_t last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = submitted_;
  }
  return waitFor(last);
}

void StepQueue::takeSeconds(double* busy, double* blocked) {
  std::lock_guard<std::mutex> lock(mu_);
  *busy = busy_;
  *blocked = blocked_;
  busy_ = blocked_ = 0;
}

void StepQueue::run() {
  for (;;) {
    std::pair<int64_t, Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    auto t0 = std::chrono::steady_clock::now();
    Status s = job.second();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ += dt;
      if (!s.ok() && first_error_.ok()) first_error_ = s;
      completed_ = job.first;
    }
    cv_.notify_all();
  }
}

}  // namespace hsdp
