// The one seam between the engine and the compute backends (docs/architecture.md §3): a step over a ragged
// batch. The engine owns every sequence's memory: it hands each sequence a recurrent-state slot and the KV
// pages of its full-attention layers out of pools the backend allocated once, at load, and names them in each
// step. A step carries decode rows (one token of a sequence) and prefill chunks (many tokens of one sequence)
// together, each with its start position.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.hpp"
#include "model/config.hpp"
#include "model/mrope.hpp"
#include "model/vision_config.hpp"

namespace deltaflow::backend {

// How one sequence's next token is drawn (DESIGN.md §5; host reference: backend/host_sampling.hpp). `seed`
// and `step` key the counter-based draw (core/philox.hpp), so the same seed gives the same tokens alone or
// in a batch.
struct TokenCount {
  int32_t id = 0;
  int32_t count = 0;  // times generated
};

struct SamplingSpec {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  uint64_t step = 0;                      // index of the token being drawn in its sequence
  std::span<const TokenCount> generated;  // distinct generated ids (presence / frequency / repetition)
  std::span<const int32_t> prompt_seen;   // sorted distinct prompt ids (repetition only)
  // OpenAI logit_bias: added to the logits after the penalties. The CUDA kernel has none: a backend draws
  // such rows from host logits with the reference (host_sampling.hpp).
  std::span<const std::pair<int32_t, float>> logit_bias;

  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
  bool is_plain_greedy() const { return temperature <= 0.0f && !has_penalties(); }
};

// What the KV cache holds (`--kv-cache-dtype`). kAuto: the backend's own (fp32 on the CPU, bf16 on CUDA).
// kBf16: values rounded to bf16. kFp8: E4M3 with an fp32 scale per (position, KV head) written with the
// position: scale = amax over its head_dim values / 448, code = E4M3(x / scale) rounded to nearest even,
// read back as code * scale (backend/kv_quant.hpp, the reference the kernels follow).
enum class KvCacheDtype : uint8_t { kAuto, kBf16, kFp8 };
const char* kv_cache_dtype_name(KvCacheDtype d);

// What the engine asks a backend to allocate (one memory plan, at load).
struct PoolRequest {
  int64_t kv_pages = 0;       // KV pages of all full-attention layers together (a page: page_size positions)
  int32_t state_slots = 0;    // conv + Gated DeltaNet states: running sequences and prefix checkpoints
  int64_t max_step_rows = 0;  // tokens one step may carry
  int32_t max_step_seqs = 0;  // sequences one step may carry
  // Speculative decoding: pages also hold the MTP layer's KV (draft_page_bytes() more each), and each step
  // keeps its rows' final hidden states for draft().
  bool draft = false;
};

// What a backend allocated.
struct Pools {
  int32_t page_size = 16;  // positions per KV page (a power of two)
  int64_t kv_pages = 0;
  int32_t state_slots = 0;
  int64_t max_step_rows = 0;
  int32_t max_step_seqs = 0;
  int64_t max_context = 0;  // positions one sequence may hold (before allocate: the backend's cap, 0 if none)
  // Whether KV lives in the engine's pages (shared by reference between sequences, copied by copy_pages) and
  // states can be copied between slots. False for a backend that keeps each sequence's KV with its state slot
  // (no prefix cache there).
  bool paged = true;
  size_t page_bytes = 0;  // one KV page of every full-attention layer (keys and values)
  size_t slot_bytes = 0;  // one state slot of every linear-attention layer
};

// Which logits rows of a run come back.
enum class RunLogits : uint8_t { kNone, kLast, kAll };

// After the first `rows` rows of its run, the sequence's recurrent state is also written to `slot` (a prefix
// checkpoint, or a speculative rollback point).
struct StateSnapshot {
  int32_t rows = 0;
  int32_t slot = -1;
};

// One sequence's rows in a step: tokens[first_row, first_row + n_rows) at positions start_pos + i.
struct SeqRun {
  int32_t first_row = 0, n_rows = 0;
  int64_t start_pos = 0;  // tokens the sequence's state and KV already hold; 0 starts from a zero state
  int32_t state_slot = -1;
  // Block table: page i holds positions [i * page_size, (i + 1) * page_size); it covers start_pos + n_rows.
  std::span<const int32_t> kv_pages;
  RunLogits logits = RunLogits::kLast;
  const SamplingSpec* sample = nullptr;      // draw the token after the run's last row
  std::span<const StateSnapshot> snapshots;  // ascending rows, each in [1, n_rows]
  // Images (a run of a sequence whose prompt has them; empty for text-only runs, which are unchanged):
  // - mrope_positions: each row's (t, h, w) rotary position, [n_rows * 3], in place of start_pos + i on all
  //   three axes (M-RoPE, model/mrope.hpp). Keys and values are still stored at start_pos + i.
  // - embed_rows (ascending indices within the run) take their input embedding from `embeds` (one hidden-size
  //   row each, the vision encoder's output) instead of their token's.
  std::span<const int64_t> mrope_positions;
  std::span<const int32_t> embed_rows;
  std::span<const float> embeds;
  bool has_images() const { return !mrope_positions.empty() || !embed_rows.empty(); }
};

struct Step {
  std::span<const int32_t> tokens;
  std::span<const SeqRun> runs;
};

struct StepOut {
  // Rows in run order: n_rows for kAll, 1 for kLast, none for kNone; each vocab_size floats.
  std::vector<float> logits;
  std::vector<int32_t> sampled;  // one per run: the drawn id, or -1 where the run had no SamplingSpec
};

// Drafting with the checkpoint's MTP head (qwen35-architecture.md §4) after a step. Row j of the run is row
// first_row + j of the last step: its final hidden state is paired with the token after it (the step's next
// row, or next_token after the last row), at position start_pos + j, and the MTP layer's KV for those
// positions is written to the pages (so a run over rows that were only computed, n_draft 0, keeps the head's
// cache in step with the sequence). Then n_draft tokens are drafted greedily: the first from the last row,
// each next one from the head's own output and the token it drafted, at the following positions (the pages
// must cover start_pos + n_rows + n_draft - 1).
struct DraftRun {
  int32_t first_row = 0, n_rows = 0;
  int64_t start_pos = 0;
  std::span<const int32_t> kv_pages;
  int32_t next_token = 0;
  int32_t n_draft = 0;
  RunLogits logits = RunLogits::kNone;  // the head's logits of the run's rows (evaluation)
};

struct DraftOut {
  std::vector<int32_t> tokens;  // n_draft per run, in run order
  std::vector<float> logits;    // rows asked for by DraftRun::logits, in run order
};

struct PageCopy {
  int32_t from = 0, to = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const model::TextConfig& config() const = 0;
  virtual const char* name() const = 0;

