#include "backend/cuda/cuda_backend.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "backend/cpu/ops.hpp"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/conv1d.cuh"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/cuda_weights.hpp"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/fp8_activations.cuh"
#include "backend/cuda/gated_deltanet.cuh"
#include "backend/cuda/gdn_chunked.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/gemv_quant.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_grouped.cuh"
#include "backend/cuda/moe_router.cuh"
#include "backend/cuda/moe_sort.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/sampling_batch.hpp"
#include "backend/memory_plan.hpp"
#include "backend/quant_pack.hpp"
#include "io/safetensors.hpp"
#include "model/rope.hpp"
#include "model/weight_summary.hpp"
#include "model/weights.hpp"

namespace deltaflow::backend::cuda {

using model::LayerType;

namespace {

// Decode graph buckets. Up to kGemvMaxRows rows a step's matmuls are GEMVs; above, (default mode) cuBLASLt
// reads each weight once for up to kDecodeMaxRows rows, where one GEMV launch per 32 rows would read them
// again for each.
constexpr int kNumBuckets = 9;
constexpr int kBuckets[kNumBuckets] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
constexpr size_t kGemmWorkspace = 32u << 20;
constexpr int kGemmCandidates = 12;  // cuBLASLt algorithms timed per prefill matmul shape at load

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// FP8 with 128 x 128 block scales: what the block-scaled FP8 GEMM takes (enable_fp8_gemms checks the rest).
bool fp8_block_scaled(const DMat& m) {
  return m.quantized && !m.q.nvfp4 && m.q.block_rows == 128 && m.q.block_cols == 128;
}

// FP8 with a static input scale whose grid is one value a 128 x 128 block (PackedQuant::input_scale): the
// same GEMM with statically quantized activations (enable_fp8_gemms checks the rest).
bool fp8_static_scaled(const DMat& m) {
  return m.quantized && !m.q.nvfp4 && m.input_scale > 0;
}

int bucket_index(int64_t n) {
  for (int i = 0; i < kNumBuckets; ++i)
    if (n <= kBuckets[i]) return i;
  return kNumBuckets - 1;
}

core::Status check_supported(const model::TextConfig& c) {
  auto err = [](const std::string& m) { return core::Status(core::Error{"cuda backend: " + m}); };
  const int64_t dk = c.linear_key_head_dim, hd = c.head_dim;
  if (c.count_layers(LayerType::kLinearAttention) > 0) {
    if (dk != 16 && dk != 32 && dk != 64 && dk != 128)
      return err("linear_key_head_dim " + std::to_string(dk) + " is not one of 16, 32, 64, 128");
    if (c.linear_value_head_dim > (dk > 64 ? 128 : 256))
      return err("linear_value_head_dim above 256 (128 when linear_key_head_dim is 128) is not supported");
    if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
      return err("linear_num_value_heads must be a multiple of linear_num_key_heads");
    if (c.linear_conv_kernel_dim < 1 || c.linear_conv_kernel_dim > kMaxConvKernel)
      return err("linear_conv_kernel_dim must be in [1, 8]");
  }
  if (c.count_layers(LayerType::kFullAttention) > 0) {
    if (hd != 32 && hd != 64 && hd != 128 && hd != 256)
      return err("head_dim " + std::to_string(hd) + " is not one of 32, 64, 128, 256");
    if (c.num_attention_heads % c.num_key_value_heads != 0 ||
        c.num_attention_heads / c.num_key_value_heads > 32)
      return err("num_attention_heads / num_key_value_heads must be a whole number up to 32");
  }
  if (c.is_moe() && (c.num_experts > kMaxExperts || c.num_experts_per_tok > kMaxTopK))
    return err("more than 1024 experts or 32 experts per token is not supported");
  return core::Status();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Loading and memory

CudaSequenceState::~CudaSequenceState() {
  if (owner && slot >= 0) owner->release_slot(slot);
}

core::Status CudaBackend::init_device(const model::TextConfig& c, const CudaOptions& opt) {
  config_ = c;
  opt_ = opt;
  DF_TRY(check_supported(c));
  if (opt.max_sequences < 1) return core::Error{"cuda backend: max_sequences must be at least 1"};
  if (opt.prefill_chunk < 1) return core::Error{"cuda backend: prefill_chunk must be at least 1"};
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return core::Error{"cuda backend: no CUDA device is visible"};
  }
  if (opt.device < 0 || opt.device >= n)
    return core::Error{"cuda backend: device " + std::to_string(opt.device) + " does not exist (" +
                       std::to_string(n) + " visible)"};
  DF_CUDA_TRY(cudaSetDevice(opt.device));
  DF_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DF_TRY(gemm_.init(kGemmWorkspace));
  return core::Status();
}

core::Expected<std::unique_ptr<CudaBackend>> CudaBackend::load(const std::string& dir,
                                                               const CudaOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  DF_ASSIGN(model::TextConfig c, model::load_text_config(dir));
  if (model::rope_frequencies(c).attention_scaling != 1.0f)
    return core::Error{
        dir + "/config.json: rope_type '" + c.rope_scaling.type +
        "' scales cos and sin, which the CUDA attention kernels do not yet (--device cpu runs it)"};
  DF_TRY(b->init_device(c, opt));
  DF_ASSIGN(io::Checkpoint ck, io::Checkpoint::open(dir));
  DF_ASSIGN(model::ModelWeights whole, model::bind_weights(b->config_, ck));
  model::ModelWeights part;
  DF_TRY(b->enter_shard(&whole, &part));
  const model::ModelWeights& w = opt.collective ? part : whole;
  const WeightSource src{&w, "", !opt.exact && !opt.collective, opt.mtp && !opt.collective};
  DF_TRY(b->place_weights(src, 0, opt.progress));
  DF_TRY(b->plan_memory());
  DF_TRY(b->warm_up());
  b->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return b;
}

core::Expected<std::unique_ptr<CudaBackend>> CudaBackend::synthetic(const model::TextConfig& c,
                                                                    const CudaOptions& opt, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  DF_TRY(b->init_device(c, opt));
  DF_TRY(b->enter_shard(nullptr, nullptr));
  const WeightSource src{nullptr, opt.synthetic_quant, !opt.exact && !opt.collective,
                         opt.mtp && !opt.collective};
  DF_TRY(b->place_weights(src, seed, false));
  DF_TRY(b->plan_memory());
  // A cache of finite values, so attention over a context the benchmark only claims reads real numbers.
  const core::DType kv_dt = b->plan_.kv_f32 ? core::DType::kF32 : core::DType::kBF16;
  const int64_t kv_elems = static_cast<int64_t>(b->plan_.kv / 2 / core::dtype_size(kv_dt));
  if (b->plan_.kv_fp8) {
    // Codes 0x38 (1.0) and 0x30 (0.5) scaled by 1/64: finite numbers; the scales follow the codes.
    const size_t codes = b->kv_code_bytes();
    DF_CUDA_TRY(cudaMemsetAsync(b->k_cache_, 0x38, codes, b->stream_));
    DF_CUDA_TRY(cudaMemsetAsync(b->v_cache_, 0x30, codes, b->stream_));
    DF_CUDA_TRY(fill_random(b->k_scale_, core::DType::kF32,
                            static_cast<int64_t>(2 * codes / b->config_.head_dim), seed + 17, 0.0f, 1.0f / 64,
                            b->stream_));
  } else if (kv_elems > 0) {
    DF_CUDA_TRY(fill_random(b->k_cache_, kv_dt, kv_elems, seed + 17, 1.0f, 0.0f, b->stream_));
    DF_CUDA_TRY(fill_random(b->v_cache_, kv_dt, kv_elems, seed + 18, 1.0f, 0.0f, b->stream_));
  }
  DF_CUDA_TRY(cudaStreamSynchronize(b->stream_));
  DF_TRY(b->warm_up());
  b->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return b;
}

// Sizes the weights' allocation (a layout pass at base 0), allocates it, lays the weights out there and
// fills it (uploads, or random values from seed).
core::Status CudaBackend::place_weights(const WeightSource& src, uint64_t seed, bool progress) {
  DF_ASSIGN(PlacedWeights sized, lay_out_weights(layout_config(), src, 0));
  DF_TRY(device_alloc(&weights_mem_, std::max<size_t>(sized.bytes, 256), "the weights",
                      "this model needs a larger GPU, or more GPUs (--tensor-parallel-size)"));
  plan_.weights = sized.bytes;
  DF_ASSIGN(PlacedWeights placed,
            lay_out_weights(layout_config(), src, reinterpret_cast<uintptr_t>(weights_mem_)));
  if (placed.widened > 0)
    std::fprintf(
        stderr,
        "note: quantized MoE matrices widened to bf16 at load (%.2f GB): a quantized router, and in exact "
        "mode, with --tensor-parallel-size or with experts of mixed layouts the routed and shared experts\n",
        static_cast<double>(placed.widened) / 1e9);
  embed_ = placed.embed;
  lm_head_ = placed.lm_head;
  final_norm_ = placed.final_norm;
  inv_freq_ = placed.inv_freq;
  layers_ = std::move(placed.layers);
  mtp_ = placed.mtp;
  return fill_weights(placed.jobs, static_cast<uint8_t*>(weights_mem_), seed, progress, stream_);
}

core::Status CudaBackend::plan_memory() {
  const auto& c = config_;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t n_lin = c.count_layers(LayerType::kLinearAttention),
                n_full = c.count_layers(LayerType::kFullAttention);
  const int64_t C = c.linear_conv_dim(), vd = c.linear_value_dim(), nv = c.linear_num_value_heads;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd;
  const int64_t Kc = c.linear_conv_kernel_dim;
  const int64_t max_ctx =
      opt_.max_context > 0 ? opt_.max_context : std::min<int64_t>(c.max_position_embeddings, 32768);
  plan_.max_context = max_ctx;
  plan_.kv_f32 = opt_.exact;
  plan_.kv_fp8 = opt_.kv_fp8 && !opt_.exact;
  max_splits_ = attention_max_splits(max_ctx);
  conv_layer_ = C * (Kc - 1);
  conv_slot_ = n_lin * conv_layer_;
  gdn_layer_ = nv * c.linear_key_head_dim * c.linear_value_head_dim;
  gdn_slot_ = n_lin * gdn_layer_;
  if (!opt_.engine_pools) {
    DF_TRY(allocate_states(opt_.max_sequences + 1, 0));
    slot_used_.assign(static_cast<size_t>(opt_.max_sequences), false);
  }

  // Activations for max_rows_ tokens.
  max_rows_ = std::max<int64_t>(opt_.prefill_chunk, kGemvMaxRows);
  const int64_t R = max_rows_;
  // Rows one decode pass takes: kGemvMaxRows in exact mode (the GEMV, fp32 in), with tensor parallelism,
  // and for experts the grouped GEMM does not take (their fallback syncs with the host, which a graph cannot
  // hold); else the largest bucket up to kDecodeMaxRows that the workspace's rows hold.
  decode_rows_ = kGemvMaxRows;
  bool grouped_ok = true;
  for (const auto& L : layers_)
    if (L.is_moe) {
      // Quantized experts run the grouped GEMM on their bf16 widening.
      const core::DType dt = L.experts_gu.quantized ? core::DType::kBF16 : L.experts_gu.dtype;
      grouped_ok = grouped_ok && L.experts_gu.quantized == L.experts_down.quantized &&
                   (L.experts_gu.quantized || L.experts_gu.dtype == L.experts_down.dtype) &&
                   moe_grouped_supported(dt, static_cast<int>(L.experts_gu.rows), static_cast<int>(H)) &&
                   moe_grouped_supported(dt, static_cast<int>(H), static_cast<int>(L.experts_down.cols));
    }
  const int64_t ws_decode_rows = decode_workspace_rows(opt_.exact, R);
  decode_ws_rows_ = ws_decode_rows;
  static_assert(kDecodeMaxRows == 256, "pinned_out_rows() counts on it");
  if (!opt_.exact && !opt_.collective && grouped_ok) decode_rows_ = static_cast<int>(ws_decode_rows);
  const int64_t E = c.is_moe() ? c.num_experts : 0, K = c.is_moe() ? c.num_experts_per_tok : 0;
  const int64_t Im = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  const int64_t RK = R * std::max<int64_t>(K, 1);
  moe_host_rows_ = RK;
  int64_t I = 0;
  bool any_dense = false;
  for (const auto& L : layers_)
    if (!L.is_moe) {
      any_dense = true;
      I = std::max(I, L.down.cols);
    }
  int64_t Pmax = 1;
  if (n_lin) Pmax = std::max(Pmax, C + vd + 2 * nv);
  if (n_full) Pmax = std::max(Pmax, nh * qw + 2 * nkv * hd);
  if (any_dense) Pmax = std::max(Pmax, 2 * I);
  if (E) Pmax = std::max(Pmax, 2 * Is);
  // The MTP head's fc reads [embedding | hidden] rows of 2H.
  const int64_t Kmax = std::max({H, I, Im, Is, vd, nh * hd, mtp_.present ? 2 * H : 0});
  const int64_t part = std::max(R * nh * hd, ws_decode_rows * nh * max_splits_ * hd);
  const int64_t part_ml = std::max(R * nh * 2, ws_decode_rows * nh * max_splits_ * 2);

  struct Buf {
    void** p;
    size_t bytes;
  };
  std::vector<Buf> bufs;
  auto f = [&](float*& ptr, int64_t n) {
    bufs.push_back({reinterpret_cast<void**>(&ptr), static_cast<size_t>(n) * 4});
  };
  auto i = [&](int*& ptr, int64_t n) {
    bufs.push_back({reinterpret_cast<void**>(&ptr), static_cast<size_t>(n) * 4});
  };
  f(ws_.h, R * H);
  f(ws_.xn, R * H);
  f(ws_.y, R * H);
  f(ws_.proj, R * Pmax);
  f(ws_.conv, n_lin ? R * C : 1);
  f(ws_.gdn, n_lin ? R * vd : 1);
  f(ws_.q, n_full ? R * nh * hd : 1);
  f(ws_.attn, n_full ? R * nh * hd : 1);
  f(ws_.part_acc, n_full ? part : 1);
  f(ws_.part_ml, n_full ? part_ml : 1);
  f(ws_.act, R * std::max<int64_t>({I, Is, 1}));
  f(ws_.router, E ? R * E : 1);
  f(ws_.moe_w, E ? RK : 1);
  f(ws_.gu_s, E ? RK * 2 * Im : 1);
  f(ws_.act_s, E ? RK * Im : 1);
  f(ws_.y_slot, E ? RK * H : 1);
  f(ws_.xs, E ? RK * H : 1);
  f(ws_.ys, E ? RK * H : 1);
  f(ws_.y_shared, E ? R * H : 1);
  f(ws_.shared_gate, E ? R : 1);
  f(ws_.logits, std::max<int64_t>(kLogitRows, ws_decode_rows) * V);
  i(ws_.moe_ids, E ? RK : 1);
  i(ws_.sort_tok, E ? RK : 1);
  i(ws_.sort_slot, E ? RK : 1);
  i(ws_.ids, R);
  i(ws_.pos, R);
  i(ws_.slot, R);
  i(ws_.snap, R);
  i(ws_.run0, R);
  i(ws_.runs, R + 1);
  i(ws_.out_ids, ws_decode_rows);
  moe_tile_room_ = E ? RK / kGroupedTileRows + E + 1 : 0;
  // The tile list, then the expert sort's scratch and the live tile count it writes.
  i(ws_.moe_tiles, E ? 3 * moe_tile_room_ + moe_sort_scratch_ints(E) + 1 : 1);
  // fp8 KV: a prefill's keys and values widened to bf16 for the tensor-core prefill kernel.
  ws_.kv_dequant_elems = plan_.kv_fp8 && n_full ? attention_dequant_elems(plan_.max_context, nkv, hd) : 0;
  bufs.push_back({&ws_.kv_dequant, std::max<size_t>(static_cast<size_t>(ws_.kv_dequant_elems) * 2, 16)});
  ws_.x16_elems = opt_.exact ? 0 : static_cast<size_t>(std::max(R, RK) * Kmax);
  bufs.push_back({&ws_.x16, std::max<size_t>(ws_.x16_elems * 2, 16)});
  // Quantized matmuls: fp16 activations of one GEMV launch, and, when prefill chunks pass the decode buckets,
  // the largest quantized weight but lm_head widened to bf16 (lm_head runs its rows on the GEMV).
  // FP8 block-scaled matrices: prefill chunks past the decode buckets quantize their activations to E4M3
  // per 128 columns for cuBLASLt's FP8 GEMM (rows rounded up to 8).
  size_t wdq = 0;
  bool any_quant = lm_head_.quantized, fp8_block = false;
  const auto widest = [&](const DMat& m) {
    any_quant |= m.quantized || !m.parts.empty();
    if (m.quantized) wdq = std::max(wdq, static_cast<size_t>(m.rows * m.cols));
    fp8_block |= fp8_block_scaled(m) || fp8_static_scaled(m);
    for (const DMat& p : m.parts) {
      if (p.quantized) wdq = std::max(wdq, static_cast<size_t>(p.rows * p.cols));
      fp8_block |= fp8_block_scaled(p) || fp8_static_scaled(p);
    }
  };
  for (const DLayer& L : layers_)
    for (const DMat* m :
         {&L.in_proj, &L.out_proj, &L.qkv, &L.o_proj, &L.gate_up, &L.down, &L.shared_gu, &L.shared_down})
      widest(*m);
  if (mtp_.present) {
    const DLayer& L = mtp_.layer;
    for (const DMat* m : {static_cast<const DMat*>(&mtp_.fc), &L.qkv, &L.o_proj, &L.gate_up, &L.down,
                          &L.shared_gu, &L.shared_down})
      widest(*m);
  }
  ws_.wdq_elems = !opt_.exact && R > kDecodeMaxRows ? wdq : 0;
  // Quantized routed experts: a step stages its T * K slots' activations (the gate/up's gathered in sorted
  // order past the decode buckets, and the down projection's).
  bool quant_experts = false;
  for (const DLayer& L : layers_) quant_experts |= L.is_moe && L.experts_gu.quantized;
  any_quant |= quant_experts;
  const int64_t xq_rows =
      quant_experts ? std::max<int64_t>(R, kDecodeMaxRows) * std::max<int64_t>(K, 1) : kQuantGemvMaxRows;
  ws_.xq_rows = static_cast<size_t>(xq_rows);
  const bool x8 = fp8_block && !opt_.exact && R > kDecodeMaxRows;
  ws_.x8_rows = x8 ? fp8_gemm_rows(R) : 0;
  ws_.x8_cols = x8 ? (Kmax + 127) / 128 * 128 : 0;
  bufs.push_back({&ws_.x8, std::max<size_t>(static_cast<size_t>(ws_.x8_rows * ws_.x8_cols), 16)});
  f(ws_.x8_scale, std::max<int64_t>(ws_.x8_cols / 128 * ws_.x8_rows, 4));
  bufs.push_back({&ws_.wdq, std::max<size_t>(ws_.wdq_elems * 2, 16)});
  bufs.push_back({&ws_.xq, any_quant ? static_cast<size_t>(xq_rows * Kmax) * 2 : 16});
  f(ws_.xq_factor, xq_rows);
  // The chunked Gated DeltaNet prefill (fast mode): its per-chunk records for one max_rows_-token sequence.
  const int gk = static_cast<int>(c.linear_num_key_heads), gd = static_cast<int>(c.linear_key_head_dim),
            ge = static_cast<int>(c.linear_value_head_dim);
  ws_.gdn_chunk_bytes =
      n_lin && !opt_.exact && gdn_chunked_supported(gk, static_cast<int>(nv), gd, ge)
          ? gdn_chunked_workspace_bytes(1, static_cast<int>(R), static_cast<int>(nv), gd, ge)
          : 0;
  bufs.push_back({&ws_.gdn_chunk, std::max<size_t>(ws_.gdn_chunk_bytes, 16)});
  size_t total = 0;
  for (const auto& b : bufs) total = align_up(total, 256) + b.bytes;
  plan_.workspace = total;
  DF_TRY(device_alloc(&ws_mem_, total, "the activation workspace",
                      "lower --max-num-batched-tokens or --max-model-len"));
  size_t off = 0;
  for (const auto& b : bufs) {
    off = align_up(off, 256);
    *b.p = static_cast<uint8_t*>(ws_mem_) + off;
    off += b.bytes;
  }
  // Pinned staging: [ids R][pos R][slot R][out ids 256][sort_tok RK][sort_slot RK][moe ids RK] (those three
  // for the host-sorted MoE path)[output rows 256] (a fused step's rows that reach lm_head)[row snapshots R]
  // [short runs: run0 R][runs R + 1].
  static_assert(sizeof(GroupedTile) == 3 * sizeof(int));
  DF_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&pinned_),
                            static_cast<size_t>(6 * R + 1 + kDecodeMaxRows + 3 * RK + kLogitRows) * 4,
                            cudaHostAllocDefault));
  DF_CUDA_TRY(cudaStreamSynchronize(stream_));
  return core::Status();
}

