// The CUDA backend (DESIGN.md §3, §6): the same forward pass as backend/cpu, on one GPU. Weights are uploaded
// at load in the checkpoint's element type (projection groups concatenated: [q k v | z | b | a], [gate | up],
// ...); the KV cache, the recurrent states and every activation buffer are planned at load, so decode
// allocates nothing, and the decode step of each batch-size bucket is captured once as a CUDA graph.
//
// Numerics: activations are fp32. By default prefill matmuls over more than kGemvMaxRows rows go through
// cuBLASLt with the activations rounded to the weights' 16-bit type, and the KV cache is bf16. `exact` keeps
// fp32 into every matmul and an fp32 KV cache: the CPU reference's numbers to fp32 rounding (the tests use
// both).
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/gemm.hpp"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/gemv_quant.cuh"
#include "backend/cuda/op_profile.hpp"
#include "backend/memory_plan.hpp"
#include "backend/sequence_backend.hpp"
#include "core/dtype.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

namespace deltaflow::backend::cuda {

class Collective;

struct CudaOptions {
  int device = 0;
  int max_sequences = 4;         // sequences alive at once (state slots)
  int64_t max_context = 0;       // KV cache positions per sequence; 0: min(max_position_embeddings, 32768)
  int64_t prefill_chunk = 4096;  // a longer prompt runs in chunks of this many tokens
  bool exact = false;            // fp32 into every matmul and an fp32 KV cache
  // The KV cache as E4M3 codes with an fp32 scale per (position, kv head) (--kv-cache-dtype fp8): half the
  // bytes of bf16 per position. Not with exact.
  bool kv_fp8 = false;
  bool cuda_graphs = true;  // capture the decode step per batch-size bucket
  bool progress = false;    // a load progress bar on stderr (only when it is a terminal)
  // No per-sequence states or KV at load: the engine's pools come with allocate_pools (the step seam through
  // SequenceStepper); max_sequences is then unused.
  bool engine_pools = false;
  // Tensor parallelism (tp_backend.hpp): this backend is rank collective->rank() of world(), holds only its
  // slices of the weights (model/tensor_parallel.hpp) and all-reduces after the row-parallel matmuls.
  // nullptr: the whole model. Not owned; must outlive the backend.
  Collective* collective = nullptr;
  // synthetic() only: quantized random weights, "nvfp4", "fp8-block" or "nvfp4-mixed" (bench --quant); ""
  // bf16.
  std::string synthetic_quant;
  // FP8 block-128 weights: prefill chunks past the decode buckets on the block-scaled FP8 GEMM over
  // per-128-column quantized activations (false: widened to bf16 for cuBLASLt, activations in bf16).
  bool fp8_gemm = true;
  // FP8 weights with a static input_scale (W8A8: ModelOpt FP8, nvfp4-mixed's attention projections): prefill
  // chunks past the decode buckets quantize the activations with it, as the checkpoint asks and vLLM runs
  // them, and take the FP8 GEMM (false: widened to bf16, weight-only, as the CPU reference of record and the
  // decode GEMVs). Exact mode never does.
  bool fp8_static_activations = true;
  // Speculative decoding: upload the checkpoint's MTP head (mtp.*; synthetic(): random, when the config has
  // one) so that pools allocated with PoolRequest::draft can draft with it (cuda_mtp.cpp).
  bool mtp = false;
};

// A device matrix [rows, cols], row-major, in the checkpoint's element type; or quantized (NVFP4 or FP8 codes
// at data, their scales in q: backend/quant_pack.hpp), or a projection group whose members are kept apart
// (`parts`, their rows in order: members whose formats or scale grids differ).
// Rows a decode graph bucket holds at most (the largest bucket); steps past it are prefill.
inline constexpr int kDecodeMaxRows = 256;
// Prefill parts up to this many rows take their state snapshots from inside the token scan (RowSegment::
// row_snapshots; under the chunked kernel's kGdnChunkLen, so they always scan); longer ones split at them.
inline constexpr int64_t kRowSnapshotRows = 16;

struct WeightSource;  // cuda_weights.hpp

struct DMat {
  const void* data = nullptr;
  core::DType dtype = core::DType::kBF16;
  int64_t rows = 0, cols = 0;
  bool quantized = false;
  QuantWeight q;
  // FP8 with 128 x 128 block scales that prefill runs on cuBLASLt's block-scaled FP8 GEMM, activations
  // quantized per 128 columns (set at load, enable_fp8_gemms); otherwise widened to bf16 first.
  bool fp8_gemm = false;
  // FP8 whose checkpoint stores a static activation scale (PackedQuant::input_scale; else 0), and whether
  // prefill runs it on the same block-scaled FP8 GEMM with its activations quantized by that scale
  // (CudaOptions::fp8_static_activations; set at load, enable_fp8_gemms).
  float input_scale = 0.0f;
  bool fp8_static = false;
  std::vector<DMat> parts;
  size_t bytes() const { return static_cast<size_t>(rows * cols) * core::dtype_size(dtype); }
  // A plain matrix of one 16- or 32-bit type in one allocation (what the float kernels take).
  bool plain() const { return !quantized && parts.empty(); }
};

// One decoder layer on the device. Vectors are fp32.
struct DLayer {
  model::LayerType type = model::LayerType::kLinearAttention;
  bool is_moe = false;
  int64_t type_index = 0;       // n-th layer of its type (index into the state / KV stores)
  float* input_norm = nullptr;  // [H], (1+w)
  float* post_norm = nullptr;   // [H], (1+w)
  // Gated DeltaNet
  DMat in_proj;               // [conv_dim + vd + 2 nv, H]: rows [q k v (conv input) | z | b | a]
  float* conv_w = nullptr;    // [conv_dim, K]
  float* dt_bias = nullptr;   // [nv]
  float* A_log = nullptr;     // [nv]
  float* gdn_norm = nullptr;  // [dv], plain weight
  DMat out_proj;              // [H, vd]
  // Gated attention
  DMat qkv;                 // [nh*hd*(1+gated) + 2 nkv*hd, H]: rows [q_proj | k_proj | v_proj]
  float* q_norm = nullptr;  // [hd], (1+w)
  float* k_norm = nullptr;  // [hd], (1+w)
  DMat o_proj;              // [H, nh*hd]
  // Dense FFN
  DMat gate_up;  // [2I, H]: rows [gate | up]
  DMat down;     // [H, I]
  // MoE
  DMat router_gate;   // [E + 1, H]: rows [router | shared_expert_gate] (no data when their dtypes differ)
  DMat router;        // [E, H]: a view of router_gate's rows, or its own matrix
  DMat experts_gu;    // expert e at data + e * 2Im*H elements: [2Im, H] rows [gate | up]
  DMat experts_down;  // expert e at data + e * H*Im elements: [H, Im]
  DMat shared_gu;     // [2Is, H]
  DMat shared_down;   // [H, Is]
  DMat shared_gate;   // [1, H]: a view of router_gate's last row, or its own matrix
  // Quantized experts: the shared expert is expert E of the stacks (same shape and layout), shared_gu and
  // shared_down views of it, so that a decode step's grouped GEMVs run it with the routed experts.
  bool shared_in_stack = false;
};

// The checkpoint's MTP head on the device (speculative decoding, cuda_mtp.cpp; qwen35-architecture.md §4).
struct DMtp {
  bool present = false;
  float* norm_embedding = nullptr;  // [H], (1+w)
  float* norm_hidden = nullptr;     // [H], (1+w)
  DMat fc;                          // [H, 2H]: input [normed embedding | normed hidden]
  DLayer layer;                     // full attention (KV store n_full of a page); MoE FFN in MoE models
  float* norm = nullptr;            // [H], (1+w)
};

struct MemoryPlan {
  size_t weights = 0, kv = 0, states = 0, workspace = 0;
  size_t draft = 0;  // drafting buffers (allocate_pools with PoolRequest::draft)
  int slots = 0;     // state slots + 1 scratch slot (pads graph buckets)
  int64_t max_context = 0;
  bool kv_f32 = false;
  bool kv_fp8 = false;
  int64_t kv_pages = 0;  // paged (allocate_pools): KV pages + 1 scratch page; else 0
};

class CudaBackend;
class SamplingBatch;

class CudaSequenceState final : public SequenceState {
 public:
  ~CudaSequenceState() override;
  int64_t length() const override { return pos; }
  int slot = -1;  // -1: no slot was free
  int64_t pos = 0;
  CudaBackend* owner = nullptr;  // must outlive the state
};

class CudaBackend final : public SequenceBackend {
 public:
  // Opens DIR (config.json + safetensors) and uploads the weights.
  static core::Expected<std::unique_ptr<CudaBackend>> load(const std::string& dir,
                                                           const CudaOptions& opt = {});
  // Random weights of the config's shapes, filled on the GPU (benchmarks: speed does not depend on values).
  static core::Expected<std::unique_ptr<CudaBackend>> synthetic(const model::TextConfig& config,
                                                                const CudaOptions& opt, uint64_t seed);
  ~CudaBackend() override;

