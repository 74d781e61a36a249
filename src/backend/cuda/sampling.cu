#include <cmath>
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/sampling.cuh"
#include "core/philox.hpp"

namespace deltaflow::backend::cuda {

namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 16;       // 4-bit radix digits
constexpr int kListCap = 4096;  // candidates held in shared memory once they fit
constexpr int kNoPick = 0x7fffffff;

// A candidate token: its order key (see order_key) and its penalised logit.
struct Cand {
  uint64_t key;
  float x;
  int pad;
};

// Dynamic shared memory: per-thread histograms [bin][thread] (no atomics, conflict-free) and the list.
constexpr size_t kSmemBytes = static_cast<size_t>(kBins) * kThreads * 8 + static_cast<size_t>(kListCap) * 16;

// NaN never wins (-inf), and -0 sorts as +0 (the host compares values).
__device__ __forceinline__ float clean(float x) {
  if (isnan(x)) return -INFINITY;
  return x == 0.0f ? 0.0f : x;
}

// Larger logit: larger key; equal logits: the lower id has the larger key. All keys of a row are distinct.
__device__ __forceinline__ uint64_t order_key(float x, int64_t i) {
  uint32_t u = __float_as_uint(x);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(i));
}

__device__ __forceinline__ int key_id(uint64_t key) {
  return static_cast<int>(~static_cast<uint32_t>(key));
}

// Visits the source: the whole row (n < 0) or the shared-memory list of n candidates, each thread its own
// fixed subset in a fixed order.
template <class F>
__device__ __forceinline__ void for_each(const float* row, int64_t V, const Cand* list, int n, F&& f) {
  if (n < 0) {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float x = clean(row[i]);
      f(order_key(x, i), x);
    }
  } else {
    for (int j = threadIdx.x; j < n; j += kThreads) f(list[j].key, list[j].x);
  }
}

__device__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = scratch[lane];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  const float r = scratch[0];
  __syncthreads();
  return r;
}