core::Status CudaBackend::allocate_states(int slots, int64_t pages, int draft_rows) {
  const auto& c = config_;
  const int64_t n_full = c.count_layers(LayerType::kFullAttention);
  const int64_t nkv = c.num_key_value_heads, hd = c.head_dim;
  if (stream_) DF_CUDA_TRY(cudaStreamSynchronize(stream_));
  destroy_graphs();
  if (state_mem_) cudaFree(state_mem_);
  if (block_table_) cudaFree(block_table_);
  if (table_host_) cudaFreeHost(table_host_);
  state_mem_ = nullptr;
  block_table_ = table_host_ = nullptr;
  conv_states_ = gdn_states_ = nullptr;
  k_cache_ = v_cache_ = nullptr;
  plan_.states = plan_.kv = 0;
  plan_.slots = slots;
  plan_.kv_pages = pages;
  scratch_slot_ = slots - 1;
  // [conv | gdn | k | v], one allocation. KV: [slots][n_full][nkv][max_ctx][hd], or pages of
  // [n_full][nkv][kPageSize][hd].
  if (pages > 0) {
    kv_layer_ = nkv * kPageSize * hd;
    kv_slot_ = (n_full + (draft_rows > 0 ? 1 : 0)) * kv_layer_;  // + the MTP layer's store
  } else {
    kv_layer_ = nkv * plan_.max_context * hd;
    kv_slot_ = n_full * kv_layer_;
  }
  const int64_t kv_units = pages > 0 ? pages : slots;
  const size_t conv_bytes = align_up(static_cast<size_t>(slots * conv_slot_) * 4, 256);
  const size_t gdn_bytes = align_up(static_cast<size_t>(slots * gdn_slot_) * 4, 256);
  const size_t kv_bytes = align_up(static_cast<size_t>(kv_units * kv_slot_) * kv_elem_bytes(), 256);
  // fp8: after k and v, their scales, one fp32 per (position, kv head) row.
  const size_t scale_bytes =
      plan_.kv_fp8 ? align_up(static_cast<size_t>(kv_units * kv_slot_ / config_.head_dim) * 4, 256) : 0;
  plan_.states = conv_bytes + gdn_bytes;
  plan_.kv = 2 * (kv_bytes + scale_bytes);
  DF_TRY(device_alloc(&state_mem_, std::max<size_t>(plan_.states + plan_.kv, 256),
                      "the KV cache and recurrent states",
                      "lower --kv-cache-gb, --max-num-seqs, --max-model-len or --prefix-cache-gb "
                      "(`deltaflow inspect --gpu-memory GB` shows what fits)"));
  uint8_t* p = static_cast<uint8_t*>(state_mem_);
  conv_states_ = reinterpret_cast<float*>(p);
  gdn_states_ = reinterpret_cast<float*>(p + conv_bytes);
  k_cache_ = p + conv_bytes + gdn_bytes;
  v_cache_ = p + conv_bytes + gdn_bytes + kv_bytes;
  k_scale_ = plan_.kv_fp8 ? reinterpret_cast<float*>(p + conv_bytes + gdn_bytes + 2 * kv_bytes) : nullptr;
  v_scale_ = plan_.kv_fp8 ? reinterpret_cast<float*>(p + conv_bytes + gdn_bytes + 2 * kv_bytes + scale_bytes)
                          : nullptr;
  DF_CUDA_TRY(cudaMemsetAsync(state_mem_, 0, plan_.states, stream_));
  if (pages > 0) {
    // Every table entry starts at the scratch page (the last): a row never bound reads finite numbers in
    // bounds, and a padding row of a graph bucket writes its position 0 there.
    table_stride_ = (plan_.max_context + kPageSize - 1) / kPageSize;
    draft_table0_ = slots;
    const size_t n = static_cast<size_t>((slots + draft_rows) * table_stride_);
    DF_CUDA_TRY(cudaMalloc(&block_table_, n * 4));
    DF_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&table_host_), n * 4, cudaHostAllocDefault));
    for (size_t i = 0; i < n; ++i) table_host_[i] = static_cast<int>(pages - 1);
    DF_CUDA_TRY(cudaMemcpyAsync(block_table_, table_host_, n * 4, cudaMemcpyHostToDevice, stream_));
    DF_CUDA_TRY(cudaMemsetAsync(k_cache_, 0, plan_.kv, stream_));
  }
  DF_CUDA_TRY(cudaStreamSynchronize(stream_));
  return core::Status();
}