  const model::TextConfig& config() const override { return config_; }
  const char* name() const override { return "cuda"; }

  std::unique_ptr<SequenceState> new_sequence() override;
  int max_sequences() const override { return opt_.max_sequences; }
  int64_t max_context() const override { return plan_.max_context; }
  core::Status prefill(std::span<const PrefillItem> items, std::vector<float>& logits) override;
  core::Status decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                      std::vector<float>& logits) override;
  // decode with greedy sampling on the GPU: ids[i] = argmax of sequence i's next-token logits; no logits
  // cross to the host.
  core::Status decode_greedy(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                             std::vector<int32_t>& ids);
  // Sampling on the GPU (sampling.cuh): decode, then ids[i] drawn under specs[i]; or draws from host logits
  // rows (the token after a prefill). Plain greedy rows use decode_greedy's in-graph argmax.
  bool can_sample() const override { return true; }
  core::Status decode_sample(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                             std::span<const SamplingSpec> specs, std::vector<int32_t>& ids) override;
  core::Status sample_logits(std::span<const float> logits, std::span<const SamplingSpec> specs,
                             std::vector<int32_t>& ids) override;

  const MemoryPlan& memory_plan() const { return plan_; }
  const CudaOptions& options() const { return opt_; }
  double load_seconds() const { return load_seconds_; }
  uint64_t weight_bytes() const { return plan_.weights; }
  cudaStream_t stream() const { return stream_; }
  // Benchmarks only: make `s` claim `length` tokens without running them (the cache holds what it holds).
  core::Status set_length(SequenceState& s, int64_t length);

