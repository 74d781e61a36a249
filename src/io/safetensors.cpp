// parse_safetensors_header (the strict validator every safetensors byte goes through before use) and numel.
#include <algorithm>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "io/safetensors.hpp"
#include "io/tensor_bytes.hpp"

namespace deltaflow::io {
namespace {

using nlohmann::json;

core::Error file_error(std::string_view file, const std::string& what) {
  return core::Error{std::string(file) + ": " + what};
}

// nlohmann keeps the last of two equal keys without a word; its parser callback sees every key, so we
// track the keys of each open object and remember the first repeat.
struct DuplicateFinder {
  std::vector<std::set<std::string>> open_objects;
  std::string top_key;                 // the top-level entry now being parsed
  std::optional<std::string> dup_top;  // first repeat: the top-level entry it is in ...
  std::optional<std::string> dup_key;  // ... and, if nested, the repeated key

  bool on_event(json::parse_event_t event, const json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      const bool top = open_objects.size() == 1;
      if (top) top_key = key;
      if (!open_objects.back().insert(key).second && !dup_top) {
        dup_top = top_key;
        if (!top) dup_key = key;
      }
    }
    return true;  // keep everything; the repeat is reported after parsing
  }
};

// A JSON value for an error message, cut short: the value comes from the file and may be huge.
std::string brief(const json& j) {
  std::string s = j.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string offsets_text(uint64_t b, uint64_t e) {
  // Appending (not "[" + to_string(...)) sidesteps a GCC 12 -Wrestrict false positive.
  std::string s = "[";
  s += std::to_string(b);
  s += ", ";
  s += std::to_string(e);
  s += "]";
  return s;
}

core::Expected<std::vector<int64_t>> parse_shape(const json& j, std::string_view file,
                                                 const std::string& name) {
  if (!j.is_array()) return tensor_error(file, name, "shape is not an array");
  std::vector<int64_t> shape;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& d = j[i];
    const std::string where = "shape[" + std::to_string(i) + "]";
    if (d.is_number_unsigned()) {
      if (d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return tensor_error(file, name, where + " = " + brief(d) + " is too large");
      shape.push_back(d.get<int64_t>());
    } else if (d.is_number_integer()) {  // signed and not unsigned: negative
      return tensor_error(file, name, where + " = " + brief(d) + " is negative");
    } else {
      return tensor_error(file, name, where + " = " + brief(d) + " is not a non-negative integer");
    }
  }
  return shape;
}

core::Expected<TensorEntry> parse_entry(const std::string& name, const json& j, uint64_t data_size,
                                        std::string_view file) {
  if (!j.is_object()) return tensor_error(file, name, "entry is not a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      return tensor_error(file, name, "unexpected key '" + key + "'");
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(key)) return tensor_error(file, name, std::string("missing '") + key + "'");
  }

  TensorEntry e;
  e.name = name;
  const json& dt = j["dtype"];
  if (!dt.is_string()) return tensor_error(file, name, "dtype is not a string");
  const auto dtype = core::dtype_from_name(dt.get_ref<const std::string&>());
  if (!dtype) return tensor_error(file, name, "unsupported dtype " + dt.get<std::string>());
  e.dtype = *dtype;
  DF_ASSIGN(e.shape, parse_shape(j["shape"], file, name));

  const json& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    return tensor_error(file, name,
                        "data_offsets " + brief(off) + " is not [begin, end] of non-negative integers");
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end)
    return tensor_error(file, name, "data_offsets " + offsets_text(e.begin, e.end) + " has begin > end");
  if (e.end > data_size)
    return tensor_error(file, name,
                        "data_offsets " + offsets_text(e.begin, e.end) +
                            " run past the end of the data section (" + std::to_string(data_size) +
                            " bytes); file truncated?");

  const auto nbytes = tensor_nbytes(e.shape, e.dtype);
  if (!nbytes) return tensor_error(file, name, "shape " + brief(j["shape"]) + " overflows");
  if (*nbytes != e.end - e.begin)
    return tensor_error(file, name,
                        "shape " + brief(j["shape"]) + " x " + std::string(core::dtype_name(e.dtype)) +
                            " needs " + std::to_string(*nbytes) + " bytes but data_offsets " +
                            offsets_text(e.begin, e.end) + " span " + std::to_string(e.end - e.begin));
  return e;
}

core::Status parse_metadata(const json& j, std::string_view file, std::map<std::string, std::string>& out) {
  if (!j.is_object()) return file_error(file, "__metadata__ is not a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string()) return file_error(file, "__metadata__ '" + key + "' is not a string");
    out.emplace(key, value.get<std::string>());
  }
  return core::Status::ok();
}

// Zero-length tensors occupy no bytes, so they may sit anywhere; the rest must not share a byte.
core::Status check_no_overlap(const std::vector<TensorEntry>& sorted, std::string_view file) {
  const TensorEntry* prev = nullptr;
  for (const TensorEntry& e : sorted) {
    if (e.begin == e.end) continue;
    if (prev && e.begin < prev->end)
      return tensor_error(file, e.name,
                          "data_offsets " + offsets_text(e.begin, e.end) + " overlap tensor '" + prev->name +
                              "' " + offsets_text(prev->begin, prev->end));
    if (!prev || e.end > prev->end) prev = &e;
  }
  return core::Status::ok();
}

}  // namespace

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

core::Error tensor_error(std::string_view file, const std::string& name, const std::string& what) {
  return core::Error{std::string(file) + ": tensor '" + name + "': " + what};
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

core::Expected<SafetensorsHeader> parse_safetensors_header(const uint8_t* data, size_t size,
                                                           std::string_view file_name) {
  if (size < 8)
    return file_error(file_name,
                      "file is " + std::to_string(size) + " bytes, too small for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n == 0) return file_error(file_name, "header length is 0");
  if (n > kMaxHeaderBytes)
    return file_error(file_name, "header length " + std::to_string(n) + " exceeds the limit of " +
                                     std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > size - 8)
    return file_error(file_name, "header length " + std::to_string(n) + " exceeds the " +
                                     std::to_string(size - 8) +
                                     " bytes after the length prefix; file truncated?");

  json root;
  DuplicateFinder dups;
  try {
    const auto* text = reinterpret_cast<const char*>(data + 8);
    root = json::parse(text, text + n, [&dups](int, json::parse_event_t ev, json& parsed) {
      return dups.on_event(ev, parsed);
    });
  } catch (const json::exception& e) {
    return file_error(file_name, std::string("invalid JSON header: ") + e.what());
  } catch (const std::exception& e) {  // bad_alloc on a huge header: still an error value, not a throw
    return file_error(file_name, std::string("cannot parse header: ") + e.what());
  }
  if (!root.is_object()) return file_error(file_name, "header is not a JSON object");
  if (dups.dup_top) {
    if (dups.dup_key) {
      const std::string what = "duplicate key '" + *dups.dup_key + "'";
      if (*dups.dup_top == "__metadata__") return file_error(file_name, "__metadata__: " + what);
      return tensor_error(file_name, *dups.dup_top, what);
    }
    if (*dups.dup_top == "__metadata__") return file_error(file_name, "duplicate __metadata__");
    return tensor_error(file_name, *dups.dup_top, "duplicate name");
  }

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_size = size - 8 - n;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      DF_TRY(parse_metadata(value, file_name, h.metadata));
      continue;
    }
    DF_ASSIGN(TensorEntry e, parse_entry(name, value, data_size, file_name));
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  DF_TRY(check_no_overlap(h.tensors, file_name));
  return h;
}

}  // namespace deltaflow::io
