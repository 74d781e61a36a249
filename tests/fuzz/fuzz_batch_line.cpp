// `deltaflow batch` reads untrusted JSONL: any bytes must parse as one input line without a crash, and what
// it reports must hold together (a good line has a custom_id, a served url and an object body; a bad one says
// why, naming its line). The result lines written for it must read back as that line's key, which is what
// --resume relies on. The same bytes as an output line must give a key or "" without a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/batch_file.hpp"

using namespace deltaflow::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const BatchLine l = parse_batch_line(text, 7);
  if (l.error.empty()) {
    if (!l.custom_id || l.custom_id->empty() || !l.body.is_object()) __builtin_trap();
    if (l.url != "/v1/chat/completions" && l.url != "/v1/completions") __builtin_trap();
  } else if (l.error.rfind("line 7: ", 0) != 0) {
    __builtin_trap();
  }
  const std::string ok = batch_response_line(l, 200, "{\"x\": 1}", "id");
  const std::string bad = batch_error_line(l, "invalid_request", l.error);
  if (batch_output_key(ok) != l.key() || batch_output_key(bad) != l.key()) __builtin_trap();
  if (ok.find('\n') != std::string::npos || bad.find('\n') != std::string::npos) __builtin_trap();
  (void)batch_output_key(text);
  return 0;
}