  void release_slot(int slot);

  // The engine's pools (cuda_pools.cpp): state slots and KV pages of kPageSize positions, each slot's KV
  // addressed through its block table (uploaded by bind where it changed). Not with tensor parallelism.
  static constexpr int32_t kPageSize = kCudaPageSize;  // memory_plan.hpp, what `inspect` plans with
  static constexpr int64_t kLogitRows = 256;           // lm_head rows per pass (the logits buffer)
  bool can_page() const override { return opt_.collective == nullptr; }
  bool prefill_snapshots() const override { return true; }
  // cuda_step.cpp: steps of several runs, or of prefill and decode rows together, that fit one pass.
  bool can_fuse(const Step& step) const override;
  core::Status fused_step(const Step& step, std::span<SequenceState* const> seqs, StepOut& out) override;
  int32_t kv_page_size() const override { return kPageSize; }
  size_t kv_page_bytes() const override;
  size_t state_slot_bytes() const override;
  core::Status allocate_pools(const PoolRequest& request, Pools& pools) override;
  core::Expected<SequenceState*> bind(int32_t slot, int64_t start_pos, int64_t end_pos,
                                      std::span<const int32_t> pages) override;
  core::Status copy_state(int32_t from_slot, int32_t to_slot) override;
  core::Status copy_pages(std::span<const PageCopy> copies) override;
  // Speculative decoding (cuda_mtp.cpp): the MTP head drafts as backend/cpu/mtp_head.cpp does, over the
  // final hidden rows each step keeps (pools allocated with PoolRequest::draft).
  static constexpr int32_t kMaxDraftTokens = 8;
  // Paged pools only (not with tensor parallelism).
  bool can_draft() const override;
  size_t draft_page_bytes() const override;
  void keep_rows(std::span<const int32_t> step_rows) override;
  core::Status draft_after(std::span<const DraftRun> runs, std::span<const int32_t> step_tokens,
                           DraftOut& out) override;

