// Checkpoint: every tensor of a Hugging Face checkpoint directory, from one file or from the shards that
// model.safetensors.index.json names. The index and the shards must agree exactly: a stale index or a
// mixed-up shard is an error here, not a missing weight later.
#include <algorithm>
#include <filesystem>
#include <set>

#include "io/json_file.hpp"
#include "io/safetensors.hpp"

namespace deltaflow::io {
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string join(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

// weight_map: tensor name -> shard file name (a plain name inside the checkpoint directory).
core::Expected<std::map<std::string, std::string>> read_weight_map(const std::string& index_path) {
  DF_ASSIGN(const nlohmann::json index, read_json_file(index_path));
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    return core::Error{index_path + ": no \"weight_map\" object"};
  std::map<std::string, std::string> map;
  for (const auto& [name, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) return tensor_error(index_path, name, "shard is not a string");
    const auto& s = shard.get_ref<const std::string&>();
    if (s.empty() || s == "." || s == ".." || s.find('/') != std::string::npos)
      return tensor_error(index_path, name,
                          "shard '" + s + "' is not a file name in the checkpoint directory");
    map.emplace(name, s);
  }
  if (map.empty()) return core::Error{index_path + ": \"weight_map\" is empty"};
  return map;
}

// Every tensor found must be listed for the shard it was found in, and every listed tensor found.
core::Status check_index(const std::string& dir, const std::string& index_path,
                         const std::map<std::string, std::string>& weight_map, const Checkpoint& ck) {
  for (const Tensor& t : ck.tensors()) {
    const auto it = weight_map.find(t.name);
    if (it == weight_map.end()) return tensor_error(*t.file, t.name, "not listed in " + index_path);
    if (join(dir, it->second) != *t.file)
      return tensor_error(*t.file, t.name,
                          "found in this shard, but " + index_path + " places it in '" + it->second + "'");
  }
  for (const auto& [name, shard] : weight_map) {
    if (!ck.find(name))
      return tensor_error(join(dir, shard), name, "listed in " + index_path + " but missing from this shard");
  }
  return core::Status::ok();
}

}  // namespace

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

core::Expected<Checkpoint> Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string index_path = join(dir, kIndexName);
  const bool sharded = fs::exists(index_path, ec);
  Checkpoint ck;
  ck.dir_ = dir;

  std::map<std::string, std::string> weight_map;
  std::vector<std::string> paths;
  if (sharded) {
    DF_ASSIGN(weight_map, read_weight_map(index_path));
    std::map<std::string, std::string>
        first_tensor;  // shard -> a tensor that names it, for the error message
    for (const auto& [name, shard] : weight_map) first_tensor.emplace(shard, name);
    for (const auto& [shard, name] : first_tensor) {
      const std::string path = join(dir, shard);
      if (!fs::exists(path, ec))
        return tensor_error(index_path, name, "shard '" + shard + "' does not exist");
      paths.push_back(path);
    }
  } else if (fs::exists(join(dir, kSingleName), ec)) {
    paths.push_back(join(dir, kSingleName));
  } else {
    return core::Error{dir + ": no " + kSingleName + " or " + kIndexName};
  }

  for (const std::string& path : paths) {
    DF_ASSIGN(auto file, SafetensorsFile::open(path));
    for (const TensorEntry& e : file->header().tensors)
      ck.tensors_.push_back(
          Tensor{e.name, e.dtype, e.shape, file->tensor_data(e), e.end - e.begin, &file->path()});
    ck.files_.push_back(std::move(file));
  }
  // Stable, so of two equal names the one from the earlier shard comes first in the error.
  std::stable_sort(ck.tensors_.begin(), ck.tensors_.end(),
                   [](const Tensor& a, const Tensor& b) { return a.name < b.name; });
  for (size_t i = 1; i < ck.tensors_.size(); ++i) {
    const Tensor &a = ck.tensors_[i - 1], &b = ck.tensors_[i];
    if (a.name == b.name) return tensor_error(*b.file, b.name, "also present in " + *a.file);
  }
  if (sharded) DF_TRY(check_index(dir, index_path, weight_map, ck));
  return ck;
}

const Tensor* Checkpoint::find(std::string_view name) const {
  const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                   [](const Tensor& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

}  // namespace deltaflow::io
