// The OpenAI Batch file format (https://platform.openai.com/docs/guides/batch), for `deltaflow batch`.
//   in:  {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}  one per line
//   out: {"id": "batch_req_...", "custom_id": "r1", "response": {"status_code": 200, "request_id": "...",
//         "body": {...}}, "error": null}
// A request the API refuses has its 4xx in response (as the API would answer it); a line that is no request
// at all (not JSON, no custom_id, a method or url we do not serve) has response null and error
// {"code", "message"} naming the line. The output is appended a line at a time, so a job killed at any moment
// leaves whole lines and at most one torn last line, which `recover_batch_output` cuts off.
#pragma once

#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.hpp"
#include "server/served_model.hpp"

namespace deltaflow::server {

struct BatchLine {
  size_t line_no = 0;                    // 1-based
  std::optional<std::string> custom_id;  // none: the line has no usable custom_id
  std::string url;                       // "/v1/chat/completions" or "/v1/completions"
  Json body;
  std::string error;  // non-empty: the line is bad; this says why

  // What identifies the line in the output: its custom_id, or (lines without one) its line number.
  std::string key() const;
  std::string output_id() const;  // the output line's "id"
};

// One input line (never throws).
BatchLine parse_batch_line(std::string_view text, size_t line_no);

// The input file's requests (blank lines skipped). A custom_id used twice is an error naming both lines,
// found before any work is done.
core::Expected<std::vector<BatchLine>> read_batch_input(const std::string& path);

// The keys an output line stands for ("" when the line is not one of ours).
std::string batch_output_key(std::string_view line);

// An existing output (--resume): the keys already written. A torn last line (no newline, or not JSON) is
// cut off the file; `repaired` says so. A bad line before the last is an error (not a file of ours).
core::Expected<std::set<std::string>> recover_batch_output(const std::string& path, bool* repaired);

std::string batch_response_line(const BatchLine& l, int status, const std::string& body_json,
                                const std::string& request_id);
std::string batch_error_line(const BatchLine& l, const std::string& code, const std::string& message);

}  // namespace deltaflow::server