  // Benchmarks only: GPU time by op (bench --profile). Decode is profiled only with cuda_graphs off.
  OpProfile& profile() { return prof_; }
  // What the load-time GEMM tuning chose, shape by shape.
  const std::vector<GemmTuning>& gemm_tunings() const { return gemm_.tunings(); }

 private:
  CudaBackend() = default;
  core::Status init_device(const model::TextConfig& c, const CudaOptions& opt);
  // Allocates the weights (cuda_weights.hpp's layout, sized first) and fills them.
  core::Status place_weights(const WeightSource& src, uint64_t seed, bool progress);
  core::Status plan_memory();
  // (Re)allocates the states and the KV cache: `slots` state slots (the last one scratch), and the KV of
  // every slot contiguous (pages 0) or `pages` pages of kPageSize positions with a block table per slot.
  // draft_rows > 0 (paged, drafting): pages also hold the MTP layer's KV (store n_full), and the block tables
  // have draft_rows more rows, after the slots', one per run of a draft.
  core::Status allocate_states(int slots, int64_t pages, int draft_rows = 0);
  // Block-table row `row` = pages[0, need) (the entries that changed uploaded as one copy).
  core::Status set_table_row(int64_t row, std::span<const int32_t> pages, int64_t need);
  core::Status warm_up();
  core::Status capture_graphs();
  void destroy_graphs();

