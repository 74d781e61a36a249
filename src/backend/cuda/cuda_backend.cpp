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
constexpr size_t kStagingBytes = 32u << 20;

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// FP8 with 128 x 128 block scales: what the block-scaled FP8 GEMM takes (enable_fp8_gemms checks the rest).
bool fp8_block_scaled(const DMat& m) {
  return m.quantized && !m.q.nvfp4 && m.q.block_rows == 128 && m.q.block_cols == 128;
}

int bucket_index(int64_t n) {
  for (int i = 0; i < kNumBuckets; ++i)
    if (n <= kBuckets[i]) return i;
  return kNumBuckets - 1;
}

// What fills one region of the weight allocation: host bytes (mmap'd checkpoint), converted fp32 values, or
// random values (synthetic).
struct Job {
  size_t off = 0, bytes = 0;
  const void* src = nullptr;
  std::vector<float> f32;
  std::vector<uint8_t> owned;  // bytes made at load (quantized layouts, widened matrices)
  bool quant_random = false;   // synthetic quantized weights: fill_quant_random(qw)
  QuantWeight qw;
  bool random = false;
  core::DType dtype = core::DType::kBF16;
  int64_t n = 0;
  float scale = 0, shift = 0;
};

// Assigns offsets in one allocation. Run twice: first with base 0 to size it, then with the real base.
class Layout {
 public:
  Layout(uintptr_t base, const model::ModelWeights* w, std::string synthetic_quant = "")
      : base_(base), w_(w), quant_(std::move(synthetic_quant)) {}
  bool synthetic() const { return w_ == nullptr; }
  void set_float_only(bool f) { float_only_ = f; }
  // Routed experts may stay in their quantized layout (not in exact mode, nor sharded over GPUs).
  void set_quant_experts(bool q) { quant_experts_ = q; }
  // Bytes of quantized weights the float-only regions widened to bf16.
  uint64_t widened() const { return widened_; }
  size_t size() const { return size_; }
  std::vector<Job>& jobs() { return jobs_; }

  // A matrix made of the row blocks `parts` (one element type), or rows x cols of bf16 U(-scale, scale).
  // gate_up: parts are [gate | up] (NVFP4 tiles interleaved for the SwiGLU GEMV); attn: an attention or
  // Gated DeltaNet projection (what nvfp4-mixed keeps in FP8).
  core::Expected<DMat> mat(const std::vector<const model::Mat*>& parts, int64_t rows, int64_t cols,
                           float scale, const std::string& what, bool gate_up = false, bool attn = false) {
    DMat m;
    m.rows = rows;
    m.cols = cols;
    if (synthetic() && !quant_.empty() && !float_only_ && cols % kQuantTileCols == 0 && rows % 16 == 0) {
      const bool fp8 = quant_ == "fp8-block" || (quant_ == "nvfp4-mixed" && attn);
      return synthetic_quant(rows, cols, scale, fp8 ? (quant_ == "fp8-block" ? 128 : 0) : -1, gate_up);
    }
    if (synthetic()) {
      m.dtype = core::DType::kBF16;
      Job j;
      j.random = true;
      j.dtype = m.dtype;
      j.n = rows * cols;
      j.scale = scale;
      j.off = alloc(m.bytes());
      j.bytes = m.bytes();
      m.data = ptr(j.off);
      jobs_.push_back(std::move(j));
      return m;
    }
    if (parts.empty()) return core::Error{what + ": no tensor bound"};
    bool any_quant = false, mixed = false;
    for (const auto* p : parts) {
      any_quant |= p->quantized();
      mixed |= p->format != parts[0]->format || (!p->quantized() && p->dtype != parts[0]->dtype);
    }
    if (any_quant && float_only_) {
      widened_ += static_cast<uint64_t>(rows * cols) * 2;
      return widen(parts, rows, cols);
    }
    if (any_quant) return quant_mat(parts, rows, cols, what, gate_up, mixed);
    int64_t total = 0;
    m.dtype = parts[0]->dtype;
    for (const auto* p : parts) {
      if (p->cols != cols) return core::Error{what + ": expected " + std::to_string(cols) + " columns"};
      if (p->dtype != m.dtype)
        return core::Error{what + ": the tensors of one projection group have different dtypes"};
      total += p->rows;
    }
    if (total != rows) return core::Error{what + ": expected " + std::to_string(rows) + " rows in all"};
    size_t off = alloc(m.bytes());
    m.data = ptr(off);
    for (const auto* p : parts) {
      Job j;
      j.off = off;
      j.bytes = static_cast<size_t>(p->rows) * p->row_bytes();
      j.src = p->data;
      off += j.bytes;
      jobs_.push_back(std::move(j));
    }
    return m;
  }

  // n fp32 values: the tensor converted, or shift + scale * U(-1, 1).
  float* vec(const model::Mat* m, int64_t n, float scale, float shift) {
    Job j;
    j.bytes = static_cast<size_t>(n) * 4;
    j.off = alloc(j.bytes);
    if (synthetic()) {
      j.random = true;
      j.dtype = core::DType::kF32;
      j.n = n;
      j.scale = scale;
      j.shift = shift;
    } else {
      j.f32 = cpu::load_all(*m);
    }
    float* p = static_cast<float*>(ptr(j.off));
    jobs_.push_back(std::move(j));
    return p;
  }

