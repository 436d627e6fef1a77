// Internal to the engine's checkpoint save: the writer thread's job and state (save.cc prepares
// them on the training thread; writer.cc is the thread: the data file, the part files, rank 0's
// commit and pruning).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/host_buffer.h"
#include "core/memory_space.h"
#include "hsdp/checkpoint.h"
#include "storage/io.h"

namespace hsdp::engine {

using Clock = std::chrono::steady_clock;

// The saver's lifecycle (its one table is in save.cc; every change goes through transition()):
//   Idle --saveAsync--> Copying   (the copier thread reads host chunks of the training state)
//                   --> Writing   (nothing to copy on the host: device chunks, copy stream)
//   Copying --the copier is done with the training state--> Writing
//   Writing --waitForSave (the writer joined, the outcome agreed)--> Idle
enum class SaveState : uint8_t { kIdle, kCopying, kWriting };
const char* stateName(SaveState s);
// The one place the saver changes state; a move its table does not list is a FailedPrecondition
// naming the saver and both states ("; <hint>" after it when given).
[[nodiscard]] Status transition(SaveState& state, SaveState to, std::string_view verb,
                                std::string_view hint = {});

// What a writer thread needs, prepared on the training thread before it starts.
struct SaveJob {
  std::string root, name, tmp;  // tmp: root + "/" + tmp_name
  std::string tmp_name;         // files::tempName(name): this job's temporary directory
  int rank = 0, world = 1;
  int64_t step = 0;
  ckpt::Manifest manifest;            // rank 0: all but the files' sizes and checksums
  std::vector<ckpt::FilePlan> plans;  // rank 0: every rank's plan, for the chunk lists
  std::vector<std::pair<std::string, std::string>> user;  // rank 0
  int keep_last = 0;
  double timeout_s = 600;
  Clock::time_point t0;
};

struct Saver {
  HostBuffer snapshot;  // this rank's data file image (myPlan()), reused by every save
  // The snapshot registered with the space's host copies (OptimizerStep::hostCopies(), which
  // outlives the saver), which bring device chunks into it (startSnapshot / finishSnapshot).
  std::unique_ptr<HostCopies::OffloadSlot> pinned;
  HostCopies* copies = nullptr;
  ckpt::FilePlan plan;
  bool direct_io = true;  // EngineConfig::checkpoint.direct_io: the data file around the cache
  // Per plan chunk: where the copier copies it from (host memory: the engine's buffers or the
  // offloaded state), or nullptr where startSnapshot brings it (device memory). Set by saveAsync.
  std::vector<const char*> sources;
  // The copier's progress, under `mu`: the snapshot's first `ready` bytes are final (the writer
  // may write them); `state` (the copier moves it from Copying to Writing): past Copying, no
  // chunk is read from the training state any more (it may change).
  std::mutex mu;
  std::condition_variable cv;
  uint64_t ready = 0;
  SaveState state = SaveState::kIdle;
  // The state, read under `mu` (the copier may move it meanwhile).
  SaveState current() {
    std::lock_guard<std::mutex> lock(mu);
    return state;
  }
  [[nodiscard]] Status moveTo(SaveState to, std::string_view verb, std::string_view hint = {}) {
    std::lock_guard<std::mutex> lock(mu);
    return transition(state, to, verb, hint);
  }
  // No lock: the training thread fills `job` before starting the writer and reads `status` /
  // `result` only after joining it; the join orders the two.
  std::thread writer;
  SaveJob job;
  Status status;
  bool status_secondary = false;  // rank 0: the commit failed because a peer's write did
  SaveResult result;
};

// The writer thread's body: writes this rank's data file as the copier hands it over, its part
// file, and on rank 0 the commit (manifest, rename into place, `latest`, pruning).
void runWriter(Saver* s);
// Now, UTC, as the manifest's "created" (ISO 8601).
std::string utcNow();

}  // namespace hsdp::engine
