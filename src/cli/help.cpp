#include "cli/help.hpp"

#include <cstring>
#include <map>
#include <vector>

namespace deltaflow::cli {

namespace {

struct Flag {
  const char* name;  // "--model DIR"
  const char* text;  // what it does and its default
};

struct Help {
  const char* usage;
  const char* about;
  std::vector<Flag> flags;
};

const Flag kModel{"--model DIR", "checkpoint directory (default: models/house, or $DELTAFLOW_DEFAULT_MODEL)"};
const Flag kDevice{"--device cpu|cuda|auto",
                   "backend (default auto: CUDA when built with it and a GPU is seen)"};
const Flag kTp{"--tensor-parallel-size N", "split the model over N GPUs of this host (default 1)"};
const Flag kJson{"--json", "one JSON object on stdout instead of text"};
const Flag kAllowSpecial{
    "--allow-special-in-content",
    "parse special tokens (<|im_start|>, ...) written in message contents, tool results and "
    "names (default: they stay text)"};

std::vector<Flag> sampling_flags() {
  return {{"--temperature T", "0 (default) is greedy"},
          {"--top-k K", "keep the K most likely tokens (default 0: off)"},
          {"--top-p P", "nucleus sampling mass in (0, 1] (default 1: off)"},
          {"--min-p P", "drop tokens below P x the top probability (default 0: off)"},
          {"--presence-penalty X", "in [-2, 2] (default 0)"},
          {"--frequency-penalty X", "in [-2, 2] (default 0)"},
          {"--repetition-penalty X", "in (0, 10] (default 1: off)"},
          {"--seed S", "sampling seed (default 0)"}};
}

// The engine's flags (add_engine_flags in model_options.cpp).
std::vector<Flag> engine_flags() {
  return {
      {"--max-model-len N", "context length (default: the model's max_position_embeddings)"},
      {"--max-num-seqs N", "sequences running at once (default 16)"},
      {"--max-num-batched-tokens N",
       "tokens one engine step carries: decode rows + prompt chunks (default 2048)"},
      {"--kv-cache-gb GB", "KV memory (default: enough for max-num-seqs sequences of max-model-len)"},
      {"--prefix-cache-gb GB", "memory the prefix cache may hold (default 1)"},
      {"--no-prefix-cache", "no prefix cache"},
      {"--max-queue N", "requests waiting at most; more are refused (429 when serving; default 256)"},
      {"--kv-cache-dtype T",
       "KV storage: auto (the backend's: fp32 on the CPU, bf16 on CUDA), bf16, or fp8 (E4M3 + a scale per "
       "position and head: half the bytes; one GPU or the CPU)"},
      {"--speculative-tokens K",
       "draft up to K tokens a step with the checkpoint's MTP head, verified in one step (0..8; default 0: "
       "off)"}};
}

std::vector<Flag> join(std::vector<Flag> a, const std::vector<Flag>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::map<std::string, Help>& table() {
  static const std::map<std::string, Help> t = {
      {"batch",
       {"deltaflow batch --input IN.jsonl --output OUT.jsonl [--resume] [--model DIR] ...",
        "Runs an OpenAI Batch file (lines of {custom_id, method, url, body}; url /v1/chat/completions or\n"
        "/v1/completions) through the engine and appends one result line per request to OUT, fsynced.\n"
        "--resume skips the custom_ids OUT already holds (repairing a torn last line).",
        {{"--input FILE", "requests, one JSON object per line (required)"},
         {"--output FILE", "results, appended (required; must not exist unless --resume)"},
         {"--resume", "continue an interrupted job: skip the custom_ids already in --output"},
         kModel,
         kDevice,
         kTp,
         {"--served-model-name NAME",
          "the name request bodies may give as \"model\" (default: the directory's)"},
         {"--max-model-len N", "context length (default: the model's)"},
         {"--max-queue N", "requests in flight in the engine at once (default 64)"},
         {"--default-max-tokens N", "max_tokens when a request gives none (default: as serve)"},
         {"--default-enable-thinking true|false", "chat thinking default (default: as serve)"},
         kAllowSpecial,
         {"--no-progress", "no progress bar even on a terminal"}}}},
      {"bench",
       {"deltaflow bench (--synthetic CONFIG.json | --model DIR) [options]",
        "GPU decode and prefill speed against measured rooflines (needs a CUDA build and a GPU).\n"
        "With --requests N: the serving benchmark through the engine ('deltaflow bench --requests --help');\n"
        "with --images N: the vision encoder ('deltaflow bench --images --help');\n"
        "with --gemv FORMATS: the decode matmul alone ('deltaflow bench --gemv --help').",
        {{"--synthetic CONFIG.json", "random weights in the shape of this config.json"},
         {"--model DIR", "a real checkpoint instead"},
         {"--batches LIST", "decode batch sizes (default 1,8,32)"},
         {"--contexts LIST", "decode context lengths (default 512,8192,32768)"},
         {"--prefill LIST", "prefill lengths (default 512,8192,32768)"},
         {"--steps N", "decode steps timed per point (default 24)"},
         {"--seed S", "weights seed for --synthetic (default 1)"},
         {"--prefill-chunk N", "prefill chunk in tokens (default 4096)"},
         {"--kv-cache-dtype T", "auto / bf16 (the default) or fp8 KV cache"},
         {"--quant F", "synthetic quantized weights: nvfp4, fp8-block or nvfp4-mixed (dense or MoE)"},
         {"--weight-only",
          "prefill FP8 matrices that have a static input_scale with 16-bit activations, as the CPU reference "
          "(default: their activations quantized to FP8 by that scale, as the checkpoint asks)"},
         kTp,
         {"--no-graphs", "decode without CUDA graphs"},
         {"--profile", "GPU time per op (graphs off)"},
         kJson}}},
      {"bench --requests",
       {"deltaflow bench --requests N (--synthetic CONFIG.json | --model DIR) [options]",
        "The serving benchmark: N requests straight to the engine (any backend; rooflines on CUDA).",
        join({{"--requests N", "requests submitted (this mode)"},
              {"--synthetic CONFIG.json", "random weights in the shape of this config.json (CUDA)"},
              {"--model DIR", "a real checkpoint instead"},
              kDevice,
              kTp,
              {"--input-len L", "random prompt tokens per request (default 512)"},
              {"--output-len M", "tokens generated per request, no early stop (default 128)"},
              {"--max-concurrency C", "requests in flight at most (default N)"},
              {"--prefix-hit K", "then TTFT of a cached K-token prefix + 50 new tokens"},
              {"--accept-rates P1,P2,..",
               "with --speculative-tokens: accept draft position k in a share Pk of verification steps "
               "whatever the model draws (timing at a fixed acceptance profile; the tokens are not the "
               "model's)"},
              {"--seed S", "prompts (and --synthetic weights) seed (default 1)"},
              {"--profile", "with --synthetic: GPU time per op over the run, per step (graphs off)"},
              kJson},
             engine_flags())}},
      {"bench --images",
       {"deltaflow bench --images N [--image-size HxW] [--model DIR] [--device D] [--json]",
        "The vision encoder: one synthetic image through the image processor, then the encoder alone and N "
        "copies in one call (images per second).",
        {{"--images N", "images encoded together (this mode; default 16)"},
         {"--image-size HxW", "the image in pixels before the processor resizes it (default 1024x1024)"},
         kModel,
         kDevice,
         kJson}}},
      {"bench --gemv",
       {"deltaflow bench --gemv FORMATS [--shapes NxK,...] [--rows LIST] [--experts E] [--iters N] [--json]",
        "The decode matmul alone: y = x @ W.T for a few rows, in each weight format, as a weight stream "
        "against the copy bandwidth measured in the same run (copies of W cycled past the L2 cache).",
        {{"--gemv FORMATS", "nvfp4, fp8-block and/or bf16, comma-separated (this mode)"},
         {"--shapes NxK,...",
          "matrix shapes, N output rows (multiple of 16) by K (of 64); default "
          "17408x5120,5120x17408 (the 27B MLP)"},
         {"--rows LIST",
          "activation rows per call, at most 32; with --experts routed slots, at most 2048 "
          "(default 1,4,8)"},
         {"--experts E",
          "E stacked experts of each shape (nvfp4, fp8-block): --rows routed slots of one token, each to "
          "another expert, in one grouped GEMV (the MoE decode's form)"},
         {"--iters N", "calls timed per round, median of 5 rounds (default 100)"},
         kJson}}},
      {"chat",
       {"deltaflow chat [--model DIR] [--system TEXT] [options]",
        "Interactive chat with the model's chat template. Ctrl-C ends the turn, Ctrl-D or /exit quits.",
        join({kModel,
              kDevice,
              {"--system TEXT", "system prompt"},
              {"--enable-thinking true|false", "let the model think first (default false)"},
              {"--max-tokens N", "tokens per answer at most (default 1024)"},
              kAllowSpecial},
             join(sampling_flags(), engine_flags()))}},
      {"eval",
       {"deltaflow eval [--model DIR] (--ids 1,2,3,... | --text FILE [--window N]) [--reference DIR] "
        "[--emulate-activation-quant] [--json]",
        "Teacher-forced scoring: total NLL (nats), perplexity and per-token log-probabilities; with "
        "--reference, the NLL difference per scored token against a second model (a quantized checkpoint "
        "against its float original).",
        join({kModel,
              kDevice,
              kTp,
              {"--ids LIST", "token ids to score; logprobs[i] = log p(ids[i+1] | ids[0..i])"},
              {"--text FILE", "a text file, tokenized with the model's tokenizer"},
              {"--window N", "--text: non-overlapping windows of N tokens (default: the model's context)"},
              {"--reference DIR",
               "also score the same windows with the model in DIR (same vocabulary and tokenizer; loaded "
               "after the first is freed): delta_nll_per_token = (nll - reference nll) / tokens"},
              {"--emulate-activation-quant",
               "--device cpu: quantize the inputs of FP8 matrices with a static input_scale (W8A8) to "
               "E4M3 as the checkpoint asks, e4m3(x / input_scale) * input_scale, clamped to +-448 "
               "(default: weight-only, activations fp32)"},
              kJson},
             engine_flags())}},
      {"generate",
       {"deltaflow generate [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3) [options]",
        "One completion of raw text (streamed to stdout) or of token ids.",
        join({kModel,
              kDevice,
              kTp,
              {"--prompt TEXT", "the prompt as text"},
              {"--prompt-ids LIST", "the prompt as token ids"},
              {"--max-tokens N", "tokens to generate at most (default 32)"},
              {"--ignore-eos", "do not stop at the end-of-sequence tokens"},
              {"--json", "print {\"ids\": [...], \"finish_reason\": ...}"}},
             join(sampling_flags(), engine_flags()))}},
      {"inspect",
       {"deltaflow inspect DIR [--max-num-seqs N] [--max-model-len N] [--kv-cache-gb GB] [--gpu-memory GB] "
        "...",
        "Architecture, layer pattern, parameter count, tensor formats and bytes, and the CUDA memory plan "
        "that "
        "serve with the same engine flags would make.",
        {{"--max-num-seqs N", "running sequences (serve's flag; default 16)"},
         {"--max-model-len N", "positions per sequence (default: the model's, capped at 32768)"},
         {"--kv-cache-gb GB", "KV pages for the running sequences (default: what they need, up to 4 GiB)"},
         {"--prefix-cache-gb GB", "the prefix cache's share (default 1)"},
         {"--no-prefix-cache", "no prefix cache"},
         {"--max-num-batched-tokens N", "tokens per step: sizes the workspace"},
         {"--gpu-memory GB", "GPU memory to plan for: whether it fits, and how many sequences do"},
         {"--kv-cache-dtype T", "auto / bf16 (default) or fp8: E4M3 KV pages at about half the bytes"},
         {"--exact", "the exact mode's fp32 KV and activations"},
         {"--tensors", "list every tensor with its format and bytes"}}}},
      {"make-tiny",
       {"deltaflow make-tiny --preset dense|moe|tied|multimodal|next|vl|long|moe64 --seed N --out DIR",
        "Writes a random-weight checkpoint in the real architecture (same seed, same bytes).",
        {{"--preset NAME", "dense, moe, tied, multimodal, next, vl, long or moe64 (required)"},
         {"--seed N", "weights seed (default 0)"},
         {"--out DIR", "output directory (required)"}}}},
      {"quantize",
       {"deltaflow quantize --model DIR --out DIR --format fp8-block|nvfp4|nvfp4-mixed "
        "[--method exact|mse|gptq] [--calibration FILE]",
        "Writes a quantized checkpoint in the published layout (Qwen's FP8 block-128, ModelOpt's NVFP4 and\n"
        "MIXED_PRECISION), with the config and tokenizer files copied; our loader and transformers both read "
        "it.",
        {{"--model DIR", "the BF16 / F16 / F32 checkpoint to quantize (required)"},
         {"--out DIR", "output directory (required)"},
         {"--format NAME",
          "fp8-block, nvfp4 (W4A16), or nvfp4-mixed (FP8 W8A8 attention projections, W4A16 MLP and lm_head; "
          "required)"},
         {"--method NAME",
          "exact (default: ModelOpt 0.47's recipe, bit-identical), mse (scale search: each block scale, and "
          "the global one, chosen for the lowest squared error of the weights), or gptq (GPTQ error "
          "compensation over the calibration inputs, with searched scales; needs --calibration; the most "
          "accurate). The layout is the same for all three"},
         {"--calibration FILE",
          "nvfp4-mixed's input scales, and --method gptq's input statistics: text (512-token windows, 32 "
          "at most) or {\"ids\": [[...]]} .json (default: 4 seeded random windows)"}}}},
      {"serve",
       {"deltaflow serve [--model DIR] [--host H] [--port N] [options]",
        "OpenAI- and Ollama-compatible HTTP server, with a chat page at /.",
        join(
            {kModel,
             kDevice,
             kTp,
             {"--host H", "address to listen on (default 127.0.0.1; others need --api-key)"},
             {"--port N", "port (default 8000; 0: any free port)"},
             {"--api-key KEY", "require 'Authorization: Bearer KEY'"},
             {"--api-key-file F", "the key, read from a file"},
             {"--insecure-no-auth", "allow a non-loopback --host without a key"},
             kAllowSpecial,
             {"--served-model-name NAME", "the model's name in the API (default: the directory's name)"},
             {"--max-request-bytes N", "request bodies larger get 413 (default 8 MiB)"},
             {"--max-body-bytes N", "the older name of --max-request-bytes"},
             {"--max-tokens-limit N",
              "a request asking more than N tokens gets 400; defaults and Ollama's unlimited are capped to N "
              "(default 0: only the context limits)"},
             {"--allowed-local-media-path DIR",
              "image_url parts may name image files under DIR (file:// or a path; default: none)"},
             {"--max-image-pixels N", "images of more than N decoded pixels get 400 (default 0: 89,478,485)"},
             {"--limit-mm-per-prompt N", "requests with more than N images get 400 (default 16)"},
             {"--max-connections N", "more open connections than N get 503 at once (default 1024)"},
             {"--header-timeout S",
              "a request's head must arrive within S seconds, else 408 and the connection closes (default "
              "10)"},
             {"--body-timeout S", "its body within S seconds after the head, else 408 (default 60)"},
             {"--keep-alive-timeout S",
              "an idle connection closes after S seconds (default 30: longer than clients keep idle "
              "connections, e.g. httpx 5 s, so a client never reuses one the server is closing)"},
             {"--shutdown-timeout S",
              "on SIGTERM/SIGINT, seconds running requests may take to finish before they are aborted "
              "(finish_reason \"abort\"; default 30)"},
             {"--default-max-tokens N",
              "max_tokens when a request gives none (default: generation_config's max_new_tokens, else 512 "
              "on "
              "the CPU backend, else the rest of the context)"},
             {"--default-enable-thinking true|false",
              "chat thinking when a request does not say (default: from the model directory; see README)"},
             {"--allowed-origins LIST",
              "comma-separated browser origins allowed by CORS, or * (default: none)"},
             {"--enable-test-hooks", "accept deltaflow_forced_tokens in requests (tests only)"},
             {"--quiet", "no line per request on stderr"}},
            engine_flags())}},
      {"tokenize",
       {"deltaflow tokenize --model DIR (--file F | TEXT | --chat F.json [--chat-template FILE]) [--json]",
        "Token ids of a text, or of a conversation rendered by the chat template.",
        {kModel,
         {"--file F", "tokenize this file's bytes"},
         {"--chat F.json", "a JSON list of messages (or {messages, tools, ...}) rendered by the template"},
         {"--chat-template FILE", "--chat: use this Jinja template instead of the model's"},
         kJson}}},
  };
  return t;
}

}  // namespace

bool wants_help(int argc, char** argv) {
  for (int i = 0; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  return false;
}

bool print_help(const std::string& command, FILE* to) {
  auto it = table().find(command);
  if (it == table().end()) return false;
  const Help& h = it->second;
  std::fprintf(to, "usage: %s\n\n%s\n\noptions:\n", h.usage, h.about);
  for (const auto& f : h.flags) {
    if (std::strlen(f.name) < 30)  // at least two spaces before the text
      std::fprintf(to, "  %-30s %s\n", f.name, f.text);
    else
      std::fprintf(to, "  %s\n  %-30s %s\n", f.name, "", f.text);
  }
  std::fprintf(to, "  %-30s %s\n", "-h, --help", "this help");
  return true;
}

}  // namespace deltaflow::cli
