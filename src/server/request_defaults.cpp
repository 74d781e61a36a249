#include "server/request_defaults.hpp"

#include <cstring>
#include <filesystem>

#include "io/json_file.hpp"

namespace deltaflow::server {

bool trained_to_think(const ServedModel& m) {
  if (m.think_start_id() < 0 || m.think_end_id() < 0) return false;
  const auto path = std::filesystem::path(m.dir()) / "generation_config.json";
  if (std::filesystem::exists(path)) {
    if (auto g = io::read_json_file(path.string()); g && g->is_object()) {
      if (auto it = g->find("enable_thinking"); it != g->end() && it->is_boolean()) return it->get<bool>();
    }
  }
  const std::string& t = m.chat_template_source();
  return t.find("enable_thinking") != std::string::npos || t.find("<think>") != std::string::npos;
}

RequestDefaults resolve_request_defaults(const ServedModel& m, std::optional<bool> enable_thinking,
                                         int64_t default_max_tokens) {
  RequestDefaults d;
  d.enable_thinking = enable_thinking ? *enable_thinking : trained_to_think(m);
  d.generation = m.defaults();
  if (default_max_tokens > 0)
    d.generation.max_tokens = default_max_tokens;
  else if (!d.generation.max_tokens && std::strcmp(m.device_name(), "cpu") == 0)
    d.generation.max_tokens = kCpuDefaultMaxTokens;
  return d;
}

}  // namespace deltaflow::server