// Block-wide scan of v in thread order: excl / incl for this thread, and the total.
template <class T>
__device__ void block_scan(T v, T* scratch, T& excl, T& incl, T& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  T lane_excl = __shfl_up_sync(0xffffffffu, inc, 1);
  if (lane == 0) lane_excl = T(0);
  if (lane == 31) scratch[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    T s = scratch[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const T y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    scratch[lane] = s;
  }
  __syncthreads();
  const T off = warp > 0 ? scratch[warp - 1] : T(0);
  excl = off + lane_excl;
  incl = off + inc;
  total = scratch[kWarps - 1];
  __syncthreads();
}

// State the select decides on thread 0 and every thread reads.
struct SelectState {
  uint64_t prefix;
  float need_w;
  uint32_t need_c;
  uint32_t above;  // active tokens in the bins above the chosen ones so far
  int done, compact;
  uint32_t bin_c[kBins];
  float bin_w[kBins];
};

struct RowCtx {
  const float* row;
  int64_t V;
  Cand* list;
  int* n_list;  // shared; -1: the source is the whole row
  float m, inv_t;
  uint32_t* hc;
  float* hw;
  int* iscratch;
  float* fscratch;
};

__device__ __forceinline__ float weight(const RowCtx& c, float x) {
  return expf((x - c.m) * c.inv_t);
}

// Copies the row's tokens that satisfy pred(key, w) into the list, in thread order, when they fit.
template <class Pred>
__device__ void compact(const RowCtx& c, Pred pred) {
  int cnt = 0;
  for (int64_t i = threadIdx.x; i < c.V; i += kThreads) {
    const float x = clean(c.row[i]);
    if (pred(order_key(x, i), weight(c, x))) ++cnt;
  }
  int excl, incl, total;
  block_scan<int>(cnt, c.iscratch, excl, incl, total);
  if (total > kListCap) return;  // the same decision in every thread
  int o = excl;
  for (int64_t i = threadIdx.x; i < c.V; i += kThreads) {
    const float x = clean(c.row[i]);
    const uint64_t key = order_key(x, i);
    if (pred(key, weight(c, x))) c.list[o++] = Cand{key, x, 0};
  }
  __syncthreads();
  if (threadIdx.x == 0) *c.n_list = total;
  __syncthreads();
}

// The threshold t such that the active tokens (kept(key, w)) with key >= t are the fewest, from the top,
// whose count reaches need_c (by_weight false) or whose weight reaches need_w (true).
template <bool kByWeight, class Kept>
__device__ uint64_t radix_select(const RowCtx& c, uint32_t need_c, float need_w, Kept kept, SelectState* st) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid == 0) {
    st->prefix = 0;
    st->need_c = need_c;
    st->need_w = need_w;
    st->above = 0;
    st->done = 0;
  }
  __syncthreads();
  for (int shift = 60; shift >= 0; shift -= 4) {
    const uint64_t hi_mask = shift >= 60 ? 0ull : (~0ull << (shift + 4));
    const uint64_t prefix = st->prefix;
    for (int b = 0; b < kBins; ++b) {
      c.hc[b * kThreads + tid] = 0;
      if (kByWeight) c.hw[b * kThreads + tid] = 0.0f;
    }
    for_each(c.row, c.V, c.list, *c.n_list, [&](uint64_t key, float x) {
      if ((key & hi_mask) != prefix) return;
      const float w = weight(c, x);
      if (!kept(key, w)) return;
      const int d = static_cast<int>(key >> shift) & (kBins - 1);
      c.hc[d * kThreads + tid] += 1;
      if (kByWeight) c.hw[d * kThreads + tid] += w;
    });
    __syncthreads();
    if (warp < kBins) {
      uint32_t s = 0;
      for (int j = lane; j < kThreads; j += 32) s += c.hc[warp * kThreads + j];
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) st->bin_c[warp] = s;
    } else if (kByWeight) {
      const int b = warp - kBins;
      float s = 0.0f;
      for (int j = lane; j < kThreads; j += 32) s += c.hw[b * kThreads + j];
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) st->bin_w[b] = s;
    }
    __syncthreads();
    if (tid == 0) {
      int chosen = -1;
      uint32_t above_c = 0;
      if (!kByWeight) {
        for (int b = kBins - 1; b >= 0; --b) {
          if (above_c + st->bin_c[b] >= st->need_c) {
            chosen = b;
            break;
          }
          above_c += st->bin_c[b];
        }
        if (chosen < 0) {  // cannot happen when need_c <= the active count; keep everything seen
          chosen = 0;
          st->need_c = st->bin_c[0];
        } else {
          st->need_c -= above_c;
        }
        st->done = st->need_c >= st->bin_c[chosen] || st->bin_c[chosen] <= 1;
      } else {
        float above_w = 0.0f;
        int lowest = -1;
        uint32_t above_c_at_lowest = 0;
        for (int b = kBins - 1; b >= 0; --b) {
          if (st->bin_c[b] == 0) continue;
          if (above_w + st->bin_w[b] >= st->need_w) {
            chosen = b;
            break;
          }
          above_w += st->bin_w[b];
          above_c_at_lowest = above_c;
          above_c += st->bin_c[b];
          lowest = b;
        }
        if (chosen < 0) {  // rounding left the target above the total: keep every active token
          chosen = lowest < 0 ? 0 : lowest;
          above_c = above_c_at_lowest;
          st->need_w = st->bin_w[chosen];
        } else {
          st->need_w -= above_w;
        }
        st->done = st->need_w >= st->bin_w[chosen] || st->bin_c[chosen] <= 1;
      }
      st->above += above_c;
      st->prefix |= static_cast<uint64_t>(chosen) << shift;
      st->compact = !st->done && *c.n_list < 0 && st->above + st->bin_c[chosen] <= kListCap;
    }
    __syncthreads();
    if (st->done || shift == 0) break;
    if (st->compact) {
      const uint64_t t = st->prefix;
      compact(c, [&](uint64_t key, float w) { return key >= t && kept(key, w); });
    }
  }
  const uint64_t t = st->prefix;
  __syncthreads();
  return t;
}