  // Bytes one KV page and one state slot take here, so the engine can size its request.
  virtual int32_t page_size() const = 0;
  virtual size_t page_bytes() const = 0;
  virtual size_t slot_bytes() const = 0;
  // Allocates the pools (once; a second call replaces them). Nothing is allocated per step after this.
  virtual core::Status allocate(const PoolRequest& request) = 0;
  virtual const Pools& pools() const = 0;

  // Runs the step. Every run's slot and pages must be distinct from the others' (pages shared by reference
  // are read only below start_pos).
  virtual core::Status step(const Step& step, StepOut& out) = 0;
  // The id `spec` draws from one row of logits, by the sampler step() draws its runs' tokens with (the GPU
  // one draws other ids than the host reference, from the same distribution). A speculative verification
  // draws its rows here, so that its tokens are those of decoding without speculation.
  virtual core::Expected<int32_t> draw(std::span<const float> row, const SamplingSpec& spec) = 0;

  // Copies a recurrent state (prefix checkpoints), and whole KV pages (copy on write of a shared partial
  // page).
  virtual core::Status copy_state(int32_t from_slot, int32_t to_slot) = 0;
  virtual core::Status copy_pages(std::span<const PageCopy> copies) = 0;

  // Speculative decoding (DraftRun): whether this backend and checkpoint can draft, the bytes the MTP layer's
  // KV adds to one page, and the draft itself (pools allocated with PoolRequest::draft).
  virtual bool can_draft() const { return false; }
  virtual size_t draft_page_bytes() const { return 0; }
  virtual core::Status draft(std::span<const DraftRun> runs, DraftOut& out) {
    (void)runs;
    out = {};
    return core::Error{std::string(name()) + " backend: drafting with the MTP head is not supported"};
  }

  // Images: the checkpoint's vision config when this backend can encode images with it (null otherwise, and
  // vision_error() says why: the backend, or the missing `model.visual.*` weights), and the encoder itself:
  // pixel values [sum of t*h*w, patch_dim] of the grids, image after image -> [sum of t*h*w / merge^2,
  // hidden_size] rows, one per image placeholder token. Called on the engine's encoder thread while step()
  // may be running on the engine thread.
  virtual const model::VisionConfig* vision() const { return nullptr; }
  virtual std::string vision_error() const {
    return std::string(name()) + " backend: images are not supported (no vision encoder here)";
  }
  virtual core::Expected<std::vector<float>> encode_images(std::span<const float> pixel_values,
                                                           std::span<const model::VisionGrid> grids) {
    (void)pixel_values;
    (void)grids;
    return core::Error{vision_error()};
  }
};

}  // namespace deltaflow::backend