  // Quantized members: one matrix in the kernels' layout when they stack (pack_quant); else, for a group the
  // GEMVs may keep apart, one DMat per member; else (a [gate | up] pair of different formats, a shape the
  // kernels do not take) the values widened to bf16 here, exactly as the CPU reference reads them.
  core::Expected<DMat> quant_mat(const std::vector<const model::Mat*>& parts, int64_t rows, int64_t cols,
                                 const std::string& what, bool gate_up, bool mixed) {
    int64_t total = 0;
    for (const auto* p : parts) {
      if (p->cols != cols) return core::Error{what + ": expected " + std::to_string(cols) + " columns"};
      total += p->rows;
    }
    if (total != rows) return core::Error{what + ": expected " + std::to_string(rows) + " rows in all"};
    if (!mixed) {
      const bool interleave = gate_up && parts[0]->format == model::quant::WeightFormat::kNvfp4;
      auto packed = pack_quant(parts, interleave, sizing_pass());
      if (packed) return place(std::move(*packed));
    }
    if (!gate_up && parts.size() > 1) {
      // Separate matmuls into one output, one per run of consecutive members of one format (nvfp4-mixed's
      // in_proj: [in_proj_qkv | in_proj_z] in FP8, then [in_proj_b | in_proj_a] in bf16: two launches).
      DMat m;
      m.rows = rows;
      m.cols = cols;
      m.dtype = core::DType::kBF16;
      const auto same_kind = [](const model::Mat& a, const model::Mat& b) {
        return a.quantized() ? b.quantized() && a.format == b.format : !b.quantized() && a.dtype == b.dtype;
      };
      std::vector<std::vector<const model::Mat*>> runs;
      for (const auto* p : parts) {
        if (runs.empty() || !same_kind(*runs.back()[0], *p)) runs.emplace_back();
        runs.back().push_back(p);
      }
      if (runs.size() == 1) {  // one format that does not stack: each member alone
        runs.clear();
        for (const auto* p : parts) runs.push_back({p});
      }
      for (const auto& run : runs) {
        int64_t run_rows = 0;
        for (const auto* p : run) run_rows += p->rows;
        DF_ASSIGN(DMat d, mat(run, run_rows, cols, 0.0f, what));
        m.parts.push_back(std::move(d));
      }
      return m;
    }
    return widen(parts, rows, cols);
  }

  core::Expected<DMat> widen(const std::vector<const model::Mat*>& parts, int64_t rows, int64_t cols) {
    DMat m;
    m.rows = rows;
    m.cols = cols;
    m.dtype = core::DType::kBF16;
    Job j;
    j.bytes = m.bytes();
    j.off = alloc(j.bytes);
    m.data = ptr(j.off);
    if (!sizing_pass()) {
      j.owned.resize(j.bytes);
      auto* out = reinterpret_cast<uint16_t*>(j.owned.data());
      std::vector<float> row(static_cast<size_t>(cols));
      int64_t r0 = 0;
      for (const auto* p : parts) {
        for (int64_t r = 0; r < p->rows; ++r) {
          cpu::load_row(*p, r, row.data());
          for (int64_t k = 0; k < cols; ++k)
            out[(r0 + r) * cols + k] = core::f32_to_bf16(row[static_cast<size_t>(k)]);
        }
        r0 += p->rows;
      }
    }
    jobs_.push_back(std::move(j));
    return m;
  }

  // Whether the routed experts' [gate | up] (gate_up) or down matrices, `per[e]` the parts of expert e,
  // rows x cols each, can keep a quantized layout: every expert quantized alike and packing alike.
  bool experts_pack(const std::vector<std::vector<const model::Mat*>>& per, int64_t E, int64_t rows,
                    int64_t cols, bool gate_up) const {
    if (!quant_experts_) return false;
    if (synthetic()) return !quant_.empty() && cols % kQuantTileCols == 0 && rows % 128 == 0;
    if (static_cast<int64_t>(per.size()) != E || E == 0) return false;
    std::optional<PackedQuant> first;
    for (const auto& g : per) {
      for (const auto* p : g)
        if (!p->quantized() || p->format != per[0][0]->format) return false;
      const bool interleave = gate_up && g[0]->format == model::quant::WeightFormat::kNvfp4;
      auto pq = pack_quant(g, interleave, true);
      if (!pq || pq->rows != rows || (first && !same_layout(*pq, *first))) return false;
      if (!first) first = std::move(*pq);
    }
    return true;
  }

  // Those matrices: with `quant` (experts_pack said so) in the kernels' layout, QuantWeight's grouped form
  // (expert e's codes, scales, row scales and grid at fixed strides; the DMat is one expert's view); else
  // one matrix of E * rows rows through mat() under float_only (float, or quantized widened to bf16).
  core::Expected<DMat> experts(const std::vector<std::vector<const model::Mat*>>& per, int64_t E,
                               int64_t rows, int64_t cols, float scale, const std::string& what, bool gate_up,
                               bool quant) {
    if (quant && synthetic()) {
      const bool fp8 = quant_ == "fp8-block";
      DMat m = synthetic_quant(E * rows, cols, scale, fp8 ? 128 : -1, gate_up);
      m.rows = rows;
      m.q.N = rows;
      if (fp8) {
        m.q.codes_stride = rows * cols;
        m.q.grid_stride = rows / m.q.block_rows * m.q.grid_cols;
      } else {
        m.q.codes_stride = nvfp4_padded_rows(rows) * cols / 2;
        m.q.scales_stride = nvfp4_scales_bytes(rows, cols);
        m.q.row_stride = rows;
      }
      return m;
    }
    if (quant) {
      std::vector<PackedQuant> packs;
      for (const auto& g : per) {
        const bool interleave = gate_up && g[0]->format == model::quant::WeightFormat::kNvfp4;
        DF_ASSIGN(PackedQuant pq, pack_quant(g, interleave, sizing_pass()));
        packs.push_back(std::move(pq));
      }
      return place_experts(std::move(packs));
    }
    std::vector<const model::Mat*> parts;
    for (const auto& g : per) parts.insert(parts.end(), g.begin(), g.end());
    const bool was = float_only_;
    float_only_ = true;
    auto m = mat(parts, E * rows, cols, scale, what);
    float_only_ = was;
    return m;
  }

