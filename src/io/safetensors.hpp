// Safetensors: strict header parsing, mmap'd files, sharded checkpoints, and a deterministic writer.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:[b,e]},
// "__metadata__": {str: str}}, then the data section; offsets are relative to the data section.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.hpp"
#include "core/status.hpp"

namespace deltaflow::io {

// Upper bound on the JSON header (the reference implementation uses 100 MB too).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorEntry {
  std::string name;
  core::DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range inside the data section
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  // in file order of data_offsets
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // 8 + header length: where the data section starts in the file
};

// "<file>: tensor '<name>': <what>", the form of every per-tensor error here.
core::Error tensor_error(std::string_view file, const std::string& name, const std::string& what);
// "[d0, d1, ...]": a shape as error messages print it.
std::string shape_string(const std::vector<int64_t>& shape);

// Parses and validates the first `size` bytes of a safetensors file (`size` is the whole file's size; the
// data section is not read). Checks: length prefix and bound, valid JSON object, known dtype, non-negative
// shape, offsets inside the data section, numel x dtype size == bytes, no overlaps, no duplicate names.
// Errors name `file_name` and the tensor.
core::Expected<SafetensorsHeader> parse_safetensors_header(const uint8_t* data, size_t size,
                                                           std::string_view file_name);

// A tensor inside an open checkpoint: a view of mmap'd bytes, valid while the checkpoint lives.
struct Tensor {
  std::string name;
  core::DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  const std::string* file = nullptr;  // path of the shard that holds it
  int64_t numel() const;
};

// One mmap'd .safetensors file.
class SafetensorsFile {
 public:
  static core::Expected<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const uint8_t* tensor_data(const TensorEntry& e) const { return base_ + header_.data_offset + e.begin; }

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

// All tensors of a checkpoint directory: `model.safetensors.index.json` (shards named in its weight_map,
// each tensor must be in the shard the index names) or a single `model.safetensors`.
class Checkpoint {
 public:
  static core::Expected<Checkpoint> open(const std::string& dir);

  const Tensor* find(std::string_view name) const;  // nullptr if absent
  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<Tensor> tensors_;  // sorted by name
};

// A tensor to write: bytes must hold numel x dtype size.
struct TensorToWrite {
  std::string name;
  core::DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

// Writes one safetensors file; the same inputs give the same bytes (tensors ordered by element size, then
// name, so each starts aligned to its element size; 8-byte aligned header padded with spaces, as the python
// library does).
core::Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata);

}  // namespace deltaflow::io
