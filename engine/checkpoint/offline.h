// Internal to the engine's offline checkpoint code (offline.cc, reader.cc): what hsdp-ckpt
// inspect and the CheckpointReader share, so both print and check a checkpoint the same way.
#pragma once

#include <string>
#include <vector>

#include "hsdp/status.h"
#include "storage/format.h"

namespace hsdp::engine {

// Data file f's whole-file xxHash64; on a mismatch the first failing chunk (or user entry) is
// named with its byte range.
[[nodiscard]] Status verifyDataFile(const std::string& dir, const ckpt::Manifest& m, int f);

// hsdp-ckpt inspect --json: the manifest's summary; with `checks` (one per data file, in order)
// each file's "checksum_ok" and the overall "checksums_ok", without them null.
std::string checkpointSummaryJson(const std::string& dir, const ckpt::Manifest& m,
                                  const std::vector<Status>* checks);

}  // namespace hsdp::engine