core::Status CudaBackend::tune_gemms() {
  const int64_t T = max_rows_;
  if (!gemm_.ready() || ws_.x16_elems == 0) return core::Status();
  // Random input: a tensor-core GEMM on zeros draws less power and runs at clocks real data never sees
  // (measured on the H200: 0.81 ms vs 1.03 ms for in_proj's shape), which would misorder the candidates.
  // Every call on the buffers and strides the forward pass gives it, so the keys match.
  x16_holds_ = {};
  DF_CUDA_TRY(
      fill_random(ws_.x16, core::DType::kBF16, static_cast<int64_t>(ws_.x16_elems), 7, 1.0f, 0.0f, stream_));
  // The FP8 GEMMs' input: the same random rows quantized (the widest that x16 holds at T rows).
  const int64_t k8 =
      T > 0 ? std::min<int64_t>(ws_.x8_cols, static_cast<int64_t>(ws_.x16_elems) / T / 128 * 128) : 0;
  if (ws_.x8_rows >= fp8_gemm_rows(T) && k8 > 0)
    DF_CUDA_TRY(quantize_fp8_1x128(ws_.x16, k8, T, fp8_gemm_rows(T), k8, ws_.x8, ws_.x8_scale, stream_));
  const auto tune = [&](const DMat& W, void* y, core::DType y_type) -> core::Status {
    if (!W.data || !takes_gemm(T, W)) return core::Status();
    return gemm_.tune(gemm_call(ws_.x16, T, W, y, y_type, W.rows), kGemmCandidates, stream_);
  };
  const auto tune_mlp = [&](const DMat& gu, const DMat& down, float* y) -> core::Status {
    if (mlp_in_16bit(T, gu, down)) {
      DF_TRY(tune(gu, ws_.proj, gemm_type(gu)));
    } else {
      DF_TRY(tune(gu, ws_.proj, core::DType::kF32));
    }
    return tune(down, y, core::DType::kF32);
  };
  for (const DLayer& L : layers_) {
    if (L.type == LayerType::kFullAttention) {
      DF_TRY(tune(L.qkv, ws_.proj, core::DType::kF32));
      DF_TRY(tune(L.o_proj, ws_.y, core::DType::kF32));
    } else {
      DF_TRY(tune(L.in_proj, ws_.proj, core::DType::kF32));
      DF_TRY(tune(L.out_proj, ws_.y, core::DType::kF32));
    }
    if (L.is_moe) {
      if (router_takes_gemm(L, T)) DF_TRY(gemm_.tune(router_gemm_call(L, T), kGemmCandidates, stream_));
      DF_TRY(tune_mlp(L.shared_gu, L.shared_down, ws_.y_shared));
    } else {
      DF_TRY(tune_mlp(L.gate_up, L.down, ws_.y));
    }
  }
  return core::Status();
}

