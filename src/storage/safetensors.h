// Internal to storage/: the safetensors format (8-byte little-endian header length, a JSON
// header of {name: {dtype, shape, data_offsets}} plus "__metadata__", then the raw tensor data)
// and HF's sharded form (<stem>-00001-of-0000n.safetensors plus <stem>.safetensors.index.json
// with a "weight_map"). The reader checks every offset and size (the fuzz target drives
// parseSafetensorsHeader); the writer streams tensors in order with bounded memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "hsdp/dtype.h"
#include "storage/format.h"
#include "storage/io.h"

namespace hsdp::ckpt {

// Headers above this are refused (the safetensors package's own limit).
constexpr uint64_t kMaxSafetensorsHeader = uint64_t{100} << 20;

struct StTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  int file = 0;                 // in SafetensorsSet::files
};

struct SafetensorsHeader {
  std::vector<StTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// The header JSON of a file whose data section holds `data_bytes` bytes. Errors name `where`.
StatusOr<SafetensorsHeader> parseSafetensorsHeader(std::string_view json, uint64_t data_bytes,
                                                   const std::string& where);

// One safetensors file, or the files of an index, open for reading.
class SafetensorsSet {
 public:
  std::vector<std::string> paths;
  std::vector<File> files;
  std::vector<uint64_t> data_start;  // per file: 8 + header length
  std::vector<StTensor> tensors;
  std::map<std::string, int> by_name;
  // Elements [start, start + count) of tensor t as fp32 (F32 as is, BF16 upcast).
  [[nodiscard]] Status read(int t, uint64_t start, uint64_t count, float* dst);

 private:
  std::vector<uint16_t> buf16_;
};

// `path`: a .safetensors file, an index (.json), or "<stem>.safetensors" that does not exist
// while "<stem>.safetensors.index.json" does.
StatusOr<SafetensorsSet> openSafetensors(const std::string& path);
// How the set names parameters: "<prefix><unit>.<param>" for each prefix in order (the first
// found wins); `ignore`: tensors that are no parameter (skipped, also with strict).
struct TensorNames {
  std::vector<std::string> prefixes = {""};
  std::set<std::string> ignore;
};
// index[u][p]: the tensor "<prefix><unit>.<param>" of the set, or -1 (strict: an error). Shapes
// must match; strict also refuses tensors that are no parameter of `units` and not ignored.
[[nodiscard]] Status matchTensors(const SafetensorsSet& set, const std::vector<UnitDesc>& units,
                                  bool strict, const TensorNames& names,
                                  std::vector<std::vector<int>>* index);

// Streams tensors, in the order given, into one file or HF-style shards.
class SafetensorsWriter {
 public:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
  };
  // Errors: dtype neither float32 nor bf16, a file that cannot be created.
  static StatusOr<SafetensorsWriter> create(const std::string& out, std::vector<Tensor> tensors,
                                            DType dtype, uint64_t max_shard_bytes);
  // The next `n` elements (tensor after tensor, in order), converted to the dtype.
  [[nodiscard]] Status append(const float* data, size_t n);
  // Syncs and renames every file into place (the index last); returns their paths.
  StatusOr<std::vector<std::string>> finish();
  // The paths finish() will return.
  std::vector<std::string> plannedFiles() const;
  // Checks every planned file as an output target (files::checkOutputTarget): not a link, a
  // device, a FIFO or a directory, and neither equal to nor inside any of `inputs`.
  [[nodiscard]] Status checkTargets(const std::vector<std::string>& inputs) const;

  SafetensorsWriter() = default;
  ~SafetensorsWriter();  // removes the temporaries of a write that did not finish
  SafetensorsWriter(SafetensorsWriter&&) noexcept = default;
  SafetensorsWriter& operator=(SafetensorsWriter&&) noexcept = default;

 private:
  Status openShard(size_t shard);
  std::string out_;
  std::vector<Tensor> tensors_;
  DType dtype_ = DType::kFloat32;
  std::vector<size_t> shard_of_;    // per tensor
  std::vector<std::string> names_;  // final file name per shard
  size_t tensor_ = 0;
  uint64_t done_ = 0;  // elements of tensors_[tensor_] written
  size_t shard_ = 0;
  File file_;
  std::vector<uint16_t> buf16_;
  std::vector<std::string> written_;
  uint64_t total_bytes_ = 0;
  // The output directory (opened with the first shard) and the temporaries written in it, each
  // files::tempName(final name), renamed into place by finish().
  std::unique_ptr<Dir> dir_;
  std::vector<std::string> temps_;
};

}  // namespace hsdp::ckpt