  // Places a packed matrix: codes, then its scales, each region its own job.
  DMat place(PackedQuant p) {
    DMat m;
    m.rows = p.rows;
    m.cols = p.cols;
    m.quantized = true;
    const bool nv = p.format == model::quant::WeightFormat::kNvfp4;
    m.dtype = nv ? core::DType::kU8 : core::DType::kF8E4M3;
    QuantWeight& q = m.q;
    q.nvfp4 = nv;
    q.N = p.rows;
    q.K = p.cols;
    q.interleave = p.interleave;
    q.codes = m.data = ptr(own(std::move(p.codes), p.codes_bytes));
    if (nv) {
      q.scales = static_cast<const uint8_t*>(ptr(own(std::move(p.scales), p.scales_bytes)));
      q.row_scales = static_cast<const float*>(ptr(own_floats(p.row_scales, p.row_scales_n)));
    } else {
      q.grid = static_cast<const float*>(ptr(own_floats(p.grid, p.grid_n)));
      q.grid_cols = p.grid_cols;
      q.block_rows = p.block_rows;
      q.block_cols = p.block_cols;
    }
    return m;
  }

  // Places the experts' packed matrices one after another in each array: codes, then scales and row scales
  // (NVFP4) or the grid (FP8), expert e at e times one expert's size.
  DMat place_experts(std::vector<PackedQuant> packs) {
    const PackedQuant& p0 = packs[0];
    const size_t E = packs.size();
    auto cat = [&](auto member, size_t n) {
      std::vector<uint8_t> out;
      if (sizing_pass()) return out;
      out.reserve(n * E);
      for (const auto& p : packs) {
        const auto& v = p.*member;
        const auto* b = reinterpret_cast<const uint8_t*>(v.data());
        out.insert(out.end(), b, b + n);
      }
      return out;
    };
    DMat m;
    m.rows = p0.rows;
    m.cols = p0.cols;
    m.quantized = true;
    const bool nv = p0.format == model::quant::WeightFormat::kNvfp4;
    m.dtype = nv ? core::DType::kU8 : core::DType::kF8E4M3;
    QuantWeight& q = m.q;
    q.nvfp4 = nv;
    q.N = p0.rows;
    q.K = p0.cols;
    q.interleave = p0.interleave;
    q.codes = m.data = ptr(own(cat(&PackedQuant::codes, p0.codes_bytes), p0.codes_bytes * E));
    q.codes_stride = static_cast<int64_t>(p0.codes_bytes);
    if (nv) {
      q.scales = static_cast<const uint8_t*>(
          ptr(own(cat(&PackedQuant::scales, p0.scales_bytes), p0.scales_bytes * E)));
      q.row_scales = static_cast<const float*>(
          ptr(own(cat(&PackedQuant::row_scales, p0.row_scales_n * 4), p0.row_scales_n * 4 * E)));
      q.scales_stride = static_cast<int64_t>(p0.scales_bytes);
      q.row_stride = static_cast<int64_t>(p0.row_scales_n);
    } else {
      q.grid = static_cast<const float*>(ptr(own(cat(&PackedQuant::grid, p0.grid_n * 4), p0.grid_n * 4 * E)));
      q.grid_cols = p0.grid_cols;
      q.block_rows = p0.block_rows;
      q.block_cols = p0.block_cols;
      q.grid_stride = static_cast<int64_t>(p0.grid_n);
    }
    return m;
  }

  // Random quantized weights of rows x cols: NVFP4 (block < 0) or FP8 with 128 x 128 blocks (block 128) or
  // one scale per row (block 0); values near U(-scale, scale).
  DMat synthetic_quant(int64_t rows, int64_t cols, float scale, int block, bool gate_up) {
    DMat m;
    m.rows = rows;
    m.cols = cols;
    m.quantized = true;
    QuantWeight& q = m.q;
    q.nvfp4 = block < 0;
    q.N = rows;
    q.K = cols;
    q.interleave = q.nvfp4 && gate_up;
    m.dtype = q.nvfp4 ? core::DType::kU8 : core::DType::kF8E4M3;
    const size_t code_bytes =
        q.nvfp4 ? static_cast<size_t>(nvfp4_padded_rows(rows) * cols / 2) : static_cast<size_t>(rows * cols);
    q.codes = m.data = ptr(alloc(code_bytes));
    size_t total = code_bytes;
    if (q.nvfp4) {
      const auto scale_bytes = static_cast<size_t>(nvfp4_scales_bytes(rows, cols));
      q.scales = static_cast<const uint8_t*>(ptr(alloc(scale_bytes)));
      q.row_scales = static_cast<const float*>(ptr(alloc(static_cast<size_t>(rows) * 4)));
      total += scale_bytes + static_cast<size_t>(rows) * 4;
    } else {
      q.block_rows = block > 0 ? block : 1;
      q.block_cols = block > 0 ? block : cols;
      q.grid_cols = (cols + q.block_cols - 1) / q.block_cols;
      const int64_t n = (rows + q.block_rows - 1) / q.block_rows * q.grid_cols;
      q.grid = static_cast<const float*>(ptr(alloc(static_cast<size_t>(n) * 4)));
      total += static_cast<size_t>(n) * 4;
    }
    Job j;
    j.quant_random = true;
    j.qw = q;
    j.scale = scale;
    j.bytes = total;
    jobs_.push_back(std::move(j));
    return m;
  }

