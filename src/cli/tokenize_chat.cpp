// `deltaflow tokenize --chat F.json [--chat-template FILE]`: the prompt text transformers'
// apply_chat_template(tokenize=False) gives for an OpenAI chat request body, printed exactly.
#include "cli/tokenize_chat.hpp"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.hpp"
#include "text/chat_template.hpp"

namespace deltaflow::cli {

namespace {

bool read_all(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return !in.bad();
}

}  // namespace

int tokenize_chat(const Args& args) {
  const std::string cmd = "tokenize";
  const std::string model = args.get_or("--model", default_model_dir());
  const auto chat_file = args.get("--chat");
  if (!chat_file) return fail(cmd, "missing --chat F.json");
  std::string body_text;
  if (!read_all(*chat_file, &body_text)) return fail(cmd, *chat_file + ": cannot open");
  nlohmann::ordered_json body;
  try {
    body = nlohmann::ordered_json::parse(body_text);  // ordered: tojson keeps the request's key order
  } catch (const std::exception& e) {
    return fail(cmd, *chat_file + ": invalid JSON: " + e.what());
  }

  core::Expected<text::ChatTemplate> tmpl = core::Error{""};
  if (const auto override_file = args.get("--chat-template")) {
    std::string source;
    if (!read_all(*override_file, &source)) return fail(cmd, *override_file + ": cannot open");
    auto special = text::ChatTemplate::load_special_tokens(model);
    if (!special) return fail(cmd, special.message());
    tmpl = text::ChatTemplate::from_source(source, *special);
  } else {
    tmpl = text::ChatTemplate::load(model);
  }
  if (!tmpl) return fail(cmd, tmpl.message());

  auto prompt = text::render_chat_request(*tmpl, body);
  if (!prompt) return fail(cmd, prompt.message());
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace deltaflow::cli
