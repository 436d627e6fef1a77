// StepQueue: one worker thread that runs optimizer steps of offloaded shards in submission
// order, so they overlap with the backward pass still running on the caller's thread. It knows
// jobs and tickets, not layers: the engine decides what a job does (copy a gradient shard to
// host memory, step it with the CPU Adam, copy the parameters back).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "hsdp/status.h"

namespace hsdp {

class StepQueue {
 public:
  using Job = std::function<Status()>;

  StepQueue();
  ~StepQueue();  // finishes queued jobs, then joins the worker
  StepQueue(const StepQueue&) = delete;
  StepQueue& operator=(const StepQueue&) = delete;

  // Queues `job`; returns its ticket (increasing from 1).
  int64_t submit(Job job);
  // Blocks until the job with `ticket` (and every earlier one) has run; returns the first error
  // of any job so far.
  [[nodiscard]] Status waitFor(int64_t ticket);
  [[nodiscard]] Status waitAll();
  bool done(int64_t ticket) const;

  // Seconds the worker spent running jobs, and the caller spent blocked in waitFor/waitAll,
  // since the last call.
  void takeSeconds(double* busy, double* blocked);

 private:
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, Job>> jobs_;
  int64_t submitted_ = 0;
  int64_t completed_ = 0;
  Status first_error_;
  bool stop_ = false;
  double busy_ = 0, blocked_ = 0;
  std::thread worker_;  // last: starts after every member above exists
};

}  // namespace hsdp