  // The KV cache of full-attention layer `type_index`.
  // Bytes of one KV element (fp32, bf16 or an fp8 code) and of all k (or v) codes of the cache.
  size_t kv_elem_bytes() const;
  size_t kv_code_bytes() const;
  KvCache kv_view(int64_t type_index) const;
  // A run of a forward pass's rows: decode rows (one token of each of `rows` sequences, slots in ws_.slot),
  // or consecutive tokens of one sequence's prefill in `slot`, after which its recurrent state is also
  // copied to `snapshot` (when >= 0) layer by layer, in the same pass. With row_snapshots, a short prefill
  // segment's rows each write the state after them to the slot ws_.snap holds for the row (-1: none), from
  // inside the token scan (a speculative verification: a snapshot after every row, one segment). With
  // short_runs, the rows are several sequences' short runs (`runs` of them; ws_.runs from runs_at lists their
  // first rows, ws_.run0 each row's run's first row, both from row0; slots per row in ws_.slot): one launch
  // each of the conv and the token scan for all of them, and attention as decode rows (each row sees its own
  // sequence's keys up to its position, all stored first).
  struct RowSegment {
    int64_t row0 = 0, rows = 0;
    bool decode = false;
    int slot = -1;
    int snapshot = -1;
    bool row_snapshots = false;
    bool short_runs = false;
    int runs = 0, runs_at = 0;
  };
  // Runs n tokens through the layers; ws_.ids/pos/slot hold their ids, positions and slots; `segs` cover
  // rows [0, n) in order. The matmuls take every row at once; the conv, the delta rule and attention run
  // segment by segment. Leaves the final-normed rows in ws_.xn.
  core::Status run_layers(int64_t n, std::span<const RowSegment> segs);
  // One decoder layer over ws_.h's n rows (h += y_prev first, unless null); leaves its output in ws_.y.
  core::Status run_layer(const DLayer& L, int64_t n, std::span<const RowSegment> segs, const float* y_prev);
  // Drafting: the pass's n final-normed rows (ws_.xn) kept at rows step_rows[0, n) of the step (a no-op
  // unless the pools draft and step_rows is given).
  core::Status keep_hidden(std::span<const int32_t> step_rows);
  // The MTP head over n staged rows (ws_.ids: the next tokens, ws_.pos, ws_.slot: block-table rows) with the
  // hidden rows they pair with in ws_.y; leaves h' (the head's normed output) in ws_.xn.
  core::Status mtp_pass(int64_t n, std::span<const RowSegment> segs);
  // Rows [row0, row0 + n) of a prefill of `slot` whose first row is token `off` of its run, as segments
  // split after each snapshot's rows (snapshot rows count from the run's first token); up to
  // kRowSnapshotRows rows with snapshots as one segment of row snapshots instead, their slots written to
  // row_snap[row0, row0 + n) (the pass's staging for ws_.snap). True when it did that.
  static bool append_prefill_segments(int64_t row0, int64_t off, int64_t n, int slot,
                                      std::span<const StateSnapshot> snaps, int* row_snap,
                                      std::vector<RowSegment>& segs);
  // row_snap[row0, row0 + n): the snapshot slot after each row of that part of a run (first row: token
  // `off`), -1 where none.
  static void fill_row_snapshots(int64_t row0, int64_t off, int64_t n, std::span<const StateSnapshot> snaps,
                                 int* row_snap);
  // What every entry point checks of its input: token ids inside the vocabulary; snapshots inside a run of
  // n rows of `slot` and inside the pool (not the scratch slot).
  core::Status check_ids(std::span<const int32_t> tokens) const;
  core::Status check_snapshots(std::span<const StateSnapshot> snaps, int64_t n, int slot) const;
  core::Status gated_deltanet(const DLayer& L, int64_t n, std::span<const RowSegment> segs);
  core::Status full_attention(const DLayer& L, int64_t n, std::span<const RowSegment> segs);
  core::Status ffn(const DLayer& L, int64_t n);
  core::Status moe(const DLayer& L, int64_t n);
  core::Status moe_quant(const DLayer& L, int64_t n);  // quantized routed experts
  // The step's nk slots sorted by expert on the device (moe_sort.cuh): sort_slot / sort_tok, and the list
  // of 64-row tiles of one expert (room entries; *n_live of them live) that the grouped kernels take.
  struct SortedSlots {
    GroupedTile* tiles = nullptr;
    int* n_live = nullptr;
    int room = 0;
  };
  core::Expected<SortedSlots> sort_slots_by_expert(int64_t nk);
  // After the routed experts; gate_up_done: the shared expert's gate/up already ran (into ws_.act).
  core::Status moe_shared_and_combine(const DLayer& L, int64_t n, bool gate_up_done = false);
  // y[T, W.rows] = x[T, W.cols] @ W^T: GEMV tiles of kGemvMaxRows rows, or cuBLASLt (see the header comment).
  // swiglu: W is [gate | up] and y receives silu(gate) * up ([T, W.rows / 2]); decode row counts only.
  // conv (T <= kGemvSimtRows only): the conv1d decode step as the GEMV's epilogue.
  core::Status linear(const float* x, int64_t ldx, int64_t T, const DMat& W, float* y, int64_t ldy,
                      bool force_fp32 = false, bool swiglu = false, const GemvConv& conv = {});
  // h += y (none: null), then the (1 + w) RMSNorm of h's n rows into ws_.xn; or, when `next` (the one matmul
  // that reads them) runs on cuBLASLt, straight into ws_.x16 in its type, which stage_x16 then finds there.
  // With `staged` (a quantized GEMV reads xn: next, or the MoE's quantized experts), xn's rows are staged
  // for it in the same pass (add_rmsnorm1p_staged), and stage_xq finds them there.
  core::Status add_norm(const float* y, int64_t n, const float* w, const DMat* next, bool staged = false);
  // ws_.xq / ws_.xq_factor = x [T, K] staged for a quantized GEMV, unless xq_holds_ says they are there.
  cudaError_t stage_xq(const float* x, int64_t ldx, int64_t T, int64_t K);
  // Whether `next`, a matmul over n rows of xn (or one of its parts), runs the quantized GEMV over one
  // staging of all n rows.
  bool reads_staged_rows(int64_t n, const DMat* next) const;
  // ws_.x16 = x [T, K] rounded to dtype, unless x16_holds_ says it is there already.
  cudaError_t stage_x16(const float* x, int64_t ldx, int64_t T, int64_t K, core::DType dtype);
  // Whether linear() over T rows of W runs cuBLASLt, on its input rounded to W's 16-bit type in ws_.x16.
  bool takes_gemm(int64_t T, const DMat& W) const;
  // The MoE router's logits of n rows as a bf16 GEMM over split activations (cuda_ffn.cpp); the GEMM's call.
  bool router_takes_gemm(const DLayer& L, int64_t n) const;
  GemmCall router_gemm_call(const DLayer& L, int64_t n) const;
  // The cuBLASLt call of linear() with its input already in W's type (x16: [T, W.cols] packed); y [T, ldy]
  // in fp32 or in W's type.
  GemmCall gemm_call(const void* x16, int64_t T, const DMat& W, void* y, core::DType y_type,
                     int64_t ldy) const;
  // The 16-bit type of cuBLASLt's input for W (bf16 for quantized weights: widened first, or, for FP8 GEMMs,
  // the bf16 activations quantize_fp8_1x128 reads).
  static core::DType gemm_type(const DMat& W) { return W.quantized ? core::DType::kBF16 : W.dtype; }
  // y = x16 @ W^T on cuBLASLt (gemm_call's), after what W's form needs first, enqueued on the stream: a
  // quantized W widened to bf16 into ws_.wdq, or, for an FP8 GEMM, x16 quantized into ws_.x8 (per 128
  // columns, or by the static input scale with the weight's grid as block scales in ws_.wdq; the padding
  // rows up to a multiple of 8 write y's rows past T: y holds max_rows_ rows).
  core::Status run_gemm(const void* x16, int64_t T, const DMat& W, void* y, core::DType y_type, int64_t ldy);
  // At load: marks each layer's FP8 matrix that cuBLASLt's block-scaled FP8 GEMM takes: block-scaled ones
  // (fp8_gemm) and, with CudaOptions::fp8_static_activations, those with a static input scale (fp8_static).
  void enable_fp8_gemms();
  // y = x @ W^T for a quantized W: GEMV tiles of kQuantGemvMaxRows rows over fp16 activations.
  core::Status linear_quant(const float* x, int64_t ldx, int64_t T, const DMat& W, float* y, int64_t ldy,
                            bool swiglu);
  // down(silu(gate(x)) * up(x)) of ws_.xn's n rows into y [n, H] through cuBLASLt in the weights' 16-bit type
  // end to end, when mlp_in_16bit (prefill); the marks (string literals) name its last two ops in the
  // profile.
  bool mlp_in_16bit(int64_t n, const DMat& gate_up, const DMat& down) const;
  core::Status mlp_16bit(int64_t n, const DMat& gate_up, const DMat& down, float* y, const char* swiglu_mark,
                         const char* down_mark);
  // At load: times cuBLASLt's candidates for every dense matmul at a whole prefill chunk (Gemm::tune).
  core::Status tune_gemms();
  // lm_head on xn rows [r0, r0 + rows) into ws_.logits (rows <= kLogitRows).
  core::Status lm_head(int64_t r0, int64_t rows);
  core::Status prefill_one(const PrefillItem& item, std::vector<float>& logits);
  // Uploads n staged rows (pinned_: ids, positions, slots; with snaps, pinned_snap()'s row snapshots; with
  // n_runs, the short runs' row lists pinned_run0() and pinned_runs()).
  core::Status upload_rows(int64_t n, bool snaps, int64_t n_runs = 0);
  // Enqueues one decode step of `bucket` rows from the staged ids/positions/slots (graph body).
  core::Status enqueue_decode(int bucket);
  // A speculative verification: T rows of one sequence from the staged ids/positions/slots and row snapshots
  // (pinned_snap), one short run (RowSegment::short_runs; pinned_run0 / pinned_runs staged), every row's
  // logits into ws_.logits (graph body, captured per T on first use: verify_graph).
  core::Status enqueue_verify(int T);
  // The graph for T rows, captured now if it is not yet; null where capture failed (the eager path runs).
  cudaGraphExec_t verify_graph(int T);
  core::Status decode_impl(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                           std::vector<float>* logits, std::vector<int32_t>* ids);

