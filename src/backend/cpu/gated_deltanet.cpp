#include "backend/cpu/gated_deltanet.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "core/threads.hpp"

namespace deltaflow::backend::cpu {

void causal_conv1d_silu_channel(const float* in, int64_t t0, int64_t t1, int64_t C, int64_t ch,
                                const float* w, int64_t K, float* state, float* out) {
  const int64_t S = K - 1;
  const float* wc = w + ch * K;
  for (int64_t t = t0; t < t1; ++t) {
    // The window: the state (oldest first), then this token's input.
    float acc = 0;
    for (int64_t j = 0; j < S; ++j) acc += wc[j] * state[j];
    const float x = in[t * C + ch];
    acc += wc[S] * x;
    out[t * C + ch] = silu(acc);
    for (int64_t j = 0; j + 1 < S; ++j) state[j] = state[j + 1];
    if (S > 0) state[S - 1] = x;
  }
}

void causal_conv1d_silu(const float* in, int64_t T, int64_t C, const float* w, int64_t K, float* state,
                        float* out) {
  const int64_t S = K - 1;
  core::parallel_for(static_cast<size_t>(C), 64, [&](size_t b, size_t e) {
    for (size_t ch = b; ch < e; ++ch)
      causal_conv1d_silu_channel(in, 0, T, C, static_cast<int64_t>(ch), w, K, state + ch * S, out);
  });
}

namespace {

// The recurrent rule for one head, in two passes over S per token (decay + S^T k, then update + S^T q). Every
// element sees exactly the operations of the four-pass form (S *= decay; kv = S^T k; S += k kv^T; o = S^T q),
// in the same order, so the numbers are those of that form, whatever vector width the compiler picks.
inline __attribute__((always_inline)) void recurrent_head_body(const DeltaRuleArgs& a, int64_t h, int64_t t0,
                                                               int64_t t1, float* __restrict kv) {
  const int64_t nv = a.nv, dk = a.dk, dv = a.dv;
  float* __restrict S = a.S + h * dk * dv;
  for (int64_t t = t0; t < t1; ++t) {
    const float* __restrict q = a.q + (t * nv + h) * dk;
    const float* __restrict k = a.k + (t * nv + h) * dk;
    const float* __restrict v = a.v + (t * nv + h) * dv;
    float* __restrict o = a.o + (t * nv + h) * dv;
    const float decay = std::exp(a.g[t * nv + h]), beta = a.beta[t * nv + h];
    // S = exp(g) S and kv = S^T k: what the state predicts for this key.
    for (int64_t e = 0; e < dv; ++e) kv[e] = 0;
    for (int64_t d = 0; d < dk; ++d) {
      float* __restrict row = S + d * dv;
      const float kd = k[d];
      for (int64_t e = 0; e < dv; ++e) {
        row[e] *= decay;
        kv[e] += row[e] * kd;
      }
    }
    for (int64_t e = 0; e < dv; ++e) kv[e] = (v[e] - kv[e]) * beta;  // the delta
    // S += k kv^T and o = S^T q.
    for (int64_t e = 0; e < dv; ++e) o[e] = 0;
    for (int64_t d = 0; d < dk; ++d) {
      float* __restrict row = S + d * dv;
      const float kd = k[d], qd = q[d];
      for (int64_t e = 0; e < dv; ++e) {
        row[e] += kd * kv[e];
        o[e] += row[e] * qd;
      }
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
// The same code 8 lanes wide where the CPU has AVX2. No FMA: a fused multiply-add would round differently
// from the portable build, and these are element-wise loops whose numbers must not depend on the width.
__attribute__((target("avx2"))) void recurrent_head_avx2(const DeltaRuleArgs& a, int64_t h, int64_t t0,
                                                         int64_t t1, float* kv) {
  recurrent_head_body(a, h, t0, t1, kv);
}
bool cpu_has_avx2() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
}
#endif

}  // namespace

void gated_delta_rule_recurrent_head(const DeltaRuleArgs& a, int64_t h, int64_t t0, int64_t t1, float* kv) {
#if defined(__x86_64__) || defined(__i386__)
  if (cpu_has_avx2()) {
    recurrent_head_avx2(a, h, t0, t1, kv);
    return;
  }
#endif
  recurrent_head_body(a, h, t0, t1, kv);
}

void gated_delta_rule_recurrent(const DeltaRuleArgs& a) {
  core::parallel_for(static_cast<size_t>(a.nv), 1, [&](size_t hb, size_t he) {
    std::vector<float> kv(static_cast<size_t>(a.dv));
    for (size_t h = hb; h < he; ++h)
      gated_delta_rule_recurrent_head(a, static_cast<int64_t>(h), 0, a.T, kv.data());
  });
}

// One head, one chunk of L <= kGdnChunk tokens starting at t0. With γ the in-chunk cumulative log decay and
// Γ_ij = exp(γ_i - γ_j) for j <= i:
//   A  = I + strict_lower((β⊙K) K^T ⊙ Γ)                  (unit lower triangular)
//   U  = A^-1 (β⊙V),   W = A^-1 (β⊙K⊙exp(γ))            (forward substitution)
//   V' = U - W S
//   O  = (Q⊙exp(γ)) S + ((Q K^T) ⊙ Γ) V'                 (Γ with its diagonal)
//   S  = exp(γ_L) S + (K ⊙ exp(γ_L - γ))^T V'
// Padded positions of the reference (zero k, v, β and g) contribute nothing, so a short last chunk is exact.
static void chunk_one_head(const DeltaRuleArgs& a, int64_t h, int64_t t0, int64_t L,
                           std::vector<float>& buf) {
  const int64_t nv = a.nv, dk = a.dk, dv = a.dv;
  auto q = [&](int64_t i) { return a.q + ((t0 + i) * nv + h) * dk; };
  auto k = [&](int64_t i) { return a.k + ((t0 + i) * nv + h) * dk; };
  auto v = [&](int64_t i) { return a.v + ((t0 + i) * nv + h) * dv; };
  float* S = a.S + h * dk * dv;

  buf.assign(static_cast<size_t>(L + L * L + L * dv + L * dk + L * dv), 0.0f);
  float* gam = buf.data();  // [L]
  float* A = gam + L;       // [L, L], strictly lower part used
  float* U = A + L * L;     // [L, dv]  -> becomes V'
  float* W = U + L * dv;    // [L, dk]
  float* O = W + L * dk;    // [L, dv]

  float acc = 0;
  for (int64_t i = 0; i < L; ++i) {
    acc += a.g[(t0 + i) * nv + h];
    gam[i] = acc;
  }
  for (int64_t i = 0; i < L; ++i) {
    const float bi = a.beta[(t0 + i) * nv + h];
    for (int64_t j = 0; j < i; ++j) {
      float d = 0;
      for (int64_t c = 0; c < dk; ++c) d += k(i)[c] * k(j)[c];
      A[i * L + j] = bi * d * std::exp(gam[i] - gam[j]);
    }
  }
  // Forward substitution for U and W, row by row.
  for (int64_t i = 0; i < L; ++i) {
    const float bi = a.beta[(t0 + i) * nv + h];
    const float eg = std::exp(gam[i]);
    for (int64_t e = 0; e < dv; ++e) U[i * dv + e] = bi * v(i)[e];
    for (int64_t c = 0; c < dk; ++c) W[i * dk + c] = bi * k(i)[c] * eg;
    for (int64_t j = 0; j < i; ++j) {
      const float aij = A[i * L + j];
      for (int64_t e = 0; e < dv; ++e) U[i * dv + e] -= aij * U[j * dv + e];
      for (int64_t c = 0; c < dk; ++c) W[i * dk + c] -= aij * W[j * dk + c];
    }
  }
  // V' = U - W S (in place in U).
  for (int64_t i = 0; i < L; ++i)
    for (int64_t c = 0; c < dk; ++c) {
      const float wc = W[i * dk + c];
      for (int64_t e = 0; e < dv; ++e) U[i * dv + e] -= wc * S[c * dv + e];
    }
  // O = (Q⊙exp(γ)) S + ((Q K^T) ⊙ Γ) V'.
  for (int64_t i = 0; i < L; ++i) {
    float* o = O + i * dv;
    const float eg = std::exp(gam[i]);
    for (int64_t c = 0; c < dk; ++c) {
      const float qc = q(i)[c] * eg;
      for (int64_t e = 0; e < dv; ++e) o[e] += qc * S[c * dv + e];
    }
    for (int64_t j = 0; j <= i; ++j) {
      float d = 0;
      for (int64_t c = 0; c < dk; ++c) d += q(i)[c] * k(j)[c];
      d *= std::exp(gam[i] - gam[j]);
      for (int64_t e = 0; e < dv; ++e) o[e] += d * U[j * dv + e];
    }
    float* dst = a.o + ((t0 + i) * nv + h) * dv;
    for (int64_t e = 0; e < dv; ++e) dst[e] = o[e];
  }
  // S = exp(γ_L) S + (K ⊙ exp(γ_L - γ))^T V'.
  const float gl = gam[L - 1], egl = std::exp(gl);
  for (int64_t i = 0; i < dk * dv; ++i) S[i] *= egl;
  for (int64_t j = 0; j < L; ++j) {
    const float f = std::exp(gl - gam[j]);
    for (int64_t c = 0; c < dk; ++c) {
      const float kc = k(j)[c] * f;
      for (int64_t e = 0; e < dv; ++e) S[c * dv + e] += kc * U[j * dv + e];
    }
  }
}

void gated_delta_rule_chunked(const DeltaRuleArgs& a) {
  core::parallel_for(static_cast<size_t>(a.nv), 1, [&](size_t hb, size_t he) {
    std::vector<float> buf;
    for (size_t h = hb; h < he; ++h)
      for (int64_t t0 = 0; t0 < a.T; t0 += kGdnChunk)
        chunk_one_head(a, static_cast<int64_t>(h), t0, std::min(kGdnChunk, a.T - t0), buf);
  });
}

}  // namespace deltaflow::backend::cpu