core::Status CudaBackend::warm_up() {
  enable_fp8_gemms();
  if (!opt_.exact) DF_TRY(tune_gemms());
  if (opt_.engine_pools) return core::Status();  // graphs come with the pools (allocate_pools)
  return capture_graphs();
}

void CudaBackend::destroy_graphs() {
  for (auto& g : graphs_) {
    if (g) cudaGraphExecDestroy(g);
    g = nullptr;
  }
  for (auto& g : verify_graphs_) {
    if (g) cudaGraphExecDestroy(g);
    g = nullptr;
  }
  verify_failed_.fill(false);
}

cudaGraphExec_t CudaBackend::verify_graph(int T) {
  const size_t t = static_cast<size_t>(T);
  if (verify_graphs_[t] || verify_failed_[t]) return verify_graphs_[t];
  // The staged rows are the caller's (copied from pinned memory when the graph runs, not now).
  cudaGraph_t g = nullptr;
  bool ok = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    const bool body = enqueue_verify(T).is_ok();
    ok = cudaStreamEndCapture(stream_, &g) == cudaSuccess && body;
  }
  if (ok) ok = cudaGraphInstantiate(&verify_graphs_[t], g, 0) == cudaSuccess;
  if (g) cudaGraphDestroy(g);
  if (!ok) {
    verify_graphs_[t] = nullptr;
    verify_failed_[t] = true;
    cudaGetLastError();  // a failed capture leaves its error behind
  }
  return verify_graphs_[t];
}

core::Status CudaBackend::capture_graphs() {
  destroy_graphs();
  if (!opt_.cuda_graphs) return core::Status();
  for (int bi = 0; bi < kNumBuckets && kBuckets[bi] <= decode_rows_; ++bi) {
    const int B = kBuckets[bi];
    // Stage harmless rows (scratch slot, position 0) so the capture's host copies read defined values.
    for (int r = 0; r < B; ++r) {
      pinned_[r] = 0;
      pinned_[max_rows_ + r] = 0;
      pinned_[2 * max_rows_ + r] = scratch_slot_;
    }
    DF_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    const core::Status st = enqueue_decode(B);
    cudaGraph_t g = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream_, &g);
    if (!st.is_ok()) {
      if (g) cudaGraphDestroy(g);
      return st;
    }
    DF_CUDA_TRY(e);
    const cudaError_t ie = cudaGraphInstantiate(&graphs_[static_cast<size_t>(bi)], g, 0);
    cudaGraphDestroy(g);
    DF_CUDA_TRY(ie);
  }
  return core::Status();
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  bound_.clear();
  destroy_graphs();
  if (block_table_) cudaFree(block_table_);
  if (table_host_) cudaFreeHost(table_host_);
  if (pinned_) cudaFreeHost(pinned_);
  free_draft_buffers();
  if (tp_logits_) cudaFree(tp_logits_);
  if (ws_mem_) cudaFree(ws_mem_);
  if (state_mem_) cudaFree(state_mem_);
  if (weights_mem_) cudaFree(weights_mem_);
  if (stream_) cudaStreamDestroy(stream_);
}

// ---------------------------------------------------------------------------------------------------------------
// Sequences

std::unique_ptr<SequenceState> CudaBackend::new_sequence() {
  auto s = std::make_unique<CudaSequenceState>();
  s->owner = this;
  for (size_t i = 0; i < slot_used_.size(); ++i) {
    if (slot_used_[i]) continue;
    // A fresh sequence starts from zero conv and recurrent state (the KV cache needs no clearing: only
    // positions < length are read).
    if (cudaMemsetAsync(conv_states_ + static_cast<int64_t>(i) * conv_slot_, 0,
                        static_cast<size_t>(conv_slot_) * 4, stream_) != cudaSuccess ||
        cudaMemsetAsync(gdn_states_ + static_cast<int64_t>(i) * gdn_slot_, 0,
                        static_cast<size_t>(gdn_slot_) * 4, stream_) != cudaSuccess) {
      cudaGetLastError();
      break;  // reported as "no slot" by prefill/decode
    }
    slot_used_[i] = true;
    s->slot = static_cast<int>(i);
    break;
  }
  return s;
}

void CudaBackend::release_slot(int slot) {
  if (slot >= 0 && static_cast<size_t>(slot) < slot_used_.size())
    slot_used_[static_cast<size_t>(slot)] = false;
}

core::Status CudaBackend::set_length(SequenceState& s, int64_t length) {
  auto* cs = dynamic_cast<CudaSequenceState*>(&s);
  if (!cs || cs->owner != this) return core::Error{"cuda backend: sequence state from another backend"};
  if (length < 0 || length >= plan_.max_context)
    return core::Error{"cuda backend: length " + std::to_string(length) + " is outside the cache (" +
                       std::to_string(plan_.max_context) + " positions)"};
  cs->pos = length;
  return core::Status();
}

// ---------------------------------------------------------------------------------------------------------------
// The forward pass

cudaError_t CudaBackend::stage_x16(const float* x, int64_t ldx, int64_t T, int64_t K, core::DType dtype) {
  const X16Holds& h = x16_holds_;
  if (x == h.src && ldx == K && h.rows == T && h.cols == K && h.type == dtype) return cudaSuccess;
  x16_holds_ = {};
  return convert_rows(x, ldx, T, K, ws_.x16, dtype, stream_);
}

cudaError_t CudaBackend::stage_xq(const float* x, int64_t ldx, int64_t T, int64_t K) {
  const XqHolds& h = xq_holds_;
  if (x == h.src && ldx == K && h.rows == T && h.cols == K) return cudaSuccess;
  xq_holds_ = {};
  return stage_activations_f16(x, ldx, static_cast<int>(T), K, ws_.xq, ws_.xq_factor, stream_);
}

bool CudaBackend::reads_staged_rows(int64_t n, const DMat* next) const {
  if (!next || next->cols != config_.hidden_size || n > kQuantGemvMaxRows) return false;
  const auto quant_gemv = [&](const DMat& m) { return m.quantized && !takes_gemm(n, m); };
  if (next->parts.empty()) return quant_gemv(*next);
  return std::any_of(next->parts.begin(), next->parts.end(), quant_gemv);  // the others read fp32 xn
}

core::Status CudaBackend::add_norm(const float* y, int64_t n, const float* w, const DMat* next, bool staged) {
  const int64_t H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  x16_holds_ = {};
  xq_holds_ = {};
  if (next && next->cols == H && takes_gemm(n, *next)) {
    x16_holds_ = {ws_.xn, n, H, gemm_type(*next)};
    DF_CUDA_TRY(add_rmsnorm1p_16(ws_.h, y, n, H, w, eps, ws_.x16, gemm_type(*next), stream_));
  } else if ((staged || reads_staged_rows(n, next)) && static_cast<size_t>(n) <= ws_.xq_rows) {
    xq_holds_ = {ws_.xn, n, H};
    DF_CUDA_TRY(add_rmsnorm1p_staged(ws_.h, y, n, H, w, eps, ws_.xn, ws_.xq, ws_.xq_factor, stream_));
  } else {
    DF_CUDA_TRY(add_rmsnorm1p(ws_.h, y, n, H, w, eps, ws_.xn, stream_));
  }
  return core::Status();
}

bool CudaBackend::takes_gemm(int64_t T, const DMat& W) const {
  if (!W.parts.empty()) return false;
  // A quantized weight goes to cuBLASLt (widened, or FP8 as it is) only past the decode buckets: up to them,
  // GEMV passes over the 4-bit or 8-bit codes read fewer bytes than writing and reading a bf16 copy.
  if (W.quantized)
    return !opt_.exact && T > kDecodeMaxRows && static_cast<size_t>(T * W.cols) <= ws_.x16_elems &&
           (W.fp8_gemm || W.fp8_static
                ? fp8_gemm_rows(T) <= std::min(ws_.x8_rows, max_rows_) && W.cols <= ws_.x8_cols
                : static_cast<size_t>(W.rows * W.cols) <= ws_.wdq_elems);
  const bool half = W.dtype == core::DType::kBF16 || W.dtype == core::DType::kF16;
  return !opt_.exact && T > kGemvMaxRows && half && W.cols % 8 == 0 &&
         static_cast<size_t>(T * W.cols) <= ws_.x16_elems;
}