  model::TextConfig config_;
  CudaOptions opt_;
  MemoryPlan plan_;
  double load_seconds_ = 0;
  cudaStream_t stream_ = nullptr;
  Gemm gemm_;
  OpProfile prof_;

  // Weights: one device allocation.
  void* weights_mem_ = nullptr;
  DMat embed_, lm_head_;
  float* final_norm_ = nullptr;
  float* inv_freq_ = nullptr;  // [rot / 2]
  std::vector<DLayer> layers_;
  DMtp mtp_;  // present when CudaOptions::mtp and the checkpoint (or synthetic config) has a head

  // Drafting (allocate_pools with PoolRequest::draft; cuda_mtp.cpp). One allocation: the step's final
  // hidden rows by step row [kept_rows_, H], the head's fc input [max_rows_, 2H], last_h_, the drafts'
  // positions, table rows and ids by round [3][kMaxDraftTokens][draft_seqs_], index lists [index_room_]; and
  // their pinned host side.
  bool draft_ = false;
  // RowSegment::short_runs in fused steps and the verification graph: only with DELTAFLOW_CUDA_SHORT_RUNS=1
  // until its GPU tests have run (written 2026-12-07, no device time left); otherwise a verification is a
  // prefill segment with row snapshots, as tested.
  const bool short_runs_ = [] {
    const char* e = std::getenv("DELTAFLOW_CUDA_SHORT_RUNS");
    return e && e[0] == '1' && e[1] == '\0';
  }();
  void* draft_mem_ = nullptr;
  float* kept_ = nullptr;
  float* fc_in_ = nullptr;
  float* last_h_ = nullptr;  // [draft_seqs_, H]: each drafting run's h' after its rows, by rank
  int* round_dev_ = nullptr;
  int* index_dev_ = nullptr;
  int* draft_host_ = nullptr;  // pinned: [rounds 3 * kMaxDraftTokens * draft_seqs_][index_room_]
  int64_t kept_rows_ = 0, index_room_ = 0;
  int32_t draft_seqs_ = 0;
  int64_t draft_table0_ = 0;      // block-table row of a draft's first run
  std::vector<int32_t> keep_at_;  // keep_rows: step rows of the next prefill or decode call's rows
  int* draft_index_host() const;  // the pinned index lists, after the rounds
  void free_draft_buffers();
  core::Status allocate_draft_buffers(int64_t step_rows, int32_t step_seqs);

