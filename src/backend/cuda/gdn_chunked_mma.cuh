// Warp-level bf16 tensor-core tiles for the chunked Gated DeltaNet (gdn_chunked.cu): mma.sync m16n8k16 with
// fp32 accumulation (sm_80+), operands fetched from shared memory with ldmatrix. Each matrix lives in shared
// memory row-major with a row stride `ld` (elements) whose byte size is a multiple of 16 and 16 mod 128
// (rows padded by 8 bf16), so the eight row addresses of an ldmatrix hit distinct banks.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A 16x16: reg0 (g, 2t..2t+1), reg1 (g+8, 2t..), reg2 (g, 2t+8..), reg3 (g+8, 2t+8..)
//   B 16x8:  reg0 (k = 2t..2t+1, n = g), reg1 (k = 2t+8.., n = g)
//   C 16x8:  c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/mma.cuh"

#include <cstdint>

namespace deltaflow::backend::cuda::gdn_mma {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// A tile rows [m0, m0+16) x cols [k0, k0+16) of a row-major [M][K] matrix.
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* s, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31, q = l >> 3, r = l & 7;
  ldsm_x4(a, s + (m0 + r + (q & 1) * 8) * ld + k0 + (q >> 1) * 8);
}
// The A tile of M^T, rows [m0, m0+16) x cols [k0, k0+16), from M stored row-major as [K][M].
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const bf16* s, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31, q = l >> 3, r = l & 7;
  ldsm_x4_trans(a, s + (k0 + r + (q >> 1) * 8) * ld + m0 + (q & 1) * 8);
}
// Two B tiles (n-tiles n0 and n0+8, k in [k0, k0+16)) of a matrix stored row-major as [K][N]:
// b[0..1] for n0, b[2..3] for n0+8.
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const bf16* s, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, q = l >> 3, r = l & 7;
  ldsm_x4_trans(b, s + (k0 + r + (q & 1) * 8) * ld + n0 + (q >> 1) * 8);
}
// The same two B tiles from B^T stored row-major as [N][K] (B = M^T: the product A M^T).
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const bf16* s, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, q = l >> 3, r = l & 7;
  ldsm_x4(b, s + (n0 + r + (q >> 1) * 8) * ld + k0 + (q & 1) * 8);
}

// c += a b (one 16x8x16 step).
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma_bf16(c, a, b0, b1);
}
__device__ __forceinline__ void store_bf16x2(bf16* p, float lo, float hi) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(lo, hi);
}

// 16-byte global -> shared copies that bypass registers (cp.async, sm_80+), in commit groups.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Copies a [rows][cols] global matrix with row stride gld elements (cols * sizeof(T) and the row starts
// 16-byte aligned) into shared memory with row stride ld elements, all threads of the block taking 16-byte
// pieces.
template <class T>
__device__ __forceinline__ void copy_tile_async(T* s, int ld, const T* g, int64_t gld, int rows, int cols) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T));
  const int per_row = cols / kPer;
  for (int i = threadIdx.x; i < rows * per_row; i += blockDim.x) {
    const int r = i / per_row, c = (i % per_row) * kPer;
    cp_async16(s + r * ld + c, g + r * gld + c);
  }
}

}  // namespace deltaflow::backend::cuda::gdn_mma