GemmCall CudaBackend::gemm_call(const void* x16, int64_t T, const DMat& W, void* y, core::DType y_type,
                                int64_t ldy) const {
  if (W.fp8_gemm)
    return GemmCall{W.q.codes, core::DType::kF8E4M3, W.rows, W.cols, ws_.x8, fp8_gemm_rows(T), y, y_type, ldy,
                    W.q.grid,  ws_.x8_scale};
  // Static activations: the weight's grid as 128 x 128 block scales in ws_.wdq (run_gemm writes it there;
  // the widened copy it would otherwise hold is not needed).
  if (W.fp8_static)
    return GemmCall{W.q.codes,   core::DType::kF8E4M3,
                    W.rows,      W.cols,
                    ws_.x8,      fp8_gemm_rows(T),
                    y,           y_type,
                    ldy,         static_cast<const float*>(ws_.wdq),
                    ws_.x8_scale};
  if (W.quantized) return GemmCall{ws_.wdq, core::DType::kBF16, W.rows, W.cols, x16, T, y, y_type, ldy};
  return GemmCall{W.data, W.dtype, W.rows, W.cols, x16, T, y, y_type, ldy};
}

core::Status CudaBackend::run_gemm(const void* x16, int64_t T, const DMat& W, void* y, core::DType y_type,
                                   int64_t ldy) {
  if (W.fp8_gemm) {
    DF_CUDA_TRY(quantize_fp8_1x128(x16, W.cols, T, fp8_gemm_rows(T), W.cols, ws_.x8, ws_.x8_scale, stream_));
  } else if (W.fp8_static) {
    DF_CUDA_TRY(fp8_block_grid(W.q.grid, W.q.grid_cols, W.q.block_rows, W.q.block_cols, W.rows, W.cols,
                               static_cast<float*>(ws_.wdq), stream_));
    DF_CUDA_TRY(quantize_fp8_static(x16, W.cols, T, fp8_gemm_rows(T), W.cols, W.input_scale, ws_.x8,
                                    ws_.x8_scale, stream_));
  } else if (W.quantized) {
    DF_CUDA_TRY(dequantize_bf16(W.q, ws_.wdq, stream_));
  }
  return gemm_.run(gemm_call(x16, T, W, y, y_type, ldy), stream_);
}

void CudaBackend::enable_fp8_gemms() {
  // Every output buffer of these matmuls holds max_rows_ rows (the FP8 GEMM writes T rounded up to 8).
  if (opt_.exact || !gemm_.ready() || ws_.x8_rows == 0 || max_rows_ % 8 != 0) return;
  const auto enable = [&](DMat& m, void* y) {
    if (m.cols % 512 != 0 || m.rows % 8 != 0 || m.cols > ws_.x8_cols) return;
    if (fp8_block_scaled(m) && m.q.grid_cols * 128 == m.cols && opt_.fp8_gemm) {
      m.fp8_gemm = true;
      // cuBLASLt's answer for a whole chunk; a build without the block-scaled FP8 GEMM keeps the bf16 copy.
      m.fp8_gemm = gemm_.supports(gemm_call(ws_.x16, max_rows_, m, y, core::DType::kF32, m.rows));
    } else if (fp8_static_scaled(m) && opt_.fp8_static_activations &&
               static_cast<size_t>((m.rows + 127) / 128 * (m.cols / 128)) * 4 <= ws_.wdq_elems * 2) {
      m.fp8_static = true;
      m.fp8_static = gemm_.supports(gemm_call(ws_.x16, max_rows_, m, y, core::DType::kF32, m.rows));
    }
  };
  const auto each = [&](DMat& m, void* y) {
    enable(m, y);
    for (DMat& p : m.parts) enable(p, y);
  };
  std::vector<DLayer*> all;  // the layers, and the MTP head's
  for (DLayer& L : layers_) all.push_back(&L);
  if (mtp_.present) {
    each(mtp_.fc, ws_.h);
    all.push_back(&mtp_.layer);
  }
  for (DLayer* Lp : all) {
    DLayer& L = *Lp;
    each(L.in_proj, ws_.proj);
    each(L.out_proj, ws_.y);
    each(L.qkv, ws_.proj);
    each(L.o_proj, ws_.y);
    each(L.gate_up, ws_.proj);
    each(L.down, ws_.y);
    each(L.shared_gu, ws_.proj);
    each(L.shared_down, ws_.y_shared);
  }
}

core::Status CudaBackend::linear_quant(const float* x, int64_t ldx, int64_t T, const DMat& W, float* y,
                                       int64_t ldy, bool swiglu) {
  if (W.cols % kQuantTileCols != 0)
    return core::Error{"cuda backend: internal: a quantized matmul of " + std::to_string(W.cols) +
                       " columns"};
  for (int64_t t0 = 0; t0 < T; t0 += kQuantGemvMaxRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kQuantGemvMaxRows, T - t0));
    DF_CUDA_TRY(stage_xq(x + t0 * ldx, ldx, rows, W.cols));
    DF_CUDA_TRY(gemv_quant(W.q, ws_.xq, ws_.xq_factor, rows, y + t0 * ldy, ldy, swiglu, stream_));
  }
  return core::Status();
}

core::Status CudaBackend::linear(const float* x, int64_t ldx, int64_t T, const DMat& W, float* y, int64_t ldy,
                                 bool force_fp32, bool swiglu, const GemvConv& conv) {
  if (!W.parts.empty() || W.quantized) {
    if (conv.w) return core::Error{"cuda backend: internal: the conv epilogue needs a plain in_proj"};
    if (x == x16_holds_.src && !takes_gemm(T, W))
      return core::Error{
          "cuda backend: internal: the input is in ws_.x16 only, for a matmul that reads fp32"};
  }
  if (!W.parts.empty()) {
    if (swiglu) return core::Error{"cuda backend: internal: SwiGLU over a split projection"};
    int64_t r0 = 0;
    for (const DMat& p : W.parts) {
      DF_TRY(linear(x, ldx, T, p, y + r0, ldy, force_fp32));
      r0 += p.rows;
    }
    return core::Status();
  }
  if (W.quantized && !(takes_gemm(T, W) && !swiglu)) return linear_quant(x, ldx, T, W, y, ldy, swiglu);
  const bool half = W.dtype == core::DType::kBF16 || W.dtype == core::DType::kF16;
  // The conv epilogue runs in the SIMT and scalar GEMV kernels only (gemv() refuses it on tensor cores).
  if (conv.w && T > kGemvSimtRows)
    return core::Error{"cuda backend: the conv epilogue is for one GEMV launch of up to " +
                       std::to_string(kGemvSimtRows) + " rows"};
  const bool gemm = !force_fp32 && !swiglu && takes_gemm(T, W);
  if (x == x16_holds_.src && !gemm)
    return core::Error{"cuda backend: internal: the input is in ws_.x16 only, for a matmul that reads fp32"};
  if (gemm) {
    DF_CUDA_TRY(stage_x16(x, ldx, T, W.cols, gemm_type(W)));
    return run_gemm(ws_.x16, T, W, y, core::DType::kF32, ldy);
  }
  for (int64_t t0 = 0; t0 < T; t0 += kGemvMaxRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kGemvMaxRows, T - t0));
    // Above kGemvSimtRows rows the tensor-core GEMV takes the activations in the weights' 16-bit type.
    const bool mma = !force_fp32 && !opt_.exact && half && rows > kGemvSimtRows && W.cols % 32 == 0 &&
                     static_cast<size_t>(rows * W.cols) <= ws_.x16_elems;
    if (mma) DF_CUDA_TRY(stage_x16(x + t0 * ldx, ldx, rows, W.cols, W.dtype));
    DF_CUDA_TRY(gemv(W.data, W.dtype, W.rows, W.cols, x + t0 * ldx, ldx, mma ? ws_.x16 : nullptr, rows,
                     GemvOut{y + t0 * ldy, ldy, swiglu, conv}, stream_));
  }
  return core::Status();
}