  // Per-slot state: [slots][n_linear][conv_dim][K-1] and [slots][n_linear][nv][dk][dv] fp32;
  // KV [slots][n_full][nkv][max_ctx][hd].
  void* state_mem_ = nullptr;
  float* conv_states_ = nullptr;
  float* gdn_states_ = nullptr;
  void* k_cache_ = nullptr;
  void* v_cache_ = nullptr;
  float* k_scale_ = nullptr;  // fp8 KV: a scale per (position, kv head), laid out as the codes' rows
  float* v_scale_ = nullptr;
  int64_t conv_layer_ = 0, conv_slot_ = 0, gdn_layer_ = 0, gdn_slot_ = 0, kv_layer_ = 0, kv_slot_ = 0;
  std::vector<bool> slot_used_;
  int scratch_slot_ = 0;  // the state slot (and, paged, table row) of a graph bucket's padding rows
  // Paged KV: kv_slot_ is then the stride between pages, kv_layer_ a layer's offset within a page. The block
  // tables [slots][table_stride_] on the device, their pinned host copy, and the sequences bind hands out.
  int* block_table_ = nullptr;
  int* table_host_ = nullptr;
  int64_t table_stride_ = 0;
  std::vector<std::unique_ptr<CudaSequenceState>> bound_;

  // Activations, sized for max_rows_ tokens.
  struct Workspace {
    float *h = nullptr, *xn = nullptr, *y = nullptr, *proj = nullptr, *conv = nullptr, *gdn = nullptr;
    float *q = nullptr, *attn = nullptr, *part_acc = nullptr, *part_ml = nullptr, *act = nullptr;
    float *router = nullptr, *moe_w = nullptr, *gu_s = nullptr, *act_s = nullptr, *y_slot = nullptr;
    float *xs = nullptr, *ys = nullptr, *y_shared = nullptr, *shared_gate = nullptr, *logits = nullptr;
    int *moe_ids = nullptr, *sort_tok = nullptr, *sort_slot = nullptr;
    // The grouped GEMM's tiles (GroupedTile, 3 ints each), then the expert sort's scratch and live tile
    // count.
    int* moe_tiles = nullptr;
    int *ids = nullptr, *pos = nullptr, *slot = nullptr, *snap = nullptr, *out_ids = nullptr;
    int *run0 = nullptr, *runs = nullptr;  // RowSegment::short_runs: [R] and [R + 1]
    void* x16 = nullptr;
    size_t x16_elems = 0;
    void* gdn_chunk = nullptr;  // the chunked Gated DeltaNet prefill's records (gdn_chunked.cuh)
    size_t gdn_chunk_bytes = 0;
    void* xq = nullptr;          // quantized matmuls: the activations in fp16 (stage_activations_f16)
    float* xq_factor = nullptr;  // and their per-row factors
    size_t xq_rows = 0;          // rows xq and xq_factor hold
    void* wdq = nullptr;         // a quantized weight widened to bf16 for cuBLASLt (prefill)
    size_t wdq_elems = 0;
    void* x8 = nullptr;         // FP8 GEMMs: the activations in E4M3 [x8_rows, K] (quantize_fp8_1x128)
    float* x8_scale = nullptr;  // and their per-128-column scales [K / 128, x8_rows]
    int64_t x8_rows = 0, x8_cols = 0;
    void* kv_dequant = nullptr;  // fp8 KV: a prefill's keys and values as bf16 (AttnArgs::dequant)
    int64_t kv_dequant_elems = 0;
  } ws_;
  void* ws_mem_ = nullptr;
  // What ws_.x16 holds in place of an fp32 buffer its producer did not write: add_norm's xn, or the chunked
  // Gated DeltaNet's output (ws_.gdn), as [rows, cols] in `type`. Every other write to ws_.x16 clears it.
  struct X16Holds {
    const float* src = nullptr;
    int64_t rows = 0, cols = 0;
    core::DType type = core::DType::kBF16;
  } x16_holds_;
  struct XqHolds {  // what ws_.xq holds: the staging of x [rows, cols] packed (add_norm's xn only)
    const float* src = nullptr;
    int64_t rows = 0, cols = 0;
  } xq_holds_;
  int64_t max_rows_ = 0;       // tokens one forward takes (prefill chunk, or a decode bucket)
  int64_t moe_tile_room_ = 0;  // GroupedTile entries ws_.moe_tiles holds (the sort's scratch after them)
  int max_splits_ = 1;

