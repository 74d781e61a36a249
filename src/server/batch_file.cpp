#include "server/batch_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

namespace deltaflow::server {

namespace {

std::string dump_line(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

std::string BatchLine::key() const {
  return custom_id ? *custom_id : "#line:" + std::to_string(line_no);
}

std::string BatchLine::output_id() const {
  return "batch_req_" + std::to_string(line_no);
}

BatchLine parse_batch_line(std::string_view text, size_t line_no) {
  BatchLine l;
  l.line_no = line_no;
  const std::string at = "line " + std::to_string(line_no) + ": ";
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    l.error = at + "not valid JSON";
    return l;
  }
  if (!j.is_object()) {
    l.error = at + "not a JSON object";
    return l;
  }
  if (auto it = j.find("custom_id"); it != j.end() && it->is_string() && !it->get<std::string>().empty())
    l.custom_id = it->get<std::string>();
  else {
    l.error = at + "'custom_id' must be a non-empty string";
    return l;
  }
  auto method = j.find("method");
  if (method != j.end() && !(method->is_string() && method->get<std::string>() == "POST")) {
    l.error = at + "'method' must be \"POST\"";
    return l;
  }
  auto url = j.find("url");
  if (url == j.end() || !url->is_string()) {
    l.error = at + "'url' must be \"/v1/chat/completions\" or \"/v1/completions\"";
    return l;
  }
  l.url = url->get<std::string>();
  if (l.url != "/v1/chat/completions" && l.url != "/v1/completions") {
    l.error = at + "'url' " + l.url + " is not served (use /v1/chat/completions or /v1/completions)";
    return l;
  }
  auto body = j.find("body");
  if (body == j.end() || !body->is_object()) {
    l.error = at + "'body' must be an object";
    return l;
  }
  l.body = std::move(*body);
  return l;
}

core::Expected<std::vector<BatchLine>> read_batch_input(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return core::Error{path + ": cannot open"};
  std::vector<BatchLine> out;
  std::map<std::string, size_t> seen;  // custom_id -> line
  std::string text;
  size_t line_no = 0;
  while (std::getline(in, text)) {
    ++line_no;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    BatchLine l = parse_batch_line(text, line_no);
    if (l.custom_id) {
      auto [it, fresh] = seen.emplace(*l.custom_id, line_no);
      if (!fresh)
        return core::Error{path + ": custom_id '" + *l.custom_id + "' is used on line " +
                           std::to_string(it->second) + " and line " + std::to_string(line_no) +
                           " (each request needs its own)"};
    }
    out.push_back(std::move(l));
  }
  if (in.bad()) return core::Error{path + ": read error"};
  return out;
}

std::string batch_output_key(std::string_view line) {
  Json j = Json::parse(line, nullptr, false);
  if (!j.is_object()) return "";
  if (auto c = j.find("custom_id"); c != j.end() && c->is_string()) return c->get<std::string>();
  if (auto c = j.find("custom_id"); c != j.end() && c->is_null()) {
    auto id = j.find("id");
    constexpr std::string_view kPrefix = "batch_req_";
    if (id != j.end() && id->is_string() && id->get<std::string>().rfind(kPrefix, 0) == 0)
      return "#line:" + id->get<std::string>().substr(kPrefix.size());
  }
  return "";
}

core::Expected<std::set<std::string>> recover_batch_output(const std::string& path, bool* repaired) {
  if (repaired) *repaired = false;
  std::set<std::string> done;
  std::ifstream in(path, std::ios::binary);
  if (!in) return done;  // nothing written yet
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string data = ss.str();
  in.close();
  size_t pos = 0, good_end = 0, line_no = 0;
  while (pos < data.size()) {
    const size_t nl = data.find('\n', pos);
    ++line_no;
    const bool last = nl == std::string::npos || nl + 1 == data.size();
    const std::string_view line(data.data() + pos, (nl == std::string::npos ? data.size() : nl) - pos);
    const std::string key = nl == std::string::npos ? "" : batch_output_key(line);
    if (key.empty()) {
      if (!last)
        return core::Error{path + ": line " + std::to_string(line_no) +
                           " is not a batch result line (is this the output of deltaflow batch?)"};
      break;  // a torn last line: cut below
    }
    done.insert(key);
    good_end = nl + 1;
    pos = nl + 1;
  }
  if (good_end < data.size()) {
    const int fd = ::open(path.c_str(), O_WRONLY);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(good_end)) != 0 || ::fsync(fd) != 0) {
      if (fd >= 0) ::close(fd);
      return core::Error{path + ": cannot cut the torn last line"};
    }
    ::close(fd);
    if (repaired) *repaired = true;
  }
  return done;
}

std::string batch_response_line(const BatchLine& l, int status, const std::string& body_json,
                                const std::string& request_id) {
  Json body = Json::parse(body_json, nullptr, false);
  if (body.is_discarded()) body = body_json;
  Json j = {{"id", l.output_id()},
            {"custom_id", l.custom_id ? Json(*l.custom_id) : Json(nullptr)},
            {"response", {{"status_code", status}, {"request_id", request_id}, {"body", std::move(body)}}},
            {"error", nullptr}};
  return dump_line(j);
}

std::string batch_error_line(const BatchLine& l, const std::string& code, const std::string& message) {
  Json j = {{"id", l.output_id()},
            {"custom_id", l.custom_id ? Json(*l.custom_id) : Json(nullptr)},
            {"response", nullptr},
            {"error", {{"code", code}, {"message", message}}}};
  return dump_line(j);
}

}  // namespace deltaflow::server