core::Status CudaBackend::gated_deltanet(const DLayer& L, int64_t n, std::span<const RowSegment> segs) {
  const auto& c = config_;
  const int64_t H = c.hidden_size, C = c.linear_conv_dim(), vd = c.linear_value_dim(),
                nv = c.linear_num_value_heads;
  const int64_t P = C + vd + 2 * nv;
  const int K = static_cast<int>(c.linear_conv_kernel_dim);
  const bool one_decode = segs.size() == 1 && segs[0].decode;
  const bool one_prefill = segs.size() == 1 && !segs[0].decode && !segs[0].short_runs;
  // [q k v | z | b | a] = x @ in_proj^T, then the causal conv1d + SiLU of [q k v]. At decode of up to
  // kGemvSimtRows rows the conv is the GEMV's epilogue (gemv.cuh), one launch; the tensor-core GEMV's lanes
  // write many outputs each, and there the conv's dependent state loads cost more than a launch.
  float* conv_base = conv_states_ + L.type_index * conv_layer_;
  float* gdn_base = gdn_states_ + L.type_index * gdn_layer_;
  bool conv_done = false;
  if (one_decode && n <= kGemvSimtRows && L.in_proj.plain()) {
    prof_.mark("gdn in_proj+conv1d", stream_);
    const GemvConv conv{L.conv_w, K, C, conv_base, conv_slot_, ws_.slot, ws_.conv, C};
    DF_TRY(linear(ws_.xn, H, n, L.in_proj, ws_.proj, P, false, false, conv));
    conv_done = true;
  } else {
    prof_.mark("gdn in_proj", stream_);
    DF_TRY(linear(ws_.xn, H, n, L.in_proj, ws_.proj, P));
  }
  bool to16 = false;
  for (const RowSegment& sg : segs) {
    const int64_t r0 = sg.row0, m = sg.rows;
    float* proj = ws_.proj + r0 * P;
    if (!conv_done) {
      prof_.mark("gdn conv1d", stream_);
      if (sg.decode) {
        DF_CUDA_TRY(causal_conv1d_decode(proj, P, static_cast<int>(m), C, L.conv_w, K, conv_base, conv_slot_,
                                         ws_.slot + r0, ws_.conv + r0 * C, C, stream_));
      } else if (sg.short_runs) {
        DF_CUDA_TRY(causal_conv1d_runs(proj, P, m, C, L.conv_w, K, conv_base, conv_slot_, ws_.slot + r0,
                                       ws_.run0 + r0, ws_.snap + r0, ws_.conv + r0 * C, C, stream_));
      } else {
        // The slot from ws_.slot (the segment's rows all hold it): a verification graph serves any sequence.
        if (sg.row_snapshots)
          DF_CUDA_TRY(causal_conv1d_snapshots(proj, P, m, C, K, conv_base, conv_slot_, ws_.slot + r0,
                                              ws_.snap + r0, stream_));
        DF_CUDA_TRY(causal_conv1d_prefill(proj, P, m, C, L.conv_w, K, conv_base, conv_slot_, ws_.slot + r0,
                                          ws_.conv + r0 * C, C, stream_));
      }
    }
    prof_.mark(sg.decode ? "gdn decode" : sg.short_runs ? "gdn short runs" : "gdn prefill", stream_);
    GdnArgs g;
    g.conv = ws_.conv + r0 * C;
    g.ld_conv = C;
    g.z = proj + C;
    g.b = proj + C + vd;
    g.a = proj + C + vd + nv;
    g.ld_proj = P;
    g.A_log = L.A_log;
    g.dt_bias = L.dt_bias;
    g.norm_w = L.gdn_norm;
    g.nk = static_cast<int>(c.linear_num_key_heads);
    g.nv = static_cast<int>(nv);
    g.dk = static_cast<int>(c.linear_key_head_dim);
    g.dv = static_cast<int>(c.linear_value_head_dim);
    g.eps = static_cast<float>(c.rms_norm_eps);
    g.n_seqs = sg.decode ? static_cast<int>(m) : sg.short_runs ? sg.runs : 1;
    g.tokens_per_seq = sg.decode || sg.short_runs ? 1 : static_cast<int>(m);
    if (sg.short_runs) g.seq_start = ws_.runs + sg.runs_at;
    g.states = gdn_base;
    g.slot_stride = gdn_slot_;
    g.slots = ws_.slot + r0;
    g.out = ws_.gdn + r0 * vd;
    g.ld_out = vd;
    if (sg.row_snapshots) g.snap_slots = ws_.snap + r0;  // (kRowSnapshotRows < kGdnChunkLen: the token scan)
    if (!sg.decode && !sg.row_snapshots && !sg.short_runs && m >= kGdnChunkLen && ws_.gdn_chunk_bytes > 0) {
      // Fast-mode prefill: the chunked WY form on tensor cores; exact mode and decode keep the fp32 token
      // scan. When out_proj runs on cuBLASLt over this one segment, the gated norm writes its input
      // (x16_holds_) instead of ws_.gdn.
      to16 = one_prefill && L.out_proj.cols == vd && takes_gemm(n, L.out_proj);
      if (to16) {
        g.out16 = ws_.x16;
        g.out16_type = gemm_type(L.out_proj);
      }
      DF_CUDA_TRY(cuda::gated_deltanet_chunked(g, ws_.gdn_chunk, ws_.gdn_chunk_bytes, stream_));
    } else {
      DF_CUDA_TRY(cuda::gated_deltanet(g, stream_));
    }
    if (sg.snapshot >= 0) {
      // This layer's conv and delta-rule state after the segment, into the snapshot slot.
      DF_CUDA_TRY(cudaMemcpyAsync(conv_base + sg.snapshot * conv_slot_, conv_base + sg.slot * conv_slot_,
                                  static_cast<size_t>(conv_layer_) * 4, cudaMemcpyDeviceToDevice, stream_));
      DF_CUDA_TRY(cudaMemcpyAsync(gdn_base + sg.snapshot * gdn_slot_, gdn_base + sg.slot * gdn_slot_,
                                  static_cast<size_t>(gdn_layer_) * 4, cudaMemcpyDeviceToDevice, stream_));
    }
  }
  x16_holds_ = to16 ? X16Holds{ws_.gdn, n, vd, gemm_type(L.out_proj)} : X16Holds{};
  prof_.mark("gdn out_proj", stream_);
  return linear(ws_.gdn, vd, n, L.out_proj, ws_.y, H);
}

KvCache CudaBackend::kv_view(int64_t type_index) const {
  const size_t es = kv_elem_bytes();
  KvCache kv;
  kv.k = static_cast<uint8_t*>(k_cache_) + static_cast<size_t>(type_index * kv_layer_) * es;
  kv.v = static_cast<uint8_t*>(v_cache_) + static_cast<size_t>(type_index * kv_layer_) * es;
  kv.f32 = plan_.kv_f32;
  if (plan_.kv_fp8) {
    kv.fp8 = true;
    kv.k_scale = k_scale_ + type_index * kv_layer_ / config_.head_dim;
    kv.v_scale = v_scale_ + type_index * kv_layer_ / config_.head_dim;
  }
  kv.slot_stride = kv_slot_;
  kv.max_ctx = plan_.max_context;
  if (block_table_) {
    kv.block_table = block_table_;
    kv.table_stride = table_stride_;
    kv.page_shift = 4;
    static_assert(kPageSize == 16, "page_shift is log2(kPageSize)");
  }
  return kv;
}

core::Status CudaBackend::full_attention(const DLayer& L, int64_t n, std::span<const RowSegment> segs) {
  const auto& c = config_;
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd, Q = nh * qw + 2 * nkv * hd;
  prof_.mark("attn qkv_proj", stream_);
  DF_TRY(linear(ws_.xn, H, n, L.qkv, ws_.proj, Q));
  prof_.mark("attn norm+rope", stream_);
  const KvCache kv = kv_view(L.type_index);

  QkvArgs qa;
  qa.qkv = ws_.proj;
  qa.ld = Q;
  qa.n_tokens = static_cast<int>(n);
  qa.nh = static_cast<int>(nh);
  qa.nkv = static_cast<int>(nkv);
  qa.hd = static_cast<int>(hd);
  qa.rot = static_cast<int>(c.rotary_dim());
  qa.gated = c.attn_output_gate;
  qa.q_norm = L.q_norm;
  qa.k_norm = L.k_norm;
  qa.eps = static_cast<float>(c.rms_norm_eps);
  qa.inv_freq = inv_freq_;
  qa.tok_pos = ws_.pos;
  qa.tok_slot = ws_.slot;
  qa.q_out = ws_.q;
  qa.cache = kv;
  DF_CUDA_TRY(qk_norm_rope_store(qa, stream_));

  // Attention per segment; consecutive prefill segments of one sequence together (the snapshots matter only
  // to the recurrent layers), and decode rows with the short runs after them, as decode rows, as many as the
  // split-attention partials hold.
  const auto decode_like = [](const RowSegment& s) { return s.decode || s.short_runs; };
  for (size_t i = 0; i < segs.size();) {
    const RowSegment& sg = segs[i];
    int64_t m = sg.rows;
    size_t j = i + 1;
    if (decode_like(sg)) {
      while (j < segs.size() && decode_like(segs[j]) && m + segs[j].rows <= decode_ws_rows_)
        m += segs[j++].rows;
    } else {
      while (j < segs.size() && !decode_like(segs[j]) && segs[j].slot == sg.slot) m += segs[j++].rows;
    }
    const int64_t r0 = sg.row0;
    AttnArgs aa;
    aa.q = ws_.q + r0 * nh * hd;
    aa.cache = kv;
    aa.n_tokens = static_cast<int>(m);
    aa.nh = static_cast<int>(nh);
    aa.nkv = static_cast<int>(nkv);
    aa.hd = static_cast<int>(hd);
    aa.tok_pos = ws_.pos + r0;
    aa.tok_slot = ws_.slot + r0;
    aa.prefill = !decode_like(sg);
    aa.max_splits = max_splits_;
    aa.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    aa.part_acc = ws_.part_acc;
    aa.part_ml = ws_.part_ml;
    if (c.attn_output_gate) {
      aa.gate = ws_.proj + r0 * Q + hd;  // per head [q | gate]
      aa.gate_ld = Q;
      aa.gate_head_stride = qw;
    }
    aa.out = ws_.attn + r0 * nh * hd;
    aa.dequant = ws_.kv_dequant;
    aa.dequant_elems = ws_.kv_dequant_elems;
    prof_.mark(decode_like(sg) ? "attn decode" : "attn prefill", stream_);
    DF_CUDA_TRY(attention(aa, stream_));
    i = j;
  }
  prof_.mark("attn o_proj", stream_);
  return linear(ws_.attn, nh * hd, n, L.o_proj, ws_.y, H);
}

