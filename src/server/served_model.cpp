#include "server/served_model.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/json_file.hpp"
#include "io/safetensors.hpp"

namespace deltaflow::server {

namespace fs = std::filesystem;

namespace {

std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return std::nullopt;
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A stable 64-hex-digit fingerprint of the checkpoint (config.json and the weight files' names and sizes),
// for the Ollama "digest" fields. Not a content hash: hashing gigabytes at start-up would cost too much.
std::string fingerprint(const std::string& seed) {
  uint64_t h[4] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9e3779b97f4a7c15ull,
                   0xbf58476d1ce4e5b9ull};
  for (unsigned char c : seed)
    for (int i = 0; i < 4; ++i) h[i] = (h[i] ^ (c + static_cast<uint64_t>(i))) * 0x100000001b3ull;
  char buf[65];
  for (int i = 0; i < 4; ++i)
    std::snprintf(buf + 16 * i, 17, "%016llx", static_cast<unsigned long long>(h[i]));
  return std::string(buf, 64);
}

}  // namespace

ServedModel::~ServedModel() {
  if (scheduler_) scheduler_->stop();
}

core::Expected<std::unique_ptr<ServedModel>> ServedModel::load(const ModelLoadOptions& o) {
  std::unique_ptr<ServedModel> m(new ServedModel());
  m->dir_ = o.model_dir;
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(o.model_dir, ec);
  if (ec) dir = o.model_dir;
  m->name_ = o.served_name.empty() ? dir.filename().string() : o.served_name;
  if (m->name_.empty()) m->name_ = "model";

  DF_ASSIGN(m->backend_,
            engine::load_backend(o.model_dir, o.device, o.tensor_parallel, engine::load_limits(o.engine)));
  if (!m->backend_->vision()) {
    m->vision_error_ = m->backend_->vision_error();
  } else if (auto pc = vision::load_processor_config(o.model_dir); !pc) {
    m->vision_error_ = pc.message();
  } else {
    m->processor_ = *pc;
  }
  DF_ASSIGN(auto tok, text::Tokenizer::load(o.model_dir));
  m->tokenizer_.emplace(std::move(tok));

  // The chat template, found and given its special tokens the way transformers does; a model without one
  // still serves /v1/completions.
  if (auto t = text::ChatTemplate::load(o.model_dir)) {
    std::string source;
    if (auto sel = t->select(false, &source)) {
      m->chat_template_source_ = source;
      m->xml_tools_ =
          source.find("<function=") != std::string::npos || source.find("<tool_call>") == std::string::npos;
    }
    m->chat_template_.emplace(std::move(*t));
  } else {
    // No template is fine (completions still work); a template that is there but broken is not.
    const auto tc = read_text(dir / "tokenizer_config.json");
    if (fs::exists(dir / "chat_template.jinja") || (tc && tc->find("\"chat_template\"") != std::string::npos))
      return core::Error{o.model_dir + ": chat template: " + t.message()};
  }

  // Stop ids: config.json's eos ids, generation_config.json's, and the tokenizer's eos token.
  for (auto id : m->backend_->config().eos_token_ids) m->eos_ids_.push_back(static_cast<int32_t>(id));
  if (fs::exists(dir / "generation_config.json")) {
    DF_ASSIGN(auto g, io::read_json_file((dir / "generation_config.json").string()));
    auto num = [&](const char* k) -> std::optional<double> {
      if (g.is_object() && g.contains(k) && g[k].is_number()) return g[k].get<double>();
      return std::nullopt;
    };
    GenerationDefaults& d = m->defaults_;
    if (auto v = num("temperature")) d.temperature = static_cast<float>(*v);
    if (auto v = num("top_p")) d.top_p = static_cast<float>(*v);
    if (auto v = num("top_k")) d.top_k = static_cast<int>(*v);
    if (auto v = num("min_p")) d.min_p = static_cast<float>(*v);
    if (auto v = num("repetition_penalty")) d.repetition_penalty = static_cast<float>(*v);
    if (auto v = num("presence_penalty")) d.presence_penalty = static_cast<float>(*v);
    if (auto v = num("frequency_penalty")) d.frequency_penalty = static_cast<float>(*v);
    if (auto v = num("max_new_tokens")) d.max_tokens = static_cast<int64_t>(*v);
    // HF semantics: do_sample false means greedy, whatever the temperature says.
    if (g.is_object() && g.contains("do_sample") && g["do_sample"].is_boolean() &&
        !g["do_sample"].get<bool>())
      d.temperature = 0.0f;
    if (g.is_object() && g.contains("eos_token_id")) {
      const auto& e = g["eos_token_id"];
      if (e.is_number_integer()) m->eos_ids_.push_back(e.get<int32_t>());
      if (e.is_array())
        for (const auto& x : e)
          if (x.is_number_integer()) m->eos_ids_.push_back(x.get<int32_t>());
    }
  }
  if (auto id = m->tokenizer_->eos_token_id()) m->eos_ids_.push_back(*id);
  std::sort(m->eos_ids_.begin(), m->eos_ids_.end());
  m->eos_ids_.erase(std::unique(m->eos_ids_.begin(), m->eos_ids_.end()), m->eos_ids_.end());

  if (auto id = m->tokenizer_->token_to_id("<think>")) m->think_start_ = *id;
  if (auto id = m->tokenizer_->token_to_id("</think>")) m->think_end_ = *id;
  if (auto id = m->tokenizer_->token_to_id("<|im_end|>")) m->message_end_ = *id;
  if (!o.allow_special_in_content) m->literal_tokens_ = m->tokenizer_->special_token_texts();

  const int64_t model_len = m->backend_->config().max_position_embeddings;
  if (o.engine.max_model_len > model_len)
    return core::Error{"--max-model-len " + std::to_string(o.engine.max_model_len) + " exceeds the model's " +
                       std::to_string(model_len) + " positions (max_position_embeddings)"};

  // Facts for /api/show and /api/tags.
  std::string seed;
  if (auto c = read_text(dir / "config.json")) seed = *c;
  if (auto ck = io::Checkpoint::open(o.model_dir)) {
    for (const auto& t : ck->tensors()) m->parameters_ += t.numel();
  }
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") {
      const auto size = e.file_size(ec);
      m->weight_bytes_ += size;
      seed += e.path().filename().string() + ":" + std::to_string(size) + ";";
    }
  }
  m->digest_ = fingerprint(seed);
  auto mtime = fs::last_write_time(dir / "config.json", ec);
  if (!ec)
    m->modified_unix_ = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::file_clock::to_sys(mtime).time_since_epoch())
                            .count();

  DF_ASSIGN(m->scheduler_, engine::Scheduler::start(*m->backend_, o.engine));
  m->max_model_len_ = m->scheduler_->max_model_len();
  return m;
}

bool ServedModel::matches(const std::string& requested) const {
  if (requested == name_) return true;
  constexpr std::string_view kLatest = ":latest";
  return requested.size() > kLatest.size() && requested.ends_with(kLatest) &&
         requested.substr(0, requested.size() - kLatest.size()) == name_;
}

core::Expected<text::RenderedChat> ServedModel::render_chat(const Json& messages, const Json& tools,
                                                            bool add_generation_prompt,
                                                            const Json& kwargs) const {
  if (!chat_template_) return core::Error{"the model has no chat template"};
  text::ChatRenderOptions ro;
  ro.add_generation_prompt = add_generation_prompt;
  ro.tools = tools;
  ro.kwargs = kwargs;
  ro.literal_tokens = literal_tokens_;
  return text::render_chat_spans(*chat_template_, messages, ro);
}

}  // namespace deltaflow::server
