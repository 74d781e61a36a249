#include "text/tool_call_parser.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include "text/tag_scan.hpp"

namespace deltaflow::text {

namespace {

using nlohmann::json;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// s is a proper prefix of one of the tags: more text may complete it.
bool prefix_of_any(std::string_view s, std::initializer_list<std::string_view> tags) {
  for (auto t : tags)
    if (s.size() < t.size() && t.substr(0, s.size()) == s) return true;
  return false;
}

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool parse_integer(std::string_view s, json& out) {
  if (s.empty()) return false;
  size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return false;
  for (size_t k = i; k < s.size(); ++k)
    if (s[k] < '0' || s[k] > '9') return false;
  const std::string str(s);
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(str.c_str(), &end, 10);
  if (errno == ERANGE || end != str.c_str() + str.size()) return false;
  out = v;
  return true;
}

bool parse_number(std::string_view s, json& out) {
  if (parse_integer(s, out)) return true;
  if (s.empty() || is_ascii_space(s.front())) return false;
  // Only JSON-like spellings: digits, sign, point, exponent (strtod would also take "inf", "nan", hex).
  for (char c : s)
    if (!((c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E')) return false;
  const std::string str(s);
  char* end = nullptr;
  const double v = std::strtod(str.c_str(), &end);
  if (end != str.c_str() + str.size() || !std::isfinite(v)) return false;
  out = v;
  return true;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

}  // namespace

std::string convert_param_value(std::string_view value, const std::vector<std::string>& types) {
  if (types.empty()) return dump(json(std::string(value)));
  const std::string_view t = trim(value);
  // A union tries its non-string members first: a value of ["integer", "string"] that reads as a number is
  // one.
  for (const auto& type : types) {
    json v;
    if (type == "integer") {
      if (parse_integer(t, v)) return dump(v);
    } else if (type == "number") {
      if (parse_number(t, v)) return dump(v);
    } else if (type == "boolean") {
      if (iequals(t, "true")) return "true";
      if (iequals(t, "false")) return "false";
    } else if (type == "null") {
      if (iequals(t, "null")) return "null";
    } else if (type == "object" || type == "array") {
      v = json::parse(t.begin(), t.end(), nullptr, false);
      if (!v.is_discarded() && ((type == "object" && v.is_object()) || (type == "array" && v.is_array())))
        return dump(v);
    }
  }
  // Strings, unknown type names, and values that do not read as their declared type stay text.
  return dump(json(std::string(value)));
}

ToolCallParser::ToolCallParser(std::vector<ToolSpec> tools) : tools_(std::move(tools)) {}

const ToolSpec* ToolCallParser::find_tool(const std::string& name) const {
  for (const auto& t : tools_)
    if (t.name == name) return &t;
  return nullptr;
}

ToolParseDelta ToolCallParser::push(std::string_view text) {
  buf_.append(text);
  ToolParseDelta out;
  run(out, false);
  return out;
}

ToolParseDelta ToolCallParser::finish() {
  ToolParseDelta out;
  run(out, true);
  return out;
}

void ToolCallParser::emit_text(ToolParseDelta& out, std::string_view s, bool final) {
  std::string text = held_space_;
  text.append(s);
  held_space_.clear();
  if (after_call_) {
    size_t i = 0;
    while (i < text.size() && is_ascii_space(text[i])) ++i;
    text.erase(0, i);
    if (text.empty()) return;
    after_call_ = false;
  }
  if (!final) {
    // Whitespace is released only once something follows it: if a call follows, it is dropped.
    size_t n = text.size();
    while (n > 0 && is_ascii_space(text[n - 1])) --n;
    held_space_ = text.substr(n);
    text.resize(n);
  }
  out.content += text;
}

void ToolCallParser::open_call(ToolParseDelta& out, const std::string& name) {
  ToolCallDelta d;
  d.index = next_index_++;
  d.begin = true;
  d.name = name;
  out.calls.push_back(std::move(d));
  call_open_ = true;
  ++block_calls_;
  params_ = 0;
  function_name_ = name;
}

void ToolCallParser::close_call(ToolParseDelta& out) {
  if (!call_open_) return;
  ToolCallDelta d;
  d.index = next_index_ - 1;
  d.arguments = params_ == 0 ? "{}" : "}";
  out.calls.push_back(std::move(d));
  call_open_ = false;
}

void ToolCallParser::emit_param(ToolParseDelta& out, const std::string& key, std::string_view raw) {
  if (!call_open_) return;
  // The template writes "<parameter=K>\nV\n</parameter>": one newline on each side is markup.
  if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
  if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
  static const std::vector<std::string> kNoTypes;
  const ToolSpec* tool = find_tool(function_name_);
  const std::vector<std::string>* types = &kNoTypes;
  if (tool) {
    auto it = tool->param_types.find(key);
    if (it != tool->param_types.end()) types = &it->second;
  }
  ToolCallDelta d;
  d.index = next_index_ - 1;
  d.arguments = (params_ == 0 ? "{" : ", ") + dump(json(key)) + ": " + convert_param_value(raw, *types);
  ++params_;
  out.calls.push_back(std::move(d));
}

bool ToolCallParser::step_xml(ToolParseDelta& out, bool final) {
  const std::string_view body(buf_);
  size_t pos = body_pos_;
  auto skip_space = [&] {
    while (pos < body.size() && is_ascii_space(body[pos])) ++pos;
  };
  auto end_block = [&](size_t consumed) {
    buf_.erase(0, consumed);
    mode_ = Mode::kText;
    after_call_ = true;
    body_pos_ = 0;
    in_function_ = false;
  };
  for (;;) {
    skip_space();
    const std::string_view rest = body.substr(pos);
    if (!in_function_) {
      if (starts_with(rest, kCallClose)) {
        end_block(pos + kCallClose.size());
        return true;
      }
      if (starts_with(rest, kFunctionOpen)) {
        const size_t gt = rest.find('>');
        if (gt == std::string_view::npos) break;
        open_call(out, std::string(trim(rest.substr(kFunctionOpen.size(), gt - kFunctionOpen.size()))));
        in_function_ = true;
        pos += gt + 1;
        continue;
      }
      if (implicit_ && block_calls_ > 0) {
        // A bare <function=...> block has ended; only a stray </tool_call>, or another bare function, after
        // it belongs to it.
        if (!final && prefix_of_any(rest, {kCallClose, kFunctionOpen})) break;
        end_block(pos);
        return true;
      }
      if (rest.empty() || prefix_of_any(rest, {kCallClose, kFunctionOpen})) break;
      // Stray text between functions: skip to the next tag.
      const size_t lt = rest.find('<', 1);
      if (lt == std::string_view::npos) {
        pos = body.size();
        break;
      }
      pos += lt;
      continue;
    }
    // Inside <function=...>.
    if (starts_with(rest, kParamOpen)) {
      const size_t gt = rest.find('>');
      if (gt == std::string_view::npos) break;
      const std::string key(trim(rest.substr(kParamOpen.size(), gt - kParamOpen.size())));
      const std::string_view value = rest.substr(gt + 1);
      size_t end = std::string_view::npos, skip = 0;
      for (auto marker : {kParamClose, kParamOpen, kFunctionClose, kCallClose}) {
        const size_t p = value.find(marker);
        if (p < end) end = p, skip = marker == kParamClose ? marker.size() : 0;
      }
      if (end == std::string_view::npos) {
        if (!final) break;
        end = value.size();
      }
      emit_param(out, key, value.substr(0, end));
      pos += gt + 1 + end + skip;
      continue;
    }
    if (starts_with(rest, kFunctionClose)) {
      close_call(out);
      in_function_ = false;
      pos += kFunctionClose.size();
      continue;
    }
    if (starts_with(rest, kCallClose)) {  // </function> missing
      close_call(out);
      in_function_ = false;
      continue;
    }
    if (rest.empty() || prefix_of_any(rest, {kParamOpen, kFunctionClose, kCallClose})) break;
    const size_t lt = rest.find('<', 1);
    if (lt == std::string_view::npos) {
      pos = body.size();
      break;
    }
    pos += lt;
  }
  body_pos_ = pos;
  if (!final) return false;
  // End of output inside a call block: finish a call that has a name; a block that yielded no call at all is
  // given back as text.
  if (call_open_) {
    close_call(out);
  } else if (block_calls_ == 0 && !trim(body).empty()) {
    std::string raw = implicit_ ? std::string(body) : std::string(kCallOpen) + std::string(body);
    buf_.clear();
    mode_ = Mode::kText;
    after_call_ = false;
    emit_text(out, raw, true);
    return true;
  }
  end_block(buf_.size());
  return true;
}

void ToolCallParser::run(ToolParseDelta& out, bool final) {
  for (;;) {
    if (mode_ == Mode::kText) {
      const size_t p_call = buf_.find(kCallOpen);
      const size_t p_fn = buf_.find(kFunctionOpen);
      const size_t p = std::min(p_call, p_fn);
      if (p != std::string::npos) {
        // Text before a call loses its trailing whitespace.
        std::string_view before(buf_.data(), p);
        while (!before.empty() && is_ascii_space(before.back())) before.remove_suffix(1);
        if (before.empty()) {
          held_space_.clear();
        } else {
          emit_text(out, before, true);
        }
        implicit_ = p == p_fn && p_fn < p_call;
        buf_.erase(0, implicit_ ? p : p + kCallOpen.size());
        mode_ = Mode::kCall;
        body_pos_ = 0;
        in_function_ = false;
        call_open_ = false;
        block_calls_ = 0;
        continue;
      }
      const size_t hold =
          final ? 0 : std::max(partial_tag_suffix(buf_, kCallOpen), partial_tag_suffix(buf_, kFunctionOpen));
      emit_text(out, std::string_view(buf_).substr(0, buf_.size() - hold), final);
      buf_.erase(0, buf_.size() - hold);
      return;
    }
    // Call mode: which format?
    size_t i = 0;
    while (i < buf_.size() && is_ascii_space(buf_[i])) ++i;
    const std::string_view lead = std::string_view(buf_).substr(i);
    if (starts_with(lead, kFunctionOpen) || (implicit_ && !lead.empty()) || body_pos_ > 0 || in_function_) {
      if (!step_xml(out, final)) return;
      continue;
    }
    if (!final && (lead.empty() || prefix_of_any(lead, {kFunctionOpen}))) return;
    // JSON (hermes) form, or unknown: the whole body up to </tool_call>.
    const size_t close = buf_.find(kCallClose);
    if (close == std::string::npos && !final) return;
    const std::string_view body =
        std::string_view(buf_).substr(0, close == std::string::npos ? buf_.size() : close);
    const size_t consumed = close == std::string::npos ? buf_.size() : close + kCallClose.size();
    const std::string_view t = trim(body);
    json j = json::parse(t.begin(), t.end(), nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("name") && j["name"].is_string()) {
      const json* args = nullptr;
      if (j.contains("arguments"))
        args = &j["arguments"];
      else if (j.contains("parameters"))
        args = &j["parameters"];
      std::string arg_text = "{}";
      if (args && args->is_object()) {
        arg_text = dump(*args);
      } else if (args && args->is_string()) {
        // Some models write the arguments as a JSON string; keep it when it holds an object.
        const std::string& s = args->get_ref<const std::string&>();
        json inner = json::parse(s, nullptr, false);
        if (!inner.is_discarded() && inner.is_object()) arg_text = dump(inner);
      }
      open_call(out, j["name"].get<std::string>());
      ToolCallDelta d;
      d.index = next_index_ - 1;
      d.arguments = arg_text;
      out.calls.push_back(std::move(d));
      call_open_ = false;
      buf_.erase(0, consumed);
      mode_ = Mode::kText;
      after_call_ = true;
      continue;
    }
    // Not a call after all: the raw text is content.
    std::string raw = std::string(kCallOpen) + buf_.substr(0, consumed);
    buf_.erase(0, consumed);
    mode_ = Mode::kText;
    after_call_ = false;
    emit_text(out, raw, false);
  }
}

ParsedToolCalls parse_tool_calls(std::string_view text, const std::vector<ToolSpec>& tools) {
  ToolCallParser p(tools);
  ParsedToolCalls r;
  auto take = [&](ToolParseDelta d) {
    r.content += d.content;
    for (auto& c : d.calls) {
      if (c.begin) r.calls.push_back({c.name, ""});
      if (!r.calls.empty() && static_cast<size_t>(c.index) < r.calls.size())
        r.calls[c.index].arguments += c.arguments;
    }
  };
  take(p.push(text));
  take(p.finish());
  return r;
}

}  // namespace deltaflow::text