core::Status CudaBackend::run_layer(const DLayer& L, int64_t n, std::span<const RowSegment> segs,
                                    const float* y_prev) {
  // h += the previous layer's output; xn = RMSNorm1p(h), for the one matmul that reads it
  prof_.mark("add+rmsnorm", stream_);
  const bool attn = L.type == LayerType::kFullAttention;
  DF_TRY(add_norm(y_prev, n, L.input_norm, attn ? &L.qkv : &L.in_proj));
  if (attn) {
    DF_TRY(full_attention(L, n, segs));
  } else {
    DF_TRY(gated_deltanet(L, n, segs));
  }
  DF_TRY(reduce_partial(ws_.y, n));  // after o_proj / out_proj (tensor parallel)
  prof_.mark("add+rmsnorm", stream_);
  // The MoE block reads xn in fp32 (router, expert rows); a dense FFN only through gate_up.
  DF_TRY(add_norm(ws_.y, n, L.post_norm, L.is_moe ? nullptr : &L.gate_up,
                  L.is_moe && L.experts_gu.quantized && n <= kDecodeMaxRows));
  DF_TRY(ffn(L, n));
  return reduce_partial(ws_.y, n);  // after down_proj / the MoE combine
}

core::Status CudaBackend::run_layers(int64_t n, std::span<const RowSegment> segs) {
  prof_.mark("embedding", stream_);
  DF_TRY(embed(n));
  for (size_t l = 0; l < layers_.size(); ++l)
    DF_TRY(run_layer(layers_[l], n, segs, l == 0 ? nullptr : ws_.y));
  prof_.mark("add+rmsnorm", stream_);
  DF_TRY(add_norm(ws_.y, n, final_norm_, nullptr));  // lm_head reads rows of xn
  prof_.mark("other", stream_);
  return core::Status();
}

core::Status CudaBackend::lm_head(int64_t r0, int64_t rows) {
  prof_.mark("lm_head", stream_);
  if (opt_.collective) return lm_head_shard(r0, rows);
  return linear(ws_.xn + r0 * config_.hidden_size, config_.hidden_size, rows, lm_head_, ws_.logits,
                config_.vocab_size);
}

// ---------------------------------------------------------------------------------------------------------------
// Entry points

core::Status CudaBackend::check_ids(std::span<const int32_t> tokens) const {
  const int64_t V = config_.vocab_size;
  for (int32_t id : tokens)
    if (id < 0 || id >= V)
      return core::Error{"token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(V) + ")"};
  return core::Status();
}

core::Status CudaBackend::check_snapshots(std::span<const StateSnapshot> snaps, int64_t n, int slot) const {
  for (const StateSnapshot& snap : snaps)
    if (snap.rows < 1 || snap.rows > n || snap.slot < 0 || snap.slot >= plan_.slots - 1 || snap.slot == slot)
      return core::Error{"step: a snapshot outside the run or the pool"};
  return core::Status();
}

void CudaBackend::fill_row_snapshots(int64_t row0, int64_t off, int64_t n,
                                     std::span<const StateSnapshot> snaps, int* row_snap) {
  std::fill_n(row_snap + row0, n, -1);
  for (const StateSnapshot& snap : snaps)
    if (snap.rows - off >= 1 && snap.rows - off <= n) row_snap[row0 + snap.rows - off - 1] = snap.slot;
}

bool CudaBackend::append_prefill_segments(int64_t row0, int64_t off, int64_t n, int slot,
                                          std::span<const StateSnapshot> snaps, int* row_snap,
                                          std::vector<RowSegment>& segs) {
  const auto inside = [&](const StateSnapshot& s) { return s.rows - off >= 1 && s.rows - off <= n; };
  if (n <= kRowSnapshotRows && std::any_of(snaps.begin(), snaps.end(), inside)) {
    fill_row_snapshots(row0, off, n, snaps, row_snap);
    segs.push_back({row0, n, false, slot, -1, true});
    return true;
  }
  int64_t r = 0;
  for (const StateSnapshot& snap : snaps) {
    const int64_t at = snap.rows - off;  // rows of this part before the snapshot
    if (at <= r || at > n) continue;
    segs.push_back({row0 + r, at - r, false, slot, snap.slot});
    r = at;
  }
  if (r < n) segs.push_back({row0 + r, n - r, false, slot, -1});
  return false;
}

core::Status CudaBackend::prefill_one(const PrefillItem& item, std::vector<float>& logits) {
  auto* s = dynamic_cast<CudaSequenceState*>(item.state);
  if (!s || s->owner != this) return core::Error{"cuda backend: sequence state from another backend"};
  if (s->slot < 0)
    return core::Error{"cuda backend: no free sequence slot (max_sequences " +
                       std::to_string(opt_.max_sequences) + ")"};
  const int64_t T = static_cast<int64_t>(item.tokens.size()), V = config_.vocab_size;
  if (T == 0) return core::Error{"forward: no tokens"};
  DF_TRY(check_ids(item.tokens));
  const int64_t limit = std::min<int64_t>(config_.max_position_embeddings, plan_.max_context);
  if (s->pos + T > limit)
    return core::Error{
        "sequence length " + std::to_string(s->pos + T) + " exceeds " +
        (limit == config_.max_position_embeddings ? "max_position_embeddings " : "the KV cache of ") +
        std::to_string(limit)};
  DF_TRY(check_snapshots(item.snapshots, T, s->slot));
  const int64_t R = max_rows_;
  // A speculative verification (every row's logits, up to kMaxDraftTokens + 1 rows, its snapshots inside
  // the one segment) replays the graph for its row count.
  if (opt_.cuda_graphs && !opt_.collective && item.all_logits && T >= 2 && T <= kMaxDraftTokens + 1 &&
      T <= std::min<int64_t>({R, kRowSnapshotRows, decode_ws_rows_})) {
    for (int64_t i = 0; i < T; ++i) {
      pinned_[i] = item.tokens[static_cast<size_t>(i)];
      pinned_[R + i] = static_cast<int>(s->pos + i);
      pinned_[2 * R + i] = s->slot;
      pinned_run0()[i] = 0;
    }
    pinned_runs()[0] = 0;
    pinned_runs()[1] = static_cast<int>(T);
    fill_row_snapshots(0, 0, T, item.snapshots, pinned_snap());
    if (cudaGraphExec_t g = verify_graph(static_cast<int>(T))) {
      DF_CUDA_TRY(cudaGraphLaunch(g, stream_));
      if (static_cast<int64_t>(keep_at_.size()) == T) DF_TRY(keep_hidden(keep_at_));
      const size_t at = logits.size();
      logits.resize(at + static_cast<size_t>(T * V));
      DF_CUDA_TRY(cudaMemcpyAsync(logits.data() + at, ws_.logits, static_cast<size_t>(T * V) * 4,
                                  cudaMemcpyDeviceToHost, stream_));
      DF_CUDA_TRY(cudaStreamSynchronize(stream_));
      s->pos += T;
      keep_at_.clear();
      return core::Status();
    }
  }
  std::vector<RowSegment> segs;
  for (int64_t off = 0; off < T; off += R) {
    const int64_t n = std::min(R, T - off);
    for (int64_t i = 0; i < n; ++i) {
      pinned_[i] = item.tokens[static_cast<size_t>(off + i)];
      pinned_[R + i] = static_cast<int>(s->pos + i);
      pinned_[2 * R + i] = s->slot;
    }
    segs.clear();
    DF_TRY(upload_rows(n, append_prefill_segments(0, off, n, s->slot, item.snapshots, pinned_snap(), segs)));
    DF_TRY(run_layers(n, segs));
    if (static_cast<int64_t>(keep_at_.size()) == T)
      DF_TRY(keep_hidden(
          std::span<const int32_t>(keep_at_).subspan(static_cast<size_t>(off), static_cast<size_t>(n))));
    const bool last = off + n == T;
    const int64_t first = item.all_logits ? 0 : (last ? n - 1 : n);
    for (int64_t r0 = first; r0 < n; r0 += kLogitRows) {
      const int64_t rows = std::min(kLogitRows, n - r0);
      DF_TRY(lm_head(r0, rows));
      const size_t at = logits.size();
      logits.resize(at + static_cast<size_t>(rows * V));
      DF_CUDA_TRY(cudaMemcpyAsync(logits.data() + at, ws_.logits, static_cast<size_t>(rows * V) * 4,
                                  cudaMemcpyDeviceToHost, stream_));
    }
    DF_CUDA_TRY(cudaStreamSynchronize(stream_));  // the staging buffers are reused by the next chunk
    DF_TRY(prof_.flush(stream_));
    s->pos += n;
  }
  keep_at_.clear();
  return core::Status();
}

