// The one model a server process serves: the backend behind the engine thread, and what the HTTP threads use
// without touching it (tokenizer, chat template, generation defaults, special ids, facts for /api/show).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/status.hpp"
#include "engine/generate.hpp"
#include "engine/scheduler.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"
#include "vision/processor_config.hpp"

namespace deltaflow::server {

using Json = nlohmann::ordered_json;

// Sampling defaults from generation_config.json; unset fields fall back to OpenAI's defaults.
struct GenerationDefaults {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::optional<int64_t> max_tokens;  // max_new_tokens
  // --max-tokens-limit: the most tokens one request may ask for (more is a 400; the default and Ollama's
  // "unlimited" are capped to it). None: only the context bounds it.
  std::optional<int64_t> max_tokens_limit;
};

struct ModelLoadOptions {
  std::string model_dir;
  engine::Device device = engine::Device::kAuto;
  int tensor_parallel = 1;
  std::string served_name;          // empty: the directory's name
  engine::SchedulerOptions engine;  // max_model_len 0: the model's max_position_embeddings
  // Special tokens written in message contents, tool results, names and tool definitions are parsed as
  // tokens (the permissive behaviour) instead of staying text (text/content_literals.hpp).
  bool allow_special_in_content = false;
};

class ServedModel {
 public:
  static core::Expected<std::unique_ptr<ServedModel>> load(const ModelLoadOptions& o);
  ~ServedModel();

  const std::string& name() const { return name_; }
  // The request's model name refers to this model ("name" or "name:latest" for Ollama clients).
  bool matches(const std::string& requested) const;
  const text::Tokenizer& tokenizer() const { return *tokenizer_; }
  engine::Scheduler& scheduler() { return *scheduler_; }
  const model::TextConfig& config() const { return backend_->config(); }
  const GenerationDefaults& defaults() const { return defaults_; }
  int64_t max_model_len() const { return max_model_len_; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  int32_t think_start_id() const { return think_start_; }
  int32_t think_end_id() const { return think_end_; }
  // <|im_end|>: where a rendered chat message ends (prefix-cache checkpoints), -1 when the vocabulary has
  // none.
  int32_t message_end_id() const { return message_end_; }
  // The template writes calls as <function=...> XML (Qwen3.5); else the hermes JSON form (Qwen3).
  bool xml_tool_calls() const { return xml_tools_; }
  bool has_chat_template() const { return chat_template_.has_value(); }
  const std::string& chat_template_source() const { return chat_template_source_; }
  const std::string& dir() const { return dir_; }
  int64_t parameter_count() const { return parameters_; }
  uint64_t weight_bytes() const { return weight_bytes_; }
  const std::string& digest() const { return digest_; }
  int64_t modified_unix() const { return modified_unix_; }
  const char* device_name() const { return backend_->name(); }
  // Images: the vision config when this model and backend can take them (null otherwise: vision_error() says
  // why, e.g. the missing `model.visual.*` weights), and the checkpoint's image processor.
  const model::VisionConfig* vision() const { return processor_ ? backend_->vision() : nullptr; }
  const std::string& vision_error() const { return vision_error_; }
  const vision::ProcessorConfig& processor() const { return *processor_; }

  // Renders the chat template as transformers' apply_chat_template does (text/chat_template.hpp).
  // `messages` are already normalised (tool-call arguments as objects); `tools` null when none; `kwargs` the
  // template variables (enable_thinking, ...). Special-token spellings from the request are marked literal
  // unless the server allows special tokens in content.
  core::Expected<text::RenderedChat> render_chat(const Json& messages, const Json& tools,
                                                 bool add_generation_prompt, const Json& kwargs) const;
  // The prompt's ids: the literal spans tokenized as text, the template's own special tokens parsed.
  std::vector<int32_t> encode_prompt(const text::RenderedChat& prompt) const {
    return tokenizer_->encode_literal(prompt.text, prompt.literal);
  }

 private:
  ServedModel() = default;

  std::string name_, dir_;
  std::unique_ptr<backend::Backend> backend_;
  std::optional<text::Tokenizer> tokenizer_;
  std::optional<text::ChatTemplate> chat_template_;
  std::string chat_template_source_;
  GenerationDefaults defaults_;
  std::vector<int32_t> eos_ids_;
  int32_t think_start_ = -1, think_end_ = -1, message_end_ = -1;
  bool xml_tools_ = true;
  std::vector<std::string> literal_tokens_;  // empty: special tokens in content are parsed
  int64_t max_model_len_ = 0;
  std::optional<vision::ProcessorConfig> processor_;  // set when the backend can encode images
  std::string vision_error_;
  int64_t parameters_ = 0;
  uint64_t weight_bytes_ = 0;
  std::string digest_;
  int64_t modified_unix_ = 0;
  std::unique_ptr<engine::Scheduler> scheduler_;  // last: stopped before the backend goes
};

}  // namespace deltaflow::server
