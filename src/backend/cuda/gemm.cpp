#include "backend/cuda/gemm.hpp"

#include <cublasLt.h>

#include <cstring>
#include <string>

#include "backend/cuda/cuda_check.hpp"

namespace deltaflow::backend::cuda {
namespace {

core::Status lt_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return core::Status();
  return core::Error{std::string("cuBLASLt: ") + what + " failed with status " +
                     std::to_string(static_cast<int>(s))};
}

#define DF_LT_TRY(expr) DF_TRY(lt_status((expr), #expr))

// Descriptors of one call, destroyed on every path out.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two up to 256 dividing the address: cuBLASLt's heuristic assumes 256 unless told.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

}  // namespace

Gemm::~Gemm() {
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

core::Status Gemm::init(size_t workspace_bytes) {
  if (handle_) return core::Status();
  DF_LT_TRY(cublasLtCreate(&handle_));
  DF_CUDA_TRY(cudaMalloc(&workspace_, workspace_bytes));
  workspace_bytes_ = workspace_bytes;
  return core::Status();
}

core::Status Gemm::run(const void* W, core::DType dtype, int64_t N, int64_t K, const void* x, int64_t T,
                       float* y, int64_t ldy, cudaStream_t stream) {
  if (!handle_) return core::Error{"cuBLASLt: not initialised"};
  if (dtype != core::DType::kBF16 && dtype != core::DType::kF16)
    return core::Error{"cuBLASLt GEMM: weights must be BF16 or F16"};
  if (N == 0 || T == 0) return core::Status();
  const cudaDataType_t ab = dtype == core::DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  // Row-major y[T, N] is column-major y^T[N, T] = W x^T: A = W seen as column-major [K, N] (transposed), B =
  // x seen as column-major [K, T].
  Descs d;
  DF_LT_TRY(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  DF_LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  DF_LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  DF_LT_TRY(cublasLtMatrixLayoutCreate(&d.a, ab, static_cast<uint64_t>(K), static_cast<uint64_t>(N), K));
  DF_LT_TRY(cublasLtMatrixLayoutCreate(&d.b, ab, static_cast<uint64_t>(K), static_cast<uint64_t>(T), K));
  DF_LT_TRY(
      cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, static_cast<uint64_t>(N), static_cast<uint64_t>(T), ldy));

  const uint32_t al_a = alignment(W), al_b = alignment(x), al_c = alignment(y);
  const Key key{static_cast<int>(dtype), N, K, T, ldy, al_a | (al_b << 9) | (al_c << 18)};
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    DF_LT_TRY(cublasLtMatmulPreferenceCreate(&d.pref));
    DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &workspace_bytes_, sizeof workspace_bytes_));
    DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                   sizeof al_a));
    DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                   sizeof al_b));
    DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                   sizeof al_c));
    DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                                   sizeof al_c));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    DF_LT_TRY(cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &res, &found));
    if (found == 0)
      return core::Error{"cuBLASLt: no algorithm for N=" + std::to_string(N) + " K=" + std::to_string(K) +
                         " T=" + std::to_string(T)};
    Algo a;
    static_assert(sizeof(a.data) == sizeof(res.algo));
    std::memcpy(a.data, &res.algo, sizeof res.algo);
    it = algos_.emplace(key, a).first;
  }
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, it->second.data, sizeof algo);
  const float alpha = 1.0f, beta = 0.0f;
  DF_LT_TRY(cublasLtMatmul(handle_, d.op, &alpha, W, d.a, x, d.b, &beta, y, d.c, y, d.c, &algo, workspace_,
                           workspace_bytes_, stream));
  return core::Status();
}

}  // namespace deltaflow::backend::cuda
