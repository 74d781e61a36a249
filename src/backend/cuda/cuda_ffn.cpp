// The feed-forward blocks of the CUDA backend's forward pass: the dense MLP (GEMV at decode, cuBLASLt in the
// weights' 16-bit type past it) and the MoE block (router, top-k, the routed experts in 16-bit or in their
// quantized layout, the shared expert, the combine).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/gemv_quant.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_decode.cuh"
#include "backend/cuda/moe_grouped.cuh"
#include "backend/cuda/moe_router.cuh"
#include "backend/cuda/moe_sort.cuh"

namespace deltaflow::backend::cuda {

bool CudaBackend::mlp_in_16bit(int64_t n, const DMat& gate_up, const DMat& down) const {
  return takes_gemm(n, gate_up) && takes_gemm(n, down) && gemm_type(gate_up) == gemm_type(down);
}

core::Status CudaBackend::mlp_16bit(int64_t n, const DMat& gate_up, const DMat& down, float* y,
                                    const char* swiglu_mark, const char* down_mark) {
  // [gate | up] comes out of cuBLASLt in the weights' 16-bit type (ws_.proj), SwiGLU reads it and writes
  // down's input (ws_.x16): what transformers does with a bf16 checkpoint, fp32 arithmetic inside.
  const int64_t H = config_.hidden_size, I = down.cols;
  const core::DType dt = gemm_type(gate_up);
  DF_CUDA_TRY(stage_x16(ws_.xn, H, n, H, dt));
  DF_TRY(run_gemm(ws_.x16, n, gate_up, ws_.proj, dt, 2 * I));
  prof_.mark(swiglu_mark, stream_);
  x16_holds_ = {};
  DF_CUDA_TRY(swiglu(ws_.proj, dt, 2 * I, n, I, ws_.x16, dt, I, stream_));
  prof_.mark(down_mark, stream_);
  return run_gemm(ws_.x16, n, down, y, core::DType::kF32, H);
}

core::Status CudaBackend::ffn(const DLayer& L, int64_t n) {
  if (L.is_moe) return moe(L, n);
  const int64_t H = config_.hidden_size, I = L.down.cols;
  // down(silu(gate(x)) * up(x))
  prof_.mark("ffn gate_up", stream_);
  if (n <= kGemvMaxRows) {
    // Decode: the GEMV writes silu(gate) * up itself.
    DF_TRY(linear(ws_.xn, H, n, L.gate_up, ws_.act, I, false, /*swiglu=*/true));
  } else if (mlp_in_16bit(n, L.gate_up, L.down)) {
    return mlp_16bit(n, L.gate_up, L.down, ws_.y, "ffn swiglu", "ffn down");
  } else {
    DF_TRY(linear(ws_.xn, H, n, L.gate_up, ws_.proj, 2 * I));
    prof_.mark("ffn swiglu", stream_);
    DF_CUDA_TRY(swiglu(ws_.proj, 2 * I, n, I, ws_.act, I, stream_));
  }
  prof_.mark("ffn down", stream_);
  return linear(ws_.act, I, n, L.down, ws_.y, H);
}

core::Expected<CudaBackend::SortedSlots> CudaBackend::sort_slots_by_expert(int64_t nk) {
  const int64_t E = config_.num_experts, K = config_.num_experts_per_tok;
  SortedSlots s;
  s.tiles = reinterpret_cast<GroupedTile*>(ws_.moe_tiles);
  int* scratch = ws_.moe_tiles + 3 * moe_tile_room_;
  s.n_live = scratch + moe_sort_scratch_ints(E);
  s.room = static_cast<int>(moe_tile_room_);
  DF_CUDA_TRY(moe_sort_by_expert(ws_.moe_ids, nk, static_cast<int>(K), static_cast<int>(E), scratch,
                                 ws_.sort_slot, ws_.sort_tok, s.tiles, s.room, s.n_live, stream_));
  return s;
}

bool CudaBackend::router_takes_gemm(const DLayer& L, int64_t n) const {
  const int64_t H = config_.hidden_size, K = config_.num_experts_per_tok;
  const GemmCall c = router_gemm_call(L, n);
  // The parts go through ws_.x16, the [3n, E] product (rows of ldy floats) through ws_.ys (the experts'
  // outputs, not yet written: it holds max_rows_ * K * H floats).
  return L.router_gate.data && L.router_gate.dtype == core::DType::kBF16 && n > kGemvMaxRows && !opt_.exact &&
         gemm_.ready() && H % 8 == 0 && static_cast<size_t>(c.T * H) <= ws_.x16_elems && 3 * c.ldy <= K * H;
}

GemmCall CudaBackend::router_gemm_call(const DLayer& L, int64_t n) const {
  // The E router rows of router_gate (the shared gate's row goes with the split, moe_router.cuh). Output
  // rows padded to 8 floats (32 bytes), the alignment cuBLASLt's fast kernels want.
  const int64_t N = config_.num_experts;
  return GemmCall{L.router_gate.data, core::DType::kBF16, N, config_.hidden_size, ws_.x16, 3 * n, ws_.ys,
                  core::DType::kF32,  (N + 7) / 8 * 8};
}

core::Status CudaBackend::moe(const DLayer& L, int64_t n) {
  const auto& c = config_;
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok;
  const int64_t Im = L.experts_down.cols, Is = L.shared_down.cols, nk = n * K;
  const size_t es = core::dtype_size(L.experts_gu.dtype);
  const bool renorm = c.architecture != model::Architecture::kQwen3Next || c.norm_topk_prob;
  // The router in fp32 whatever the mode: a near tie between experts must not flip on rounding. The
  // [router | shared gate] logits of a decode step go through the split-K router kernel (the plain GEMV would
  // give E + 1 = 257 rows two blocks' worth of warps and a 1-row shared gate one block); a prefill's, for a
  // bf16 router, through one cuBLASLt GEMM of the E router rows over the activations split into three exact
  // bf16 parts, the shared gate's row summed in the split's pass (moe_router.cuh; the SIMT kernel was 10% of
  // a 4096-token Qwen3.5-35B-A3B prefill on an H100), else
  // through the register-tiled kernel; in exact mode always the split-K kernel, whose tiles keep prefill's
  // logits bit-equal to decode's. Then the top-k routing; expert ids stay on the device.
  prof_.mark("moe router", stream_);
  const bool split_router = router_takes_gemm(L, n);
  if (split_router) {
    x16_holds_ = {};
    const GemmCall call = router_gemm_call(L, n);
    DF_CUDA_TRY(moe_router_split_activations(ws_.xn, H, n, H, ws_.x16, L.shared_gate.data, ws_.shared_gate, 1,
                                             stream_));
    DF_TRY(gemm_.run(call, stream_));
    DF_CUDA_TRY(moe_router_sum_parts(ws_.ys, call.ldy, n, E, E, ws_.router, E, nullptr, 0, stream_));
  } else if (L.router_gate.data && n > kGemvMaxRows && !opt_.exact) {
    DF_CUDA_TRY(moe_router_logits_tiled(L.router_gate.data, L.router_gate.dtype, E + 1, E, H, ws_.xn, H, n,
                                        ws_.router, E, ws_.shared_gate, 1, stream_));
  } else if (L.router_gate.data) {
    DF_CUDA_TRY(moe_router_logits(L.router_gate.data, L.router_gate.dtype, E + 1, E, H, ws_.xn, H,
                                  static_cast<int>(n), ws_.router, E, ws_.shared_gate, 1, stream_));
  } else {
    DF_TRY(linear(ws_.xn, H, n, L.router, ws_.router, E, /*force_fp32=*/true));
    DF_TRY(linear(ws_.xn, H, n, L.shared_gate, ws_.shared_gate, 1, /*force_fp32=*/true));
  }
  prof_.mark("moe top-k", stream_);
  DF_CUDA_TRY(moe_route(ws_.router, E, n, static_cast<int>(E), static_cast<int>(K), renorm, ws_.moe_ids,
                        ws_.moe_w, stream_));
  if (L.experts_gu.quantized) return moe_quant(L, n);
  if (n <= kGemvMaxRows) {
    // Decode (moe_decode.cuh): gate/up with SwiGLU of the K chosen experts and the shared expert, then one
    // down projection that sums all of them, weighted, into y. No host sync.
    const int T = static_cast<int>(n), Ki = static_cast<int>(K);
    prof_.mark("moe gate_up", stream_);
    const MoeGateUpWeights egu{L.experts_gu.data, L.experts_gu.dtype, Im, 2 * Im * H};
    const MoeGateUpWeights sgu{L.shared_gu.data, L.shared_gu.dtype, Is, 0};
    DF_CUDA_TRY(
        moe_gate_up_swiglu(egu, ws_.moe_ids, Ki, sgu, H, ws_.xn, H, T, ws_.act_s, Im, ws_.act, Is, stream_));
    prof_.mark("moe down", stream_);
    const MoeDownWeights edn{L.experts_down.data, L.experts_down.dtype, Im, H * Im};
    const MoeDownWeights sdn{L.shared_down.data, L.shared_down.dtype, Is, 0};
    DF_CUDA_TRY(moe_down_combine(edn, ws_.moe_ids, ws_.moe_w, Ki, sdn, ws_.shared_gate, H, ws_.act_s, Im,
                                 ws_.act, Is, T, ws_.y, H, stream_));
    return core::Status();
  }
  prof_.mark("moe experts", stream_);
  const core::DType dt = L.experts_gu.dtype;
  const bool grouped = !opt_.exact && dt == L.experts_down.dtype &&
                       moe_grouped_supported(dt, static_cast<int>(2 * Im), static_cast<int>(H)) &&
                       moe_grouped_supported(dt, static_cast<int>(H), static_cast<int>(Im)) &&
                       static_cast<size_t>(nk * std::max(H, Im)) <= ws_.x16_elems;
  if (grouped) {
    // The slots sorted by expert and the tile list built on the device (moe_sort.cuh: no host sync), then
    // one grouped GEMM per projection over every expert's rows (moe_grouped.cuh), in the weights' 16-bit
    // type end to end as the dense MLP's prefill: gate_up -> 16-bit, SwiGLU 16 -> 16 into down's input.
    // gate_up reads each slot's token row through sort_tok and down writes each slot's row through
    // sort_slot: no gathered copy of x, no scatter of y. The GEMM grids are sized for the most tiles.
    DF_ASSIGN(const SortedSlots sorted, sort_slots_by_expert(nk));
    GroupedTile* tiles = sorted.tiles;
    int* n_live = sorted.n_live;
    const int room = sorted.room;
    x16_holds_ = {};
    // The router's split left bf16(xn) in ws_.x16's first n rows (its hi part), as convert_rows writes it.
    if (!(split_router && dt == core::DType::kBF16))
      DF_CUDA_TRY(convert_rows(ws_.xn, H, n, H, ws_.x16, dt, stream_));
    DF_CUDA_TRY(moe_grouped_gemm(L.experts_gu.data, dt, 2 * Im * H, static_cast<int>(2 * Im),
                                 static_cast<int>(H), ws_.x16, tiles, room, ws_.gu_s, dt, 2 * Im, stream_,
                                 ws_.sort_tok, nullptr, n_live));
    DF_CUDA_TRY(swiglu(ws_.gu_s, dt, 2 * Im, nk, Im, ws_.x16, dt, Im, stream_));
    DF_CUDA_TRY(moe_grouped_gemm(L.experts_down.data, dt, H * Im, static_cast<int>(H), static_cast<int>(Im),
                                 ws_.x16, tiles, room, ws_.y_slot, core::DType::kF32, H, stream_, nullptr,
                                 ws_.sort_slot, n_live));
  } else {
    // Exact mode and shapes the grouped GEMM does not take: sort on the host, then one matmul per expert over
    // its rows.
    const int64_t R = max_rows_, RK = R * K;
    int* p_tok = pinned_ + 3 * R + kDecodeMaxRows;
    int* p_slot = p_tok + RK;
    int* p_ids = p_slot + RK;
    DF_CUDA_TRY(
        cudaMemcpyAsync(p_ids, ws_.moe_ids, static_cast<size_t>(nk) * 4, cudaMemcpyDeviceToHost, stream_));
    DF_CUDA_TRY(cudaStreamSynchronize(stream_));
    std::vector<int64_t> count(static_cast<size_t>(E) + 1, 0);
    for (int64_t s = 0; s < nk; ++s) {
      if (p_ids[s] < 0 || p_ids[s] >= E)
        return core::Error{"cuda backend: router produced an invalid expert"};
      ++count[static_cast<size_t>(p_ids[s]) + 1];
    }
    for (int64_t e = 0; e < E; ++e) count[static_cast<size_t>(e) + 1] += count[static_cast<size_t>(e)];
    std::vector<int64_t> fill(count.begin(), count.end() - 1);
    for (int64_t s = 0; s < nk; ++s) {
      const int64_t at = fill[static_cast<size_t>(p_ids[s])]++;
      p_slot[at] = static_cast<int>(s);
      p_tok[at] = static_cast<int>(s / K);
    }
    DF_CUDA_TRY(
        cudaMemcpyAsync(ws_.sort_tok, p_tok, static_cast<size_t>(nk) * 4, cudaMemcpyHostToDevice, stream_));
    DF_CUDA_TRY(
        cudaMemcpyAsync(ws_.sort_slot, p_slot, static_cast<size_t>(nk) * 4, cudaMemcpyHostToDevice, stream_));
    DF_CUDA_TRY(gather_rows(ws_.xn, H, ws_.sort_tok, nk, H, ws_.xs, H, stream_));
    for (int64_t e = 0; e < E; ++e) {
      const int64_t off = count[static_cast<size_t>(e)], cnt = count[static_cast<size_t>(e) + 1] - off;
      if (cnt == 0) continue;
      DMat gu = L.experts_gu;
      gu.data = static_cast<const uint8_t*>(gu.data) + static_cast<size_t>(e * 2 * Im * H) * es;
      DF_TRY(linear(ws_.xs + off * H, H, cnt, gu, ws_.gu_s + off * 2 * Im, 2 * Im));
    }
    DF_CUDA_TRY(swiglu(ws_.gu_s, 2 * Im, nk, Im, ws_.act_s, Im, stream_));
    for (int64_t e = 0; e < E; ++e) {
      const int64_t off = count[static_cast<size_t>(e)], cnt = count[static_cast<size_t>(e) + 1] - off;
      if (cnt == 0) continue;
      DMat dn = L.experts_down;
      dn.data = static_cast<const uint8_t*>(dn.data) + static_cast<size_t>(e * H * Im) * es;
      DF_TRY(linear(ws_.act_s + off * Im, Im, cnt, dn, ws_.ys + off * H, H));
    }
    DF_CUDA_TRY(scatter_rows(ws_.ys, H, ws_.sort_slot, nk, H, ws_.y_slot, H, stream_));
  }
  return moe_shared_and_combine(L, n);
}

core::Status CudaBackend::moe_shared_and_combine(const DLayer& L, int64_t n, bool gate_up_done) {
  // Shared expert, gated by sigmoid(x . shared_expert_gate).
  const int64_t H = config_.hidden_size, K = config_.num_experts_per_tok, Is = L.shared_down.cols;
  prof_.mark("moe shared expert", stream_);
  if (n <= kGemvMaxRows) {
    if (!gate_up_done) DF_TRY(linear(ws_.xn, H, n, L.shared_gu, ws_.act, Is, false, /*swiglu=*/true));
    DF_TRY(linear(ws_.act, Is, n, L.shared_down, ws_.y_shared, H));
  } else if (mlp_in_16bit(n, L.shared_gu, L.shared_down)) {
    DF_TRY(mlp_16bit(n, L.shared_gu, L.shared_down, ws_.y_shared, "moe shared expert", "moe shared expert"));
  } else {
    DF_TRY(linear(ws_.xn, H, n, L.shared_gu, ws_.proj, 2 * Is));
    DF_CUDA_TRY(swiglu(ws_.proj, 2 * Is, n, Is, ws_.act, Is, stream_));
    DF_TRY(linear(ws_.act, Is, n, L.shared_down, ws_.y_shared, H));
  }
  prof_.mark("moe combine", stream_);
  DF_CUDA_TRY(moe_combine(ws_.y_slot, ws_.moe_w, n, static_cast<int>(K), H, ws_.y_shared, ws_.shared_gate,
                          ws_.y, stream_));
  return core::Status();
}

core::Status CudaBackend::moe_quant(const DLayer& L, int64_t n) {
  // Routed experts in a quantized layout (QuantWeight's grouped form), read as they are stored. Steps of up
  // to kDecodeMaxRows tokens: one grouped GEMV per projection over the T * K slots, each slot's expert read
  // from the router's ids on the device (gate/up writes SwiGLU; down writes each slot's row): each slot
  // reads one expert's codes. Longer steps: the slots sorted by expert on the device (moe_sort.cuh) and each
  // 64-row tile of one expert's slots multiplied by it (gemv_quant_tiles), so an expert's codes are read
  // once per 32 of its rows; widening every expert to bf16 for the grouped GEMM instead cost about 8 ms a
  // layer on an H100 whatever the chunk. The shared expert is expert E of the stacks when it has their
  // layout (DLayer::shared_in_stack: at decode, n more problems of the grouped GEMVs), else a dense MLP in
  // its own format; moe_combine sums the weighted slots and the gated shared expert.
  const auto& c = config_;
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.num_experts_per_tok;
  const int64_t Im = L.experts_down.cols, nk = n * K;
  const int slots = static_cast<int>(nk);
  if (static_cast<size_t>(nk) > ws_.xq_rows)
    return core::Error{"cuda backend: internal: the quantized experts' staging does not hold this step"};
  if (n <= kDecodeMaxRows) {
    // xn's staging (add_norm made it) serves the routed gate/up and the shared expert's. With the shared
    // expert in the stacks (expert E) it is n more problems of the grouped GEMVs: rows slots .. slots + n of
    // act_s and y_slot, then moe_combine's shared term. Else its gate/up runs next, on the same staging.
    const int shared =
        L.shared_in_stack && slots + n <= moe_host_rows_ && static_cast<size_t>(slots + n) <= ws_.xq_rows
            ? static_cast<int>(n)
            : 0;
    const int Ei = static_cast<int>(E);
    prof_.mark("moe gate_up", stream_);
    DF_CUDA_TRY(stage_xq(ws_.xn, H, n, H));
    DF_CUDA_TRY(gemv_quant_grouped(L.experts_gu.q, ws_.moe_ids, slots, ws_.xq, ws_.xq_factor,
                                   static_cast<int>(K), ws_.act_s, Im, /*swiglu=*/true, stream_, 0,
                                   GroupedExtra{shared, Ei, 0}));
    const bool shared_gu = !shared && n <= kGemvMaxRows;
    if (shared_gu) {
      prof_.mark("moe shared expert", stream_);
      DF_TRY(linear(ws_.xn, H, n, L.shared_gu, ws_.act, L.shared_down.cols, false, /*swiglu=*/true));
    }
    prof_.mark("moe down", stream_);
    DF_CUDA_TRY(stage_xq(ws_.act_s, Im, slots + shared, Im));
    DF_CUDA_TRY(gemv_quant_grouped(L.experts_down.q, ws_.moe_ids, slots, ws_.xq, ws_.xq_factor, 1, ws_.y_slot,
                                   H, false, stream_, 0, GroupedExtra{shared, Ei, slots}));
    if (!shared) return moe_shared_and_combine(L, n, shared_gu);
    prof_.mark("moe combine", stream_);
    DF_CUDA_TRY(moe_combine(ws_.y_slot, ws_.moe_w, n, static_cast<int>(K), H, ws_.y_slot + slots * H,
                            ws_.shared_gate, ws_.y, stream_));
    return core::Status();
  }
  prof_.mark("moe experts", stream_);
  xq_holds_ = {};
  DF_ASSIGN(const SortedSlots sorted, sort_slots_by_expert(nk));
  GroupedTile* tiles = sorted.tiles;
  int* n_live = sorted.n_live;
  const int room = sorted.room;
  // gate/up over the slots in sorted order (each reads its token's row), SwiGLU into act_s in that order;
  // down from there, each row written back to its slot.
  DF_CUDA_TRY(stage_activations_f16_rows(ws_.xn, H, ws_.sort_tok, slots, H, ws_.xq, ws_.xq_factor, stream_));
  DF_CUDA_TRY(gemv_quant_tiles(L.experts_gu.q, tiles, room, n_live, ws_.xq, ws_.xq_factor, ws_.act_s, Im,
                               nullptr, /*swiglu=*/true, stream_));
  DF_CUDA_TRY(stage_activations_f16(ws_.act_s, Im, slots, Im, ws_.xq, ws_.xq_factor, stream_));
  DF_CUDA_TRY(gemv_quant_tiles(L.experts_down.q, tiles, room, n_live, ws_.xq, ws_.xq_factor, ws_.y_slot, H,
                               ws_.sort_slot, false, stream_));
  return moe_shared_and_combine(L, n);
}

}  // namespace deltaflow::backend::cuda