__global__ void __launch_bounds__(kThreads)
    kernel_sample(float* __restrict__ logits, int64_t V, const SampleRowParams* __restrict__ params,
                  const PenaltyEntry* __restrict__ pen, int* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float fscratch[kWarps];
  __shared__ int iscratch[kWarps];
  __shared__ float bv_s[kWarps];
  __shared__ int64_t bi_s[kWarps];
  __shared__ int n_list;
  __shared__ int pick;
  __shared__ SelectState st;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float* row = logits + static_cast<int64_t>(blockIdx.x) * V;
  const SampleRowParams p = params[blockIdx.x];

  // Penalties: each entry is a distinct id, so one thread owns each write.
  for (int e = p.pen_begin + tid; e < p.pen_end; e += kThreads) {
    const PenaltyEntry pe = pen[e];
    if (pe.id < 0 || pe.id >= V) continue;
    float x = row[pe.id];
    x = x > 0.0f ? __fdiv_rn(x, p.repetition) : __fmul_rn(x, p.repetition);
    if (pe.count > 0)
      x = __fsub_rn(x, __fadd_rn(__fmul_rn(p.frequency, static_cast<float>(pe.count)), p.presence));
    row[pe.id] = x;
  }
  __syncthreads();

  // Largest logit, ties to the lowest id.
  float bv = -INFINITY;
  int64_t bi = V;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float x = clean(row[i]);
    if (x > bv || (x == bv && i < bi)) {
      bv = x;
      bi = i;
    }
  }
  warp_argmax(bv, bi);
  if (lane == 0) {
    bv_s[warp] = bv;
    bi_s[warp] = bi;
  }
  __syncthreads();
  bv = bv_s[0];
  bi = bi_s[0];
  for (int w = 1; w < kWarps; ++w)
    if (bv_s[w] > bv || (bv_s[w] == bv && bi_s[w] < bi)) {
      bv = bv_s[w];
      bi = bi_s[w];
    }
  const int argmax = static_cast<int>(bi < V ? bi : 0);
  const float inv_t = 1.0f / p.temperature;
  if (p.temperature <= 0.0f || !isfinite(inv_t) || p.top_k == 1 || p.top_p <= 0.0f || !isfinite(bv)) {
    if (tid == 0) out[blockIdx.x] = argmax;
    return;
  }

  if (tid == 0) n_list = -1;
  __syncthreads();
  RowCtx c{row,
           V,
           reinterpret_cast<Cand*>(smem + static_cast<size_t>(kBins) * kThreads * 8),
           &n_list,
           bv,
           inv_t,
           reinterpret_cast<uint32_t*>(smem),
           reinterpret_cast<float*>(smem + static_cast<size_t>(kBins) * kThreads * 4),
           iscratch,
           fscratch};
  const float min_p = p.min_p;

  // top-k: the k largest keys.
  uint64_t t = 0;
  if (p.top_k > 0 && p.top_k < V) {
    t = radix_select<false>(
        c, static_cast<uint32_t>(p.top_k), 0.0f, [](uint64_t, float) { return true; }, &st);
    if (n_list < 0 && p.top_k <= kListCap) {
      const uint64_t tk = t;
      compact(c, [&](uint64_t key, float) { return key >= tk; });
    }
  }
  // min-p: w = p / p_max >= min_p (a prefix too: w falls as the key does).
  const uint64_t t_k = t;
  auto kept1 = [&](uint64_t key, float w) { return key >= t_k && w >= min_p; };
  // top-p: the fewest from the top whose weight reaches top_p of what top-k and min-p kept.
  if (p.top_p < 1.0f) {
    float s = 0.0f;
    for_each(row, V, c.list, n_list, [&](uint64_t key, float x) {
      const float w = weight(c, x);
      if (kept1(key, w)) s += w;
    });
    const float s1 = block_sum(s, fscratch);
    const uint64_t tp = radix_select<true>(c, 0, p.top_p * s1, kept1, &st);
    t = tp > t ? tp : t;
  }

  // The draw: u uniform over the kept weight; the thread whose share holds u walks its tokens.
  const uint64_t t_all = t;
  auto kept = [&](uint64_t key, float w) { return key >= t_all && w >= min_p; };
  float s = 0.0f;
  for_each(row, V, c.list, n_list, [&](uint64_t key, float x) {
    const float w = weight(c, x);
    if (kept(key, w)) s += w;
  });
  float excl, incl, total;
  block_scan<float>(s, fscratch, excl, incl, total);
  if (tid == 0) pick = kNoPick;
  __syncthreads();
  const float u =
      static_cast<float>(core::philox_first_word(p.seed, p.step) >> 8) * (1.0f / 16777216.0f) * total;
  if (s > 0.0f && excl <= u && u < incl) {
    float acc = excl;
    int found = -1, last = -1;
    for_each(row, V, c.list, n_list, [&](uint64_t key, float x) {
      const float w = weight(c, x);
      if (!kept(key, w) || w <= 0.0f) return;
      acc += w;
      last = key_id(key);
      if (found < 0 && u < acc) found = last;
    });
    if (found < 0) found = last;
    if (found >= 0) atomicMin(&pick, found);
  }
  __syncthreads();
  if (tid == 0) out[blockIdx.x] = pick == kNoPick ? argmax : pick;
}

}  // namespace

cudaError_t sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params,
                        const PenaltyEntry* penalties, int* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (V <= 0 || V > 0x7fffffff) return cudaErrorInvalidValue;
  static const cudaError_t attr = cudaFuncSetAttribute(
      kernel_sample, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes));
  if (attr != cudaSuccess) return attr;
  kernel_sample<<<static_cast<unsigned>(rows), kThreads, kSmemBytes, stream>>>(logits, V, params, penalties,
                                                                               out);
  return cudaGetLastError();
}

double sampling_uniform(uint64_t seed, uint64_t step) {
  return static_cast<double>(core::philox_first_word(seed, step) >> 8) / 16777216.0;
}

}  // namespace deltaflow::backend::cuda
