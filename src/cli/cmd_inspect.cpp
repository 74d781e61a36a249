#include <cstdio>
#include <map>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "io/safetensors.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

namespace deltaflow::cli {

int cmd_inspect(const Argv& argv) {
  const std::string cmd = "inspect";
  auto args = Args::parse(argv, {{}, {}, 1});
  if (!args) return fail(cmd, args.message());
  if (args->positionals().empty()) return fail(cmd, "missing DIR");
  const std::string dir = args->positionals()[0];
  auto config = model::load_text_config(dir);
  if (!config) return fail(cmd, config.message());
  auto ck = io::Checkpoint::open(dir);
  if (!ck) return fail(cmd, ck.message());
  auto w = model::bind_weights(*config, *ck);
  if (!w) return fail(cmd, w.message());
  const auto& c = *config;

  std::string pattern;
  for (auto t : c.layer_types) pattern += t == model::LayerType::kFullAttention ? 'F' : 'L';
  std::map<std::string, std::pair<size_t, uint64_t>> formats;  // dtype -> (tensors, bytes)
  uint64_t total_bytes = 0;
  for (const auto& t : ck->tensors()) {
    auto& f = formats[std::string(core::dtype_name(t.dtype))];
    ++f.first;
    f.second += t.nbytes;
    total_bytes += t.nbytes;
  }
  std::printf("model:          %s\n", dir.c_str());
  std::printf("architecture:   %s (model_type %s%s)\n", model::architecture_name(c.architecture),
              c.model_type.c_str(), c.multimodal_layout ? ", multimodal layout" : "");
  std::printf("layers:         %lld (%lld linear_attention + %lld full_attention)\n",
              static_cast<long long>(c.num_hidden_layers),
              static_cast<long long>(c.count_layers(model::LayerType::kLinearAttention)),
              static_cast<long long>(c.count_layers(model::LayerType::kFullAttention)));
  std::printf("layer pattern:  %s  (L = Gated DeltaNet, F = gated full attention)\n", pattern.c_str());
  std::printf(
      "hidden:         %lld, vocab %lld, heads %lld/%lld x %lld, linear heads k%lld/v%lld x %lld/%lld\n",
      static_cast<long long>(c.hidden_size), static_cast<long long>(c.vocab_size),
      static_cast<long long>(c.num_attention_heads), static_cast<long long>(c.num_key_value_heads),
      static_cast<long long>(c.head_dim), static_cast<long long>(c.linear_num_key_heads),
      static_cast<long long>(c.linear_num_value_heads), static_cast<long long>(c.linear_key_head_dim),
      static_cast<long long>(c.linear_value_head_dim));
  if (c.is_moe())
    std::printf("moe:            %lld experts, top-%lld, expert FFN %lld, shared expert %lld\n",
                static_cast<long long>(c.num_experts), static_cast<long long>(c.num_experts_per_tok),
                static_cast<long long>(c.moe_intermediate_size),
                static_cast<long long>(c.shared_expert_intermediate_size));
  else
    std::printf("ffn:            SwiGLU %lld\n", static_cast<long long>(c.intermediate_size));
  std::printf("embeddings:     %s\n", c.tie_word_embeddings ? "tied" : "untied lm_head");
  std::printf("parameters:     %lld (text model)\n", static_cast<long long>(w->parameter_count));
  std::printf("text bytes:     %llu\n", static_cast<unsigned long long>(w->bytes));
  std::printf("checkpoint:     %zu tensors, %llu bytes; mtp tensors %zu, vision tensors %zu\n",
              ck->tensors().size(), static_cast<unsigned long long>(total_bytes), w->mtp_tensors.size(),
              w->visual_tensors.size());
  for (const auto& [name, f] : formats)
    std::printf("  format %-8s %zu tensors, %llu bytes\n", name.c_str(), f.first,
                static_cast<unsigned long long>(f.second));
  return 0;
}

}  // namespace deltaflow::cli