  float* values(std::vector<float> v) {
    Job j;
    j.bytes = v.size() * 4;
    j.off = alloc(j.bytes);
    j.f32 = std::move(v);
    float* p = static_cast<float*>(ptr(j.off));
    jobs_.push_back(std::move(j));
    return p;
  }

 private:
  size_t alloc(size_t bytes) {
    const size_t off = align_up(size_, 256);
    size_ = off + bytes;
    return off;
  }
  void* ptr(size_t off) const { return reinterpret_cast<void*>(base_ + off); }

  // The sizing pass (base 0) only counts bytes: it makes no host copies.
  bool sizing_pass() const { return base_ == 0; }
  // `bytes` (empty in the sizing pass) of `n` bytes.
  size_t own(std::vector<uint8_t> bytes, size_t n) {
    Job j;
    j.bytes = n;
    j.off = alloc(j.bytes);
    j.owned = std::move(bytes);
    const size_t off = j.off;
    jobs_.push_back(std::move(j));
    return off;
  }
  size_t own_floats(const std::vector<float>& v, size_t n) {
    std::vector<uint8_t> b(v.size() * 4);
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
    return own(std::move(b), n * 4);
  }

  uintptr_t base_;
  const model::ModelWeights* w_;
  std::string quant_;
  bool float_only_ = false;
  bool quant_experts_ = true;
  uint64_t widened_ = 0;
  size_t size_ = 0;
  std::vector<Job> jobs_;
};

// Expert e of a quantized stack (QuantWeight's grouped form) as a matrix of its own.
DMat expert_view(const DMat& stack, int64_t e) {
  DMat v = stack;
  QuantWeight& q = v.q;
  q.codes = static_cast<const uint8_t*>(q.codes) + e * q.codes_stride;
  if (q.scales) q.scales += e * q.scales_stride;
  if (q.row_scales) q.row_scales += e * q.row_stride;
  if (q.grid) q.grid += e * q.grid_stride;
  q.codes_stride = q.scales_stride = q.row_stride = q.grid_stride = 0;
  v.data = q.codes;
  return v;
}

