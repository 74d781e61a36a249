#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "backend/memory_plan.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_options.hpp"
#include "engine/pool_plan.hpp"
#include "io/safetensors.hpp"
#include "model/config.hpp"
#include "model/weight_summary.hpp"
#include "model/weights.hpp"

namespace deltaflow::cli {

namespace {

void print_bytes(const char* label, size_t bytes, const std::string& note) {
  std::printf("  %-18s %14llu bytes (%9.3f GB)%s\n", label, static_cast<unsigned long long>(bytes),
              static_cast<double>(bytes) / 1e9, note.c_str());
}

// The CUDA backend's plan at load for the engine a server would run with these flags (pool_plan.hpp sizes
// the pools, backend/memory_plan.hpp the bytes); GB are 1e9 bytes.
void print_memory_plan(const backend::MemoryPlanEstimate& p, const engine::PoolPlan& pools,
                       const engine::SchedulerOptions& o, const std::string& weights, double gpu_gb) {
  const long long len = static_cast<long long>(p.max_context);
  std::printf(
      "memory plan:    cuda backend, %d sequences of up to %lld positions, %s KV pages of %d positions, "
      "%s\n",
      o.max_num_seqs, len,
      p.kv_f32   ? "fp32"
      : p.kv_fp8 ? "fp8"
                 : "bf16",
      backend::kCudaPageSize, weights.c_str());
  print_bytes("weights:", p.weights, "");
  std::printf("  %-18s %14llu bytes\n",
              "kv per token:", static_cast<unsigned long long>(p.kv_bytes_per_token));
  print_bytes("kv cache:", p.kv,
              "  (" + std::to_string(p.kv_pages) + " pages: " + std::to_string(pools.running_pages) +
                  " running, " + std::to_string(pools.cache_pages) + " prefix cache, 1 scratch)");
  const int64_t pages_per_seq = (p.max_context + backend::kCudaPageSize - 1) / backend::kCudaPageSize;
  const long long held = static_cast<long long>(pools.running_pages / pages_per_seq);
  std::printf("  %-18s %lld sequence%s of %lld positions at once%s\n", "running pages hold:", held,
              held == 1 ? "" : "s", len, o.kv_cache_gb > 0 ? " (--kv-cache-gb)" : "");
  std::printf("  %-18s %14llu bytes\n",
              "state per seq:", static_cast<unsigned long long>(p.state_bytes_per_sequence));
  print_bytes("recurrent states:", p.states,
              "  (" + std::to_string(p.slots) + " slots: " + std::to_string(pools.running_slots) +
                  " running, " + std::to_string(pools.cache_slots) + " prefix-cache checkpoints, 1 scratch)");
  print_bytes("workspace:", p.workspace + p.gemm_workspace,
              "  (steps of up to " + std::to_string(std::max<int64_t>(o.max_num_batched_tokens, 4096)) +
                  " rows: activations, logits, cuBLASLt)");
  if (p.draft > 0)
    print_bytes("drafting:", p.draft, "  (--speculative-tokens: kept hidden rows, the MTP head's input)");
  print_bytes("total:", p.total(), "  (plus the CUDA context)");
  if (gpu_gb > 0) {
    const double cap = gpu_gb * 1e9;
    const bool fits = static_cast<double>(p.total()) <= cap;
    std::printf("  %-18s %s (%.3f GB of %.3f GB)\n", "fits:", fits ? "yes" : "no",
                static_cast<double>(p.total()) / 1e9, gpu_gb);
    // What the rest holds once the weights, the workspace and the prefix cache's share are in: full-length
    // sequences, each its pages and a state slot, and the --kv-cache-gb that gives their pages.
    const double page = static_cast<double>(p.kv_page_bytes + (p.draft > 0 ? p.draft_page_bytes : 0)),
                 slot = static_cast<double>(p.state_bytes_per_sequence);
    const double fixed = static_cast<double>(p.weights + p.workspace + p.gemm_workspace + p.draft) +
                         static_cast<double>(pools.cache_pages + 1) * page +
                         static_cast<double>(pools.cache_slots + 1) * slot;
    const double per_seq = static_cast<double>(pages_per_seq) * page + slot;
    const long long n = cap > fixed ? static_cast<long long>((cap - fixed) / per_seq) : 0;
    std::printf(
        "  %-18s %lld sequences of %lld positions (%.3f GB each: KV + recurrent state; "
        "--max-num-seqs %lld --kv-cache-gb %.2f)\n",
        "sequences that fit:", n, len, per_seq / 1e9, n,
        static_cast<double>(n * pages_per_seq) * page / static_cast<double>(1ull << 30));
  }
}

// The bound weights by format (elements and scales), each tensor's format with --tensors, and what one
// decoded token reads.
void print_weight_formats(const model::TextConfig& c, const model::ModelWeights& w, bool each) {
  std::printf("quantization:   %s\n",
              c.quant.quantized() ? (c.quant.summary + " (" + c.quant.where + ")").c_str() : "none");
  std::map<std::string, std::pair<size_t, uint64_t>> by_format;
  if (each) std::printf("weights:\n");
  model::for_each_weight(c, w, [&](const std::string& role, const model::Mat& m) {
    const std::string f = model::describe_format(m);
    auto& e = by_format[f];
    ++e.first;
    e.second += m.stored_bytes();
    if (each)
      std::printf("  %-48s %-52s [%lld, %lld] %llu bytes\n", (m.name ? *m.name : w.prefix + role).c_str(),
                  f.c_str(), static_cast<long long>(m.rows), static_cast<long long>(m.cols),
                  static_cast<unsigned long long>(m.stored_bytes()));
  });
  for (const auto& [name, e] : by_format)
    std::printf("  weights %-52s %5zu tensors, %llu bytes\n", name.c_str(), e.first,
                static_cast<unsigned long long>(e.second));
  const uint64_t per_token = model::bytes_per_decoded_token(c, w);
  const std::string experts = c.is_moe() ? ", " + std::to_string(c.num_experts_per_tok) + " of " +
                                               std::to_string(c.num_experts) + " experts"
                                         : "";
  std::printf("decode reads:   %llu bytes per token (%.3f GB; batch 1%s)\n",
              static_cast<unsigned long long>(per_token), static_cast<double>(per_token) / 1e9,
              experts.c_str());
}

}  // namespace

int cmd_inspect(const Argv& argv) {
  const std::string cmd = "inspect";
  // serve's engine flags that shape the memory (parse_engine_options reads them).
  auto args =
      Args::parse(argv, {{"--gpu-memory", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
                          "--kv-cache-gb", "--prefix-cache-gb", "--kv-cache-dtype"},
                         {"--exact", "--tensors", "--no-prefix-cache"},
                         1});
  if (!args) return fail(cmd, args.message());
  if (args->positionals().empty()) return fail(cmd, "missing DIR");
  const std::string dir = args->positionals()[0];
  auto config = model::load_text_config(dir);
  if (!config) return fail(cmd, config.message());
  // A folder with config.json and no weight files (the config alone, downloaded to plan before the weights):
  // the summary and the memory plan, counting bf16 weights.
  bool has_weights = false;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    has_weights = has_weights || e.path().extension() == ".safetensors";
  std::optional<io::Checkpoint> ck;
  std::optional<model::ModelWeights> w;
  if (has_weights) {
    auto opened = io::Checkpoint::open(dir);
    if (!opened) return fail(cmd, opened.message());
    ck = std::move(opened).value();
    auto bound = model::bind_weights(*config, *ck);
    if (!bound) return fail(cmd, bound.message());
    w = std::move(bound).value();
  }
  const auto& c = *config;
  auto eng = parse_engine_options(*args);
  if (!eng) return fail(cmd, eng.message());
  if (eng->max_model_len > c.max_position_embeddings)
    return fail(cmd, "flag --max-model-len " + std::to_string(eng->max_model_len) + " exceeds the model's " +
                         std::to_string(c.max_position_embeddings) + " positions (max_position_embeddings)");
  auto gpu_gb = args->get_double("--gpu-memory", 0.0);
  if (!gpu_gb) return fail(cmd, gpu_gb.message());
  if (*gpu_gb < 0) return fail(cmd, "flag --gpu-memory must be a positive number of GB");
  // The CUDA backend's plan for the engine these flags would start (engine/generate.cpp's load_backend).
  backend::MemoryPlanOptions plan_opt;
  plan_opt.max_context = eng->max_model_len;
  plan_opt.prefill_chunk = std::max<int64_t>(plan_opt.prefill_chunk, eng->max_num_batched_tokens);
  plan_opt.exact = args->has("--exact");
  plan_opt.kv_fp8 = eng->kv_cache_dtype == backend::KvCacheDtype::kFp8;
  plan_opt.matrix_dtype = w ? w->embed_tokens.dtype : core::DType::kBF16;
  if (w) plan_opt.module_prefix = w->prefix;
  // --speculative-tokens: the MTP head (when the checkpoint, or a config-only plan, has one) and its KV.
  plan_opt.mtp = eng->speculative_tokens > 0 && (w ? w->mtp.present : c.mtp_num_hidden_layers > 0);
  const auto unit = backend::estimate_memory_plan(c, plan_opt);
  engine::PoolGeometry geo;
  geo.model_len = unit.max_context;
  geo.page_size = backend::kCudaPageSize;
  geo.page_bytes = unit.kv_page_bytes + (plan_opt.mtp ? unit.draft_page_bytes : 0);
  geo.slot_bytes = unit.state_bytes_per_sequence;
  auto pools = engine::plan_pools(*eng, geo);
  if (!pools) return fail(cmd, pools.message());
  plan_opt.kv_pages = pools->kv_pages();
  plan_opt.state_slots = pools->state_slots();
  if (plan_opt.mtp) {
    plan_opt.draft_step_rows = eng->max_num_batched_tokens;
    plan_opt.draft_step_seqs = eng->max_num_seqs;
  }

  // The weights as the plan counts them: the stored float dtype, or the quantization's formats.
  std::string weights = std::string(core::dtype_name(plan_opt.matrix_dtype)) + " weights";
  if (c.quant.quantized())
    weights = "weights " + c.quant.summary + " (float modules " +
              std::string(core::dtype_name(plan_opt.matrix_dtype)) + ")";
  std::string pattern;
  for (auto t : c.layer_types) pattern += t == model::LayerType::kFullAttention ? 'F' : 'L';
  std::map<std::string, std::pair<size_t, uint64_t>> formats;  // dtype -> (tensors, bytes)
  uint64_t total_bytes = 0;
  if (ck)
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
  if (!w) {
    std::printf(
        "checkpoint:     config.json only (no .safetensors here): the plan counts %s\n",
        c.quant.quantized() ? "the quantization config's formats (float modules as bf16)" : "bf16 weights");
    print_memory_plan(backend::estimate_memory_plan(c, plan_opt), *pools, *eng, weights, *gpu_gb);
    return 0;
  }
  std::printf("parameters:     %lld (text model)\n", static_cast<long long>(w->parameter_count));
  std::printf("text bytes:     %llu\n", static_cast<unsigned long long>(w->bytes));
  std::printf("checkpoint:     %zu tensors, %llu bytes; vision tensors %zu\n", ck->tensors().size(),
              static_cast<unsigned long long>(total_bytes), w->visual_tensors.size());
  if (w->mtp.present) {
    std::printf("mtp head:       %lld parameters, %llu bytes (speculative decoding: --speculative-tokens)\n",
                static_cast<long long>(w->mtp.parameter_count),
                static_cast<unsigned long long>(w->mtp.bytes));
  } else if (!w->mtp_tensors.empty()) {
    std::printf("mtp head:       incomplete (%zu mtp.* tensors, no decoder layer): no drafting\n",
                w->mtp_tensors.size());
  } else {
    std::printf("mtp head:       none\n");
  }
  if (!w->tied_lm_head_tensors.empty())
    std::printf(
        "lm_head:        tied to the embedding (config.json); the checkpoint's %zu lm_head.* tensors "
        "(a quantized copy) are not used\n",
        w->tied_lm_head_tensors.size());
  for (const auto& [name, f] : formats)
    std::printf("  format %-8s %zu tensors, %llu bytes\n", name.c_str(), f.first,
                static_cast<unsigned long long>(f.second));
  print_weight_formats(c, *w, args->has("--tensors"));
  print_memory_plan(backend::estimate_memory_plan(c, plan_opt), *pools, *eng, weights, *gpu_gb);
  return 0;
}

}  // namespace deltaflow::cli
