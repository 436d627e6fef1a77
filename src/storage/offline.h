// Internal to storage/'s offline checkpoint code (offline.cc, reader.cc, reshard.cc): what
// hsdp-ckpt inspect and the CheckpointReader share, so both print and check a checkpoint the same
// way, and the long loops' progress and stop point.
#pragma once

#include <string>
#include <vector>

#include "hsdp/status.h"
#include "storage/format.h"

namespace hsdp::ckpt {

// Data file f's whole-file xxHash64; on a mismatch the first failing chunk (or user entry) is
// named with its byte range.
[[nodiscard]] Status verifyDataFile(const std::string& dir, const Manifest& m, int f);

// hsdp-ckpt inspect --json: the manifest's summary; with `checks` (one per data file, in order)
// each file's "checksum_ok" and the overall "checksums_ok", without them null.
std::string checkpointSummaryJson(const std::string& dir, const Manifest& m,
                                  const std::vector<Status>* checks);

// A long offline loop's progress (hsdp/checkpoint_offline.h, setOfflineProgress) and its stop
// point: tick() reports `done` of the total and returns kAborted naming the phase and what is left
// when a stop was requested (hsdp/stop.h); the caller returns it and its guards remove what it
// made.
class OfflineTicker {
 public:
  OfflineTicker(const char* phase, const char* unit, uint64_t total, std::string left)
      : phase_(phase), unit_(unit), total_(total), left_(std::move(left)) {}
  [[nodiscard]] Status tick(uint64_t done);
  [[nodiscard]] Status add(uint64_t n) { return tick(done_ + n); }
  uint64_t done() const { return done_; }

 private:
  const char* phase_;
  const char* unit_;
  uint64_t total_;
  uint64_t done_ = 0;
  std::string left_;  // what a stop leaves unfinished ("OUT is not written")
};

}  // namespace hsdp::ckpt