core::Status CudaBackend::prefill(std::span<const PrefillItem> items, std::vector<float>& logits) {
  logits.clear();
  for (const auto& it : items) DF_TRY(prefill_one(it, logits));
  return core::Status();
}

core::Status CudaBackend::upload_rows(int64_t n, bool snaps, int64_t n_runs) {
  const int64_t R = max_rows_;
  const size_t b = static_cast<size_t>(n) * 4;
  DF_CUDA_TRY(cudaMemcpyAsync(ws_.ids, pinned_, b, cudaMemcpyHostToDevice, stream_));
  DF_CUDA_TRY(cudaMemcpyAsync(ws_.pos, pinned_ + R, b, cudaMemcpyHostToDevice, stream_));
  DF_CUDA_TRY(cudaMemcpyAsync(ws_.slot, pinned_ + 2 * R, b, cudaMemcpyHostToDevice, stream_));
  if (snaps) DF_CUDA_TRY(cudaMemcpyAsync(ws_.snap, pinned_snap(), b, cudaMemcpyHostToDevice, stream_));
  if (n_runs > 0) {
    DF_CUDA_TRY(cudaMemcpyAsync(ws_.run0, pinned_run0(), b, cudaMemcpyHostToDevice, stream_));
    DF_CUDA_TRY(cudaMemcpyAsync(ws_.runs, pinned_runs(), static_cast<size_t>(n_runs + 1) * 4,
                                cudaMemcpyHostToDevice, stream_));
  }
  return core::Status();
}

core::Status CudaBackend::enqueue_decode(int bucket) {
  const int64_t R = max_rows_;
  const size_t b = static_cast<size_t>(bucket) * 4;
  DF_TRY(upload_rows(bucket, false));
  const RowSegment rows{0, bucket, true, -1, -1};
  DF_TRY(run_layers(bucket, std::span<const RowSegment>(&rows, 1)));
  DF_TRY(lm_head(0, bucket));
  prof_.mark("argmax", stream_);
  DF_CUDA_TRY(argmax_rows(ws_.logits, bucket, config_.vocab_size, ws_.out_ids, stream_));
  DF_CUDA_TRY(cudaMemcpyAsync(pinned_ + 3 * R, ws_.out_ids, b, cudaMemcpyDeviceToHost, stream_));
  return core::Status();
}

core::Status CudaBackend::enqueue_verify(int T) {
  DF_TRY(upload_rows(T, true, short_runs_ ? 1 : 0));
  // One short run, or one prefill segment with row snapshots (its slot read from ws_.slot either way: any
  // sequence replays it).
  const RowSegment rows =
      short_runs_ ? RowSegment{0, T, false, -1, -1, true, true, 1, 0} : RowSegment{0, T, false, -1, -1, true};
  DF_TRY(run_layers(T, std::span<const RowSegment>(&rows, 1)));
  return lm_head(0, T);
}

core::Status CudaBackend::decode_impl(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                                      std::vector<float>* logits, std::vector<int32_t>* ids) {
  if (seqs.size() != tokens.size()) return core::Error{"decode: one token per sequence"};
  const int64_t V = config_.vocab_size, n = static_cast<int64_t>(seqs.size());
  DF_TRY(check_ids(tokens));
  const int64_t limit = std::min<int64_t>(config_.max_position_embeddings, plan_.max_context);
  std::vector<CudaSequenceState*> ss;
  for (auto* s : seqs) {
    auto* cs = dynamic_cast<CudaSequenceState*>(s);
    if (!cs || cs->owner != this) return core::Error{"cuda backend: sequence state from another backend"};
    if (cs->slot < 0)
      return core::Error{"cuda backend: no free sequence slot (max_sequences " +
                         std::to_string(opt_.max_sequences) + ")"};
    if (cs->pos + 1 > limit)
      return core::Error{"sequence length " + std::to_string(cs->pos + 1) + " exceeds " +
                         std::to_string(limit)};
    ss.push_back(cs);
  }
  for (size_t i = 0; i < ss.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (ss[i] == ss[j]) return core::Error{"decode: a sequence appears twice in one batch"};
  if (logits) {
    logits->clear();
    logits->resize(static_cast<size_t>(n * V));
  }
  if (ids) ids->clear();
  const int64_t R = max_rows_;
  for (int64_t g0 = 0; g0 < n; g0 += decode_rows_) {
    const int64_t m = std::min<int64_t>(decode_rows_, n - g0);
    const int bi = bucket_index(m), B = kBuckets[bi];
    for (int64_t r = 0; r < B; ++r) {
      const bool real = r < m;
      pinned_[r] = real ? tokens[static_cast<size_t>(g0 + r)] : 0;
      pinned_[R + r] = real ? static_cast<int>(ss[static_cast<size_t>(g0 + r)]->pos) : 0;
      pinned_[2 * R + r] = real ? ss[static_cast<size_t>(g0 + r)]->slot : scratch_slot_;
    }
    if (opt_.cuda_graphs && graphs_[static_cast<size_t>(bi)]) {
      DF_CUDA_TRY(cudaGraphLaunch(graphs_[static_cast<size_t>(bi)], stream_));
    } else {
      DF_TRY(enqueue_decode(B));
    }
    if (static_cast<int64_t>(keep_at_.size()) == n)
      DF_TRY(keep_hidden(
          std::span<const int32_t>(keep_at_).subspan(static_cast<size_t>(g0), static_cast<size_t>(m))));
    if (logits)
      DF_CUDA_TRY(cudaMemcpyAsync(logits->data() + g0 * V, ws_.logits, static_cast<size_t>(m * V) * 4,
                                  cudaMemcpyDeviceToHost, stream_));
    DF_CUDA_TRY(cudaStreamSynchronize(stream_));
    DF_TRY(prof_.flush(stream_));
    if (ids)
      for (int64_t r = 0; r < m; ++r) ids->push_back(pinned_[3 * R + r]);
    for (int64_t r = 0; r < m; ++r) ss[static_cast<size_t>(g0 + r)]->pos += 1;
  }
  keep_at_.clear();
  return core::Status();
}

core::Status CudaBackend::decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                                 std::vector<float>& logits) {
  return decode_impl(seqs, tokens, &logits, nullptr);
}

core::Status CudaBackend::decode_greedy(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                                        std::vector<int32_t>& ids) {
  return decode_impl(seqs, tokens, nullptr, &ids);
}

core::Status CudaBackend::decode_sample(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                                        std::span<const SamplingSpec> specs, std::vector<int32_t>& ids) {
  if (specs.size() != seqs.size()) return core::Error{"decode_sample: one sampling spec per sequence"};
  if (std::all_of(specs.begin(), specs.end(), [](const SamplingSpec& s) { return s.is_plain_greedy(); }))
    return decode_impl(seqs, tokens, nullptr, &ids);
  if (!sampling_) sampling_ = std::make_unique<SamplingBatch>();
  ids.clear();
  // decode_impl leaves the last group's logits in ws_.logits, so sample group by group.
  const size_t group = static_cast<size_t>(decode_rows_);
  const std::vector<int32_t> keep = std::move(keep_at_);
  for (size_t g0 = 0; g0 < seqs.size(); g0 += group) {
    const size_t m = std::min<size_t>(group, seqs.size() - g0);
    keep_at_.clear();
    if (keep.size() == seqs.size())
      keep_at_.assign(keep.begin() + static_cast<std::ptrdiff_t>(g0),
                      keep.begin() + static_cast<std::ptrdiff_t>(g0 + m));
    DF_TRY(decode_impl(seqs.subspan(g0, m), tokens.subspan(g0, m), nullptr, nullptr));
    DF_TRY(sampling_->run(ws_.logits, config_.vocab_size, specs.subspan(g0, m), stream_, ids));
  }
  return core::Status();
}

core::Status CudaBackend::sample_logits(std::span<const float> logits, std::span<const SamplingSpec> specs,
                                        std::vector<int32_t>& ids) {
  const size_t V = static_cast<size_t>(config_.vocab_size);
  if (logits.size() != specs.size() * V) return core::Error{"sample_logits: one logits row per spec"};
  if (!sampling_) sampling_ = std::make_unique<SamplingBatch>();
  ids.clear();
  const size_t cap = static_cast<size_t>(kLogitRows);  // rows of ws_.logits
  for (size_t r0 = 0; r0 < specs.size(); r0 += cap) {
    const size_t m = std::min(cap, specs.size() - r0);
    DF_CUDA_TRY(
        cudaMemcpyAsync(ws_.logits, logits.data() + r0 * V, m * V * 4, cudaMemcpyHostToDevice, stream_));
    DF_TRY(sampling_->run(ws_.logits, config_.vocab_size, specs.subspan(r0, m), stream_, ids));
  }
  return core::Status();
}

}  // namespace deltaflow::backend::cuda
