// write_safetensors: deterministic bytes (tensors ordered by element size, then name; data contiguous in that
// order; header
// keys in that order after "__metadata__", header padded with spaces to a multiple of 8), written to a
// temporary file and renamed so a reader never sees half a file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io/safetensors.hpp"
#include "io/tensor_bytes.hpp"

namespace deltaflow::io {
namespace {

bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

core::Expected<std::string> build_header(const std::string& path,
                                         const std::vector<const TensorToWrite*>& sorted,
                                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite* t : sorted) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = std::string(core::dtype_name(t->dtype));
    entry["shape"] = t->shape;
    entry["data_offsets"] = nlohmann::ordered_json::array({offset, offset + t->bytes.size()});
    header[t->name] = std::move(entry);
    offset += t->bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // a name or metadata string that is not UTF-8
    return core::Error{path + ": cannot encode header: " + e.what()};
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

core::Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> sorted;
  for (const TensorToWrite& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorToWrite& t = *sorted[i];
    if (i > 0 && sorted[i - 1]->name == t.name) return tensor_error(path, t.name, "duplicate name");
    if (t.name == "__metadata__") return tensor_error(path, t.name, "name is reserved");
    const auto nbytes = tensor_nbytes(t.shape, t.dtype);
    if (!nbytes) return tensor_error(path, t.name, "shape has a negative dimension or overflows");
    if (*nbytes != t.bytes.size())
      return tensor_error(path, t.name,
                          "has " + std::to_string(t.bytes.size()) + " bytes but its shape x " +
                              std::string(core::dtype_name(t.dtype)) + " needs " + std::to_string(*nbytes));
  }
  // Data laid out by element size, largest first, then by name (the python library's order): every tensor
  // starts at a multiple of its element size, so readers may view it in place.
  std::stable_sort(sorted.begin(), sorted.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    return core::dtype_size(a->dtype) > core::dtype_size(b->dtype);
  });
  DF_ASSIGN(const std::string header, build_header(path, sorted, metadata));
  uint8_t prefix[8];
  for (int i = 0; i < 8; ++i)
    prefix[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));

  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return core::Error{path + ": cannot create " + tmp + ": " + std::strerror(errno)};
  bool ok = write_all(fd, prefix, sizeof prefix) && write_all(fd, header.data(), header.size());
  for (size_t i = 0; ok && i < sorted.size(); ++i)
    ok = write_all(fd, sorted[i]->bytes.data(), sorted[i]->bytes.size());
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ok = (::close(fd) == 0) && ok;
  if (!ok) {
    ::unlink(tmp.c_str());
    return core::Error{path + ": cannot write: " + std::strerror(err)};
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rerr = errno;
    ::unlink(tmp.c_str());
    return core::Error{path + ": cannot rename " + tmp + " into place: " + std::strerror(rerr)};
  }
  return core::Status::ok();
}

}  // namespace deltaflow::io