// Lays out every weight of the model; w == nullptr: synthetic.
core::Status lay_out_weights(const model::TextConfig& c, const model::ModelWeights* w, Layout& lay,
                             DMat& embed, DMat& lm_head, float*& final_norm, float*& inv_freq,
                             std::vector<DLayer>& layers) {
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float hs = 1.0f / std::sqrt(static_cast<float>(H));
  auto one = [](const model::Mat& m) { return std::vector<const model::Mat*>{&m}; };
  lay.set_float_only(true);  // the embedding gather reads 16-bit rows
  DF_ASSIGN(embed,
            lay.mat(w ? one(w->embed_tokens) : std::vector<const model::Mat*>{}, V, H, 1.0f, "embed_tokens"));
  lay.set_float_only(false);
  if (c.tie_word_embeddings) {
    lm_head = embed;
  } else {
    DF_ASSIGN(lm_head, lay.mat(w ? one(w->lm_head) : std::vector<const model::Mat*>{}, V, H, hs, "lm_head"));
  }
  final_norm = lay.vec(w ? &w->norm : nullptr, H, 0.1f, 0.0f);
  // RoPE frequencies from rope_parameters, as transformers (and the CPU backend) compute them.
  std::vector<float> f = model::rope_frequencies(c).inv_freq;
  if (f.empty()) f.push_back(0.0f);
  inv_freq = lay.values(std::move(f));

  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads, dk = c.linear_key_head_dim;
  const int64_t dv = c.linear_value_head_dim, C = c.linear_conv_dim(), vd = c.linear_value_dim();
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd;
  (void)nk;
  (void)dk;
  int64_t n_lin = 0, n_full = 0;
  layers.clear();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const model::LayerWeights* lw = w ? &w->layers[static_cast<size_t>(i)] : nullptr;
    const std::string what = "layer " + std::to_string(i);
    DLayer L;
    L.type = c.layer_types[static_cast<size_t>(i)];
    L.is_moe = c.layer_is_moe(i);
    L.input_norm = lay.vec(lw ? &lw->input_layernorm : nullptr, H, 0.1f, 0.0f);
    L.post_norm = lay.vec(lw ? &lw->post_attention_layernorm : nullptr, H, 0.1f, 0.0f);
    if (L.type == LayerType::kLinearAttention) {
      L.type_index = n_lin++;
      std::vector<const model::Mat*> parts;
      if (lw)
        parts = {&lw->linear.in_proj_qkv, &lw->linear.in_proj_z, &lw->linear.in_proj_b,
                 &lw->linear.in_proj_a};
      DF_ASSIGN(L.in_proj, lay.mat(parts, C + vd + 2 * nv, H, hs, what + " in_proj", false, true));
      L.conv_w = lay.vec(lw ? &lw->linear.conv1d : nullptr, C * c.linear_conv_kernel_dim, 0.5f, 0.0f);
      L.dt_bias = lay.vec(lw ? &lw->linear.dt_bias : nullptr, nv, 0.2f, 1.0f);
      L.A_log = lay.vec(lw ? &lw->linear.A_log : nullptr, nv, 1.0f, 1.5f);
      L.gdn_norm = lay.vec(lw ? &lw->linear.norm : nullptr, dv, 0.1f, 1.0f);
      DF_ASSIGN(L.out_proj,
                lay.mat(lw ? one(lw->linear.out_proj) : std::vector<const model::Mat*>{}, H, vd,
                        1.0f / std::sqrt(static_cast<float>(vd)), what + " out_proj", false, true));
    } else {
      L.type_index = n_full++;
      std::vector<const model::Mat*> parts;
      if (lw) parts = {&lw->attn.q_proj, &lw->attn.k_proj, &lw->attn.v_proj};
      DF_ASSIGN(L.qkv, lay.mat(parts, nh * qw + 2 * nkv * hd, H, hs, what + " q/k/v_proj", false, true));
      L.q_norm = lay.vec(lw ? &lw->attn.q_norm : nullptr, hd, 0.1f, 0.0f);
      L.k_norm = lay.vec(lw ? &lw->attn.k_norm : nullptr, hd, 0.1f, 0.0f);
      DF_ASSIGN(L.o_proj,
                lay.mat(lw ? one(lw->attn.o_proj) : std::vector<const model::Mat*>{}, H, nh * hd,
                        1.0f / std::sqrt(static_cast<float>(nh * hd)), what + " o_proj", false, true));
    }
    if (!L.is_moe) {
      const int64_t I = c.intermediate_size;
      std::vector<const model::Mat*> gu, dn;
      if (lw) {
        gu = {&lw->mlp.gate_proj, &lw->mlp.up_proj};
        dn = {&lw->mlp.down_proj};
      }
      DF_ASSIGN(L.gate_up, lay.mat(gu, 2 * I, H, hs, what + " gate/up_proj", true));
      DF_ASSIGN(L.down, lay.mat(dn, H, I, 1.0f / std::sqrt(static_cast<float>(I)), what + " down_proj"));
    } else {
      const int64_t E = c.num_experts, Im = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
      std::vector<const model::Mat*> r, sgu, sdn, sg;
      std::vector<std::vector<const model::Mat*>> gu, dn;  // per expert
      if (lw) {
        r = {&lw->moe.router};
        for (const auto& e : lw->moe.experts) {
          gu.push_back({&e.gate_proj, &e.up_proj});
          dn.push_back({&e.down_proj});
        }
        sgu = {&lw->moe.shared_expert.gate_proj, &lw->moe.shared_expert.up_proj};
        sdn = {&lw->moe.shared_expert.down_proj};
        sg = {&lw->moe.shared_expert_gate};
      }
      // The router stays in its float type (fp32 routing reads 16-bit rows; a quantized router is widened).
      // Quantized routed experts keep their layout for the grouped kernels (Layout::experts); then the shared
      // expert runs as a dense MLP in its own format. Else the 16-bit MoE kernels read everything, the shared
      // expert widened as well (load() says so).
      lay.set_float_only(true);
      // [router | shared_expert_gate] as one matrix, so that decode reads x once for both logits (when the
      // two share a dtype); router and shared_gate are views of it.
      if (!lw || lw->moe.router.dtype == lw->moe.shared_expert_gate.dtype) {
        std::vector<const model::Mat*> rg;
        if (lw) rg = {&lw->moe.router, &lw->moe.shared_expert_gate};
        DF_ASSIGN(L.router_gate, lay.mat(rg, E + 1, H, hs, what + " router/shared expert gate"));
        L.router = L.router_gate;
        L.router.rows = E;
        L.shared_gate = L.router_gate;
        L.shared_gate.rows = 1;
        L.shared_gate.data = static_cast<const uint8_t*>(L.router_gate.data) +
                             static_cast<size_t>(E * H) * core::dtype_size(L.router_gate.dtype);
      } else {
        DF_ASSIGN(L.router, lay.mat(r, E, H, hs, what + " router"));
        DF_ASSIGN(L.shared_gate, lay.mat(sg, 1, H, hs, what + " shared expert gate"));
      }
      lay.set_float_only(false);
      const bool qe = lay.experts_pack(gu, E, 2 * Im, H, true) && lay.experts_pack(dn, E, H, Im, false);
      // Quantized experts take the shared expert as expert E of their stacks when it has their shape and
      // layout (the published NVFP4 and FP8 checkpoints: one scheme for every MLP).
      if (qe && Is == Im) {
        auto gu1 = gu, dn1 = dn;
        if (lw) {
          gu1.push_back(sgu);
          dn1.push_back(sdn);
        }
        L.shared_in_stack =
            lay.experts_pack(gu1, E + 1, 2 * Im, H, true) && lay.experts_pack(dn1, E + 1, H, Im, false);
        if (L.shared_in_stack) {
          gu = std::move(gu1);
          dn = std::move(dn1);
        }
      }
      const int64_t Es = E + (L.shared_in_stack ? 1 : 0);
      DF_ASSIGN(L.experts_gu, lay.experts(gu, Es, 2 * Im, H, hs, what + " experts gate/up", true, qe));
      L.experts_gu.rows = 2 * Im;  // one expert's view; expert e at e * 2Im*H elements (or the strides)
      DF_ASSIGN(L.experts_down, lay.experts(dn, Es, H, Im, 1.0f / std::sqrt(static_cast<float>(Im)),
                                            what + " experts down", false, qe));
      L.experts_down.rows = H;
      if (L.shared_in_stack) {
        L.shared_gu = expert_view(L.experts_gu, E);
        L.shared_down = expert_view(L.experts_down, E);
      } else {
        lay.set_float_only(!qe);
        DF_ASSIGN(L.shared_gu, lay.mat(sgu, 2 * Is, H, hs, what + " shared expert gate/up", true));
        DF_ASSIGN(L.shared_down, lay.mat(sdn, H, Is, 1.0f / std::sqrt(static_cast<float>(Is)),
                                         what + " shared expert down"));
        lay.set_float_only(false);
      }
    }
    layers.push_back(L);
  }
  return core::Status();
}

