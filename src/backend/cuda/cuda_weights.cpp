#include "backend/cuda/cuda_weights.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "backend/cpu/ops.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/elementwise.cuh"
#include "backend/quant_pack.hpp"
#include "model/rope.hpp"

namespace deltaflow::backend::cuda {

using model::LayerType;

namespace {

constexpr size_t kStagingBytes = 32u << 20;

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

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
      DMat q = synthetic_quant(rows, cols, scale, fp8 ? (quant_ == "fp8-block" ? 128 : 0) : -1, gate_up);
      // nvfp4-mixed's FP8 projections carry a static input scale, as ModelOpt's do (amax 6 here: the
      // normed activations of random weights). The grid is one value (fill_quant_random), as per tensor.
      if (fp8 && quant_ == "nvfp4-mixed" && rows % 128 == 0 && cols % 128 == 0) q.input_scale = 6.0f / 448.0f;
      return q;
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

  // A packed matrix's shape and format as a DMat, before its arrays are placed.
  static DMat quant_header(const PackedQuant& p) {
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
    if (!nv) {
      q.grid_cols = p.grid_cols;
      q.block_rows = p.block_rows;
      q.block_cols = p.block_cols;
      m.input_scale = p.input_scale;
    }
    return m;
  }

  // Places a packed matrix: codes, then its scales, each region its own job.
  DMat place(PackedQuant p) {
    DMat m = quant_header(p);
    QuantWeight& q = m.q;
    q.codes = m.data = ptr(own(std::move(p.codes), p.codes_bytes));
    if (q.nvfp4) {
      q.scales = static_cast<const uint8_t*>(ptr(own(std::move(p.scales), p.scales_bytes)));
      q.row_scales = static_cast<const float*>(ptr(own_floats(p.row_scales, p.row_scales_n)));
    } else {
      q.grid = static_cast<const float*>(ptr(own_floats(p.grid, p.grid_n)));
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
    DMat m = quant_header(p0);
    QuantWeight& q = m.q;
    q.codes = m.data = ptr(own(cat(&PackedQuant::codes, p0.codes_bytes), p0.codes_bytes * E));
    q.codes_stride = static_cast<int64_t>(p0.codes_bytes);
    if (q.nvfp4) {
      q.scales = static_cast<const uint8_t*>(
          ptr(own(cat(&PackedQuant::scales, p0.scales_bytes), p0.scales_bytes * E)));
      q.row_scales = static_cast<const float*>(
          ptr(own(cat(&PackedQuant::row_scales, p0.row_scales_n * 4), p0.row_scales_n * 4 * E)));
      q.scales_stride = static_cast<int64_t>(p0.scales_bytes);
      q.row_stride = static_cast<int64_t>(p0.row_scales_n);
    } else {
      q.grid = static_cast<const float*>(ptr(own(cat(&PackedQuant::grid, p0.grid_n * 4), p0.grid_n * 4 * E)));
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

// One decoder layer of `type` (type_index: its index among the layers of that type); lw == nullptr:
// synthetic.
core::Expected<DLayer> lay_out_layer(const model::TextConfig& c, const model::LayerWeights* lw, Layout& lay,
                                     LayerType type, bool is_moe, int64_t type_index,
                                     const std::string& what) {
  const int64_t H = c.hidden_size;
  const float hs = 1.0f / std::sqrt(static_cast<float>(H));
  auto one = [](const model::Mat& m) { return std::vector<const model::Mat*>{&m}; };
  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads, dk = c.linear_key_head_dim;
  const int64_t dv = c.linear_value_head_dim, C = c.linear_conv_dim(), vd = c.linear_value_dim();
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd;
  (void)nk;
  (void)dk;
  DLayer L;
  L.type = type;
  L.is_moe = is_moe;
  L.input_norm = lay.vec(lw ? &lw->input_layernorm : nullptr, H, 0.1f, 0.0f);
  L.post_norm = lay.vec(lw ? &lw->post_attention_layernorm : nullptr, H, 0.1f, 0.0f);
  if (L.type == LayerType::kLinearAttention) {
    L.type_index = type_index;
    std::vector<const model::Mat*> parts;
    if (lw)
      parts = {&lw->linear.in_proj_qkv, &lw->linear.in_proj_z, &lw->linear.in_proj_b, &lw->linear.in_proj_a};
    DF_ASSIGN(L.in_proj, lay.mat(parts, C + vd + 2 * nv, H, hs, what + " in_proj", false, true));
    L.conv_w = lay.vec(lw ? &lw->linear.conv1d : nullptr, C * c.linear_conv_kernel_dim, 0.5f, 0.0f);
    L.dt_bias = lay.vec(lw ? &lw->linear.dt_bias : nullptr, nv, 0.2f, 1.0f);
    L.A_log = lay.vec(lw ? &lw->linear.A_log : nullptr, nv, 1.0f, 1.5f);
    L.gdn_norm = lay.vec(lw ? &lw->linear.norm : nullptr, dv, 0.1f, 1.0f);
    DF_ASSIGN(L.out_proj, lay.mat(lw ? one(lw->linear.out_proj) : std::vector<const model::Mat*>{}, H, vd,
                                  1.0f / std::sqrt(static_cast<float>(vd)), what + " out_proj", false, true));
  } else {
    L.type_index = type_index;
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
      DF_ASSIGN(L.shared_down,
                lay.mat(sdn, H, Is, 1.0f / std::sqrt(static_cast<float>(Is)), what + " shared expert down"));
      lay.set_float_only(false);
    }
  }
  return L;
}

// Lays out every weight of the model; w == nullptr: synthetic.
core::Status lay_out(const model::TextConfig& c, const model::ModelWeights* w, Layout& lay, DMat& embed,
                     DMat& lm_head, float*& final_norm, float*& inv_freq, std::vector<DLayer>& layers) {
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

  int64_t n_lin = 0, n_full = 0;
  layers.clear();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const model::LayerWeights* lw = w ? &w->layers[static_cast<size_t>(i)] : nullptr;
    const LayerType type = c.layer_types[static_cast<size_t>(i)];
    const int64_t index = type == LayerType::kLinearAttention ? n_lin++ : n_full++;
    DF_ASSIGN(DLayer L,
              lay_out_layer(c, lw, lay, type, c.layer_is_moe(i), index, "layer " + std::to_string(i)));
    layers.push_back(L);
  }
  return core::Status();
}

// The MTP head after the layers: its decoder layer is full attention number n_full (its KV store in a page).
core::Status lay_out_mtp(const model::TextConfig& c, const model::ModelWeights* w, Layout& lay, DMtp& m) {
  const int64_t H = c.hidden_size;
  const model::MtpWeights* mw = w ? &w->mtp : nullptr;
  m = {};
  if (mw ? !mw->present : c.mtp_num_hidden_layers < 1) return core::Status();
  m.norm_embedding = lay.vec(mw ? &mw->pre_fc_norm_embedding : nullptr, H, 0.1f, 0.0f);
  m.norm_hidden = lay.vec(mw ? &mw->pre_fc_norm_hidden : nullptr, H, 0.1f, 0.0f);
  std::vector<const model::Mat*> fc;
  if (mw) fc = {&mw->fc};
  DF_ASSIGN(m.fc, lay.mat(fc, H, 2 * H, 1.0f / std::sqrt(static_cast<float>(2 * H)), "mtp fc"));
  DF_ASSIGN(m.layer,
            lay_out_layer(c, mw ? &mw->layer : nullptr, lay, LayerType::kFullAttention, c.num_experts > 0,
                          c.count_layers(LayerType::kFullAttention), "mtp layer"));
  m.norm = lay.vec(mw ? &mw->norm : nullptr, H, 0.1f, 0.0f);
  m.present = true;
  return core::Status();
}

}  // namespace

core::Expected<PlacedWeights> lay_out_weights(const model::TextConfig& c, const WeightSource& src,
                                              uintptr_t base) {
  Layout lay(base, src.weights, src.synthetic_quant);
  lay.set_quant_experts(src.quant_experts);
  PlacedWeights p;
  DF_TRY(lay_out(c, src.weights, lay, p.embed, p.lm_head, p.final_norm, p.inv_freq, p.layers));
  if (src.mtp) DF_TRY(lay_out_mtp(c, src.weights, lay, p.mtp));
  p.bytes = lay.size();
  p.widened = lay.widened();
  p.jobs = std::move(lay.jobs());
  return p;
}

// Fills the weight allocation: uploads through two pinned staging buffers (copy engine busy while the CPU
// fills the other), or random fills on the GPU.
core::Status fill_weights(std::vector<Job>& jobs, uint8_t* base, uint64_t seed, bool progress,
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

}  // namespace deltaflow::backend::cuda