  // Pinned staging: ids, positions and slots of a step (3 x max_rows_ ints), MoE sort order, sampled ids.
  int* pinned_ = nullptr;
  int* pinned_out_rows() const { return pinned_ + 3 * max_rows_ + 256 + 3 * moe_host_rows_; }
  int* pinned_snap() const { return pinned_out_rows() + kLogitRows; }  // a pass's ws_.snap staging
  int* pinned_run0() const { return pinned_snap() + max_rows_; }       // ws_.run0's
  int* pinned_runs() const { return pinned_run0() + max_rows_; }       // ws_.runs' (max_rows_ + 1)
  int64_t moe_host_rows_ = 0;                                          // RK of the pinned layout
  std::vector<int> host_moe_ids_;

  std::array<cudaGraphExec_t, 9> graphs_{};  // buckets 1, 2, 4, ..., 256 (up to decode_rows_)
  // Verification graphs by row count (2 .. kMaxDraftTokens + 1); verify_failed_[T]: its capture failed.
  std::array<cudaGraphExec_t, kMaxDraftTokens + 2> verify_graphs_{};
  std::array<bool, kMaxDraftTokens + 2> verify_failed_{};
  int decode_rows_ = 32;         // rows one decode pass (and graph) takes
  int64_t decode_ws_rows_ = 32;  // decode rows the workspace holds (split-attention partials)

  std::unique_ptr<SamplingBatch> sampling_;  // GPU sampling's staging, made on first use
  // Tensor parallelism (cuda_backend_tp.cpp); inert when opt_.collective is null.
  // Shards config_ (to the rank's heads and intermediates; vocab_size stays whole) and, given `whole`, fills
  // `part` with the rank's slices of it.
  core::Status enter_shard(const model::ModelWeights* whole, model::ModelWeights* part);
  model::TextConfig layout_config() const;           // config_ with the rank's vocab rows
  core::Status embed(int64_t n);                     // ws_.h = embedding of ws_.ids
  core::Status reduce_partial(float* y, int64_t n);  // all-reduce n rows of H partial sums
  core::Status lm_head_shard(int64_t r0, int64_t rows);
  int64_t tp_vocab0_ = 0, tp_vocab_rows_ = 0;
  float* tp_logits_ = nullptr;  // [world][kTpLogitRows][vocab / world]: the all-gather of the logits
};

}  // namespace deltaflow::backend::cuda