// Fills the weight allocation: uploads through two pinned staging buffers (copy engine busy while the CPU
// fills the other), or random fills on the GPU.
core::Status run_jobs(std::vector<Job>& jobs, uint8_t* base, uint64_t seed, bool progress,
                      cudaStream_t stream) {
  size_t total = 0, done = 0;
  for (const auto& j : jobs) total += j.bytes;
  void* staging[2] = {nullptr, nullptr};
  cudaEvent_t ev[2] = {nullptr, nullptr};
  bool any_upload = false;
  for (const auto& j : jobs) any_upload |= !j.random && !j.quant_random;
  core::Status st;
  if (any_upload) {
    for (int i = 0; i < 2; ++i) {
      DF_CUDA_TRY(cudaHostAlloc(&staging[i], kStagingBytes, cudaHostAllocDefault));
      DF_CUDA_TRY(cudaEventCreateWithFlags(&ev[i], cudaEventDisableTiming));
    }
  }
  const bool bar = progress && isatty(2);
  int buf = 0, last_pct = -1;
  for (size_t k = 0; k < jobs.size() && st.is_ok(); ++k) {
    const Job& j = jobs[k];
    if (j.quant_random) {
      st = cuda_status(fill_quant_random(j.qw, seed * 1000003u + k, j.scale, stream), "fill_quant_random");
    } else if (j.random) {
      st = cuda_status(fill_random(base + j.off, j.dtype, j.n, seed * 1000003u + k, j.scale, j.shift, stream),
                       "fill_random");
    } else {
      const uint8_t* src =
          static_cast<const uint8_t*>(j.src              ? j.src
                                      : !j.owned.empty() ? static_cast<const void*>(j.owned.data())
                                                         : j.f32.data());
      for (size_t o = 0; o < j.bytes && st.is_ok(); o += kStagingBytes) {
        const size_t len = std::min(kStagingBytes, j.bytes - o);
        st = cuda_status(cudaEventSynchronize(ev[buf]), "staging");
        if (!st.is_ok()) break;
        std::memcpy(staging[buf], src + o, len);
        st = cuda_status(cudaMemcpyAsync(base + j.off + o, staging[buf], len, cudaMemcpyHostToDevice, stream),
                         "weight upload");
        if (st.is_ok()) st = cuda_status(cudaEventRecord(ev[buf], stream), "staging");
        buf ^= 1;
      }
    }
    done += j.bytes;
    const int pct =
        total ? static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total)) : 100;
    if (bar && pct != last_pct) {
      std::fprintf(stderr, "\rloading weights to the GPU: %3d%% (%.2f / %.2f GB)", pct, done / 1e9,
                   total / 1e9);
      last_pct = pct;
    }
  }
  if (bar) std::fprintf(stderr, "\n");
  const core::Status sync = cuda_status(cudaStreamSynchronize(stream), "weight upload");
  for (int i = 0; i < 2; ++i) {
    if (ev[i]) cudaEventDestroy(ev[i]);
    if (staging[i]) cudaFreeHost(staging[i]);
  }
  DF_TRY(st);
  return sync;
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
  Layout sizing(0, &w);
  sizing.set_quant_experts(!opt.exact && !opt.collective);
  DF_TRY(lay_out_weights(b->layout_config(), &w, sizing, b->embed_, b->lm_head_, b->final_norm_, b->inv_freq_,
                         b->layers_));
  DF_TRY(device_alloc(&b->weights_mem_, std::max<size_t>(sizing.size(), 256), "the weights",
                      "this model needs a larger GPU, or more GPUs (--tensor-parallel-size)"));
  b->plan_.weights = sizing.size();
  Layout lay(reinterpret_cast<uintptr_t>(b->weights_mem_), &w);
  lay.set_quant_experts(!opt.exact && !opt.collective);
  DF_TRY(lay_out_weights(b->layout_config(), &w, lay, b->embed_, b->lm_head_, b->final_norm_, b->inv_freq_,
                         b->layers_));
  if (lay.widened() > 0)
    std::fprintf(
        stderr,
        "note: quantized MoE matrices widened to bf16 at load (%.2f GB): a quantized router, and in exact "
        "mode, with --tensor-parallel-size or with experts of mixed layouts the routed and shared experts\n",
        static_cast<double>(lay.widened()) / 1e9);
  DF_TRY(run_jobs(lay.jobs(), static_cast<uint8_t*>(b->weights_mem_), 0, opt.progress, b->stream_));
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
  Layout sizing(0, nullptr, opt.synthetic_quant);
  sizing.set_quant_experts(!opt.exact && !opt.collective);
  DF_TRY(lay_out_weights(b->layout_config(), nullptr, sizing, b->embed_, b->lm_head_, b->final_norm_,
                         b->inv_freq_, b->layers_));
  DF_TRY(device_alloc(&b->weights_mem_, std::max<size_t>(sizing.size(), 256), "the weights",
                      "this model needs a larger GPU, or more GPUs (--tensor-parallel-size)"));
  b->plan_.weights = sizing.size();
  Layout lay(reinterpret_cast<uintptr_t>(b->weights_mem_), nullptr, opt.synthetic_quant);
  lay.set_quant_experts(!opt.exact && !opt.collective);
  DF_TRY(lay_out_weights(b->layout_config(), nullptr, lay, b->embed_, b->lm_head_, b->final_norm_,
                         b->inv_freq_, b->layers_));
  DF_TRY(run_jobs(lay.jobs(), static_cast<uint8_t*>(b->weights_mem_), seed, false, b->stream_));
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
  const int64_t Kmax = std::max({H, I, Im, Is, vd, nh * hd});
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
    fp8_block |= fp8_block_scaled(m);
    for (const DMat& p : m.parts) {
      if (p.quantized) wdq = std::max(wdq, static_cast<size_t>(p.rows * p.cols));
      fp8_block |= fp8_block_scaled(p);
    }
  };
  for (const DLayer& L : layers_)
    for (const DMat* m :
         {&L.in_proj, &L.out_proj, &L.qkv, &L.o_proj, &L.gate_up, &L.down, &L.shared_gu, &L.shared_down})
      widest(*m);
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
  // for the host-sorted MoE path)[output rows 256] (a fused step's rows that reach lm_head).
  static_assert(sizeof(GroupedTile) == 3 * sizeof(int));
  DF_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&pinned_),
                            static_cast<size_t>(3 * R + kDecodeMaxRows + 3 * RK + kLogitRows) * 4,
                            cudaHostAllocDefault));
  DF_CUDA_TRY(cudaStreamSynchronize(stream_));
  return core::Status();
}

core::Status CudaBackend::allocate_states(int slots, int64_t pages) {
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
    kv_slot_ = n_full * kv_layer_;
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
    const size_t n = static_cast<size_t>(slots * table_stride_);
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
           (W.fp8_gemm ? fp8_gemm_rows(T) <= std::min(ws_.x8_rows, max_rows_) && W.cols <= ws_.x8_cols
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
  if (W.quantized) return GemmCall{ws_.wdq, core::DType::kBF16, W.rows, W.cols, x16, T, y, y_type, ldy};
  return GemmCall{W.data, W.dtype, W.rows, W.cols, x16, T, y, y_type, ldy};
}

core::Status CudaBackend::run_gemm(const void* x16, int64_t T, const DMat& W, void* y, core::DType y_type,
                                   int64_t ldy) {
  if (W.fp8_gemm) {
    DF_CUDA_TRY(quantize_fp8_1x128(x16, W.cols, T, fp8_gemm_rows(T), W.cols, ws_.x8, ws_.x8_scale, stream_));
  } else if (W.quantized) {
    DF_CUDA_TRY(dequantize_bf16(W.q, ws_.wdq, stream_));
  }
  return gemm_.run(gemm_call(x16, T, W, y, y_type, ldy), stream_);
}

void CudaBackend::enable_fp8_gemms() {
  // Every output buffer of these matmuls holds max_rows_ rows (the FP8 GEMM writes T rounded up to 8).
  if (opt_.exact || !opt_.fp8_gemm || !gemm_.ready() || ws_.x8_rows == 0 || max_rows_ % 8 != 0) return;
  const auto enable = [&](DMat& m, void* y) {
    if (!fp8_block_scaled(m) || m.q.grid_cols * 128 != m.cols || m.cols % 512 != 0 || m.rows % 8 != 0 ||
        m.cols > ws_.x8_cols)
      return;
    m.fp8_gemm = true;
    // cuBLASLt's answer for a whole chunk; a build without the block-scaled FP8 GEMM keeps the bf16 copy.
    m.fp8_gemm = gemm_.supports(gemm_call(ws_.x16, max_rows_, m, y, core::DType::kF32, m.rows));
  };
  const auto each = [&](DMat& m, void* y) {
    enable(m, y);
    for (DMat& p : m.parts) enable(p, y);
  };
  for (DLayer& L : layers_) {
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
  const bool one_prefill = segs.size() == 1 && !segs[0].decode;
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
      } else {
        DF_CUDA_TRY(causal_conv1d_prefill(proj, P, m, C, L.conv_w, K, conv_base + sg.slot * conv_slot_,
                                          ws_.conv + r0 * C, C, stream_));
      }
    }
    prof_.mark(sg.decode ? "gdn decode" : "gdn prefill", stream_);
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
    g.n_seqs = sg.decode ? static_cast<int>(m) : 1;
    g.tokens_per_seq = sg.decode ? 1 : static_cast<int>(m);
    g.states = gdn_base;
    g.slot_stride = gdn_slot_;
    g.slots = ws_.slot + r0;
    g.out = ws_.gdn + r0 * vd;
    g.ld_out = vd;
    if (!sg.decode && m >= kGdnChunkLen && ws_.gdn_chunk_bytes > 0) {
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
  // to the recurrent layers).
  for (size_t i = 0; i < segs.size();) {
    const RowSegment& sg = segs[i];
    int64_t m = sg.rows;
    size_t j = i + 1;
    while (!sg.decode && j < segs.size() && !segs[j].decode && segs[j].slot == sg.slot) m += segs[j++].rows;
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
    aa.prefill = !sg.decode;
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
    prof_.mark(sg.decode ? "attn decode" : "attn prefill", stream_);
    DF_CUDA_TRY(attention(aa, stream_));
    i = j;
  }
  prof_.mark("attn o_proj", stream_);
  return linear(ws_.attn, nh * hd, n, L.o_proj, ws_.y, H);
}

core::Status CudaBackend::run_layers(int64_t n, std::span<const RowSegment> segs) {
  prof_.mark("embedding", stream_);
  DF_TRY(embed(n));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DLayer& L = layers_[l];
    // h += ffn output of the previous layer; xn = RMSNorm1p(h), for the one matmul that reads it
    prof_.mark("add+rmsnorm", stream_);
    const bool attn = L.type == LayerType::kFullAttention;
    DF_TRY(add_norm(l == 0 ? nullptr : ws_.y, n, L.input_norm, attn ? &L.qkv : &L.in_proj));
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
    DF_TRY(reduce_partial(ws_.y, n));  // after down_proj / the MoE combine
  }
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

void CudaBackend::append_prefill_segments(int64_t row0, int64_t off, int64_t n, int slot,
                                          std::span<const StateSnapshot> snaps,
                                          std::vector<RowSegment>& segs) {
  int64_t r = 0;
  for (const StateSnapshot& snap : snaps) {
    const int64_t at = snap.rows - off;  // rows of this part before the snapshot
    if (at <= r || at > n) continue;
    segs.push_back({row0 + r, at - r, false, slot, snap.slot});
    r = at;
  }
  if (r < n) segs.push_back({row0 + r, n - r, false, slot, -1});
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
  std::vector<RowSegment> segs;
  for (int64_t off = 0; off < T; off += R) {
    const int64_t n = std::min(R, T - off);
    for (int64_t i = 0; i < n; ++i) {
      pinned_[i] = item.tokens[static_cast<size_t>(off + i)];
      pinned_[R + i] = static_cast<int>(s->pos + i);
      pinned_[2 * R + i] = s->slot;
    }
    DF_CUDA_TRY(
        cudaMemcpyAsync(ws_.ids, pinned_, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
    DF_CUDA_TRY(
        cudaMemcpyAsync(ws_.pos, pinned_ + R, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
    DF_CUDA_TRY(cudaMemcpyAsync(ws_.slot, pinned_ + 2 * R, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice,
                                stream_));
    segs.clear();
    append_prefill_segments(0, off, n, s->slot, item.snapshots, segs);
    DF_TRY(run_layers(n, segs));
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
  return core::Status();
}

core::Status CudaBackend::prefill(std::span<const PrefillItem> items, std::vector<float>& logits) {
  logits.clear();
  for (const auto& it : items) DF_TRY(prefill_one(it, logits));
  return core::Status();
}

core::Status CudaBackend::enqueue_decode(int bucket) {
  const int64_t R = max_rows_;
  const size_t b = static_cast<size_t>(bucket) * 4;
  DF_CUDA_TRY(cudaMemcpyAsync(ws_.ids, pinned_, b, cudaMemcpyHostToDevice, stream_));
  DF_CUDA_TRY(cudaMemcpyAsync(ws_.pos, pinned_ + R, b, cudaMemcpyHostToDevice, stream_));
  DF_CUDA_TRY(cudaMemcpyAsync(ws_.slot, pinned_ + 2 * R, b, cudaMemcpyHostToDevice, stream_));
  const RowSegment rows{0, bucket, true, -1, -1};
  DF_TRY(run_layers(bucket, std::span<const RowSegment>(&rows, 1)));
  DF_TRY(lm_head(0, bucket));
  prof_.mark("argmax", stream_);
  DF_CUDA_TRY(argmax_rows(ws_.logits, bucket, config_.vocab_size, ws_.out_ids, stream_));
  DF_CUDA_TRY(cudaMemcpyAsync(pinned_ + 3 * R, ws_.out_ids, b, cudaMemcpyDeviceToHost, stream_));
  return core::Status();
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
    if (logits)
      DF_CUDA_TRY(cudaMemcpyAsync(logits->data() + g0 * V, ws_.logits, static_cast<size_t>(m * V) * 4,
                                  cudaMemcpyDeviceToHost, stream_));
    DF_CUDA_TRY(cudaStreamSynchronize(stream_));
    DF_TRY(prof_.flush(stream_));
    if (ids)
      for (int64_t r = 0; r < m; ++r) ids->push_back(pinned_[3 * R + r]);
    for (int64_t r = 0; r < m; ++r) ss[static_cast<size_t>(g0 + r)]->pos += 1;
  }
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
  for (size_t g0 = 0; g0 < seqs.size(); g0 += group) {
    const size_t m = std::min<size_t>(group, seqs.size() - g0);
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
