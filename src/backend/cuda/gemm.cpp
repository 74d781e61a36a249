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

// The largest power of two up to 256 dividing the address: cuBLASLt's heuristic assumes 256 unless told.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

cudaDataType_t lt_type(core::DType t) {
  switch (t) {
    case core::DType::kBF16:
      return CUDA_R_16BF;
    case core::DType::kF16:
      return CUDA_R_16F;
    case core::DType::kF8E4M3:
      return CUDA_R_8F_E4M3;
    default:
      return CUDA_R_32F;
  }
}

}  // namespace

// Descriptors of one call, destroyed on every path out.
struct Gemm::Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descs() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

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

Gemm::Key Gemm::key_of(const GemmCall& c) {
  const uint32_t al = alignment(c.W) | (alignment(c.x) << 9) | (alignment(c.y) << 18);
  return Key{static_cast<int>(c.dtype), static_cast<int>(c.y_type), c.N, c.K, c.T, c.ldy, al};
}

core::Status Gemm::describe(const GemmCall& c, Descs& d) const {
  if (!handle_) return core::Error{"cuBLASLt: not initialised"};
  const bool fp8 = c.dtype == core::DType::kF8E4M3;
  if (c.dtype != core::DType::kBF16 && c.dtype != core::DType::kF16 && !fp8)
    return core::Error{"cuBLASLt GEMM: weights must be BF16, F16 or FP8 E4M3"};
  if (c.y_type != core::DType::kF32 && c.y_type != (fp8 ? core::DType::kBF16 : c.dtype))
    return core::Error{"cuBLASLt GEMM: the output is fp32 or the weights' 16-bit type (bf16 for FP8)"};
  if (fp8 && (!c.w_scale || !c.x_scale || c.K % 512 != 0 || c.N % 8 != 0 || c.T % 8 != 0))
    return core::Error{"cuBLASLt FP8 GEMM: needs both block scales, K % 512 == 0 and N, T multiples of 8"};
  const cudaDataType_t ab = lt_type(c.dtype);
  // Row-major y[T, N] is column-major y^T[N, T] = W x^T: A = W seen as column-major [K, N] (transposed), B =
  // x seen as column-major [K, T].
  DF_LT_TRY(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  DF_LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  DF_LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (fp8) {
    // A (W) scaled per 128 x 128 block, B (x) per 128 elements of its inner dimension; cuBLASLt promotes
    // each K block's partial sums to fp32 with both scales.
    const cublasLtMatmulMatrixScale_t ma = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                      mb = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    DF_LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma));
    DF_LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb));
    DF_LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &c.w_scale,
                                             sizeof c.w_scale));
    DF_LT_TRY(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &c.x_scale,
                                             sizeof c.x_scale));
  }
  DF_LT_TRY(
      cublasLtMatrixLayoutCreate(&d.a, ab, static_cast<uint64_t>(c.K), static_cast<uint64_t>(c.N), c.K));
  DF_LT_TRY(
      cublasLtMatrixLayoutCreate(&d.b, ab, static_cast<uint64_t>(c.K), static_cast<uint64_t>(c.T), c.K));
  DF_LT_TRY(cublasLtMatrixLayoutCreate(&d.c, lt_type(c.y_type), static_cast<uint64_t>(c.N),
                                       static_cast<uint64_t>(c.T), c.ldy));
  return core::Status();
}

core::Status Gemm::heuristics(const GemmCall& c, Descs& d, int count, std::vector<Algo>& out) const {
  cublasLtMatmulPreference_t pref = nullptr;
  DF_LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
  struct Guard {
    cublasLtMatmulPreference_t p;
    ~Guard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint32_t al_a = alignment(c.W), al_b = alignment(c.x), al_c = alignment(c.y);
  DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace_bytes_, sizeof workspace_bytes_));
  DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                                 sizeof al_a));
  DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                                 sizeof al_b));
  DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                                 sizeof al_c));
  DF_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                                 sizeof al_c));
  std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<size_t>(count));
  int found = 0;
  DF_LT_TRY(
      cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, pref, count, res.data(), &found));
  out.clear();
  for (int i = 0; i < found; ++i) {
    if (res[static_cast<size_t>(i)].state != CUBLAS_STATUS_SUCCESS ||
        res[static_cast<size_t>(i)].workspaceSize > workspace_bytes_)
      continue;
    Algo a;
    static_assert(sizeof(a.data) == sizeof(res[0].algo));
    std::memcpy(a.data, &res[static_cast<size_t>(i)].algo, sizeof a.data);
    out.push_back(a);
  }
  if (out.empty())
    return core::Error{"cuBLASLt: no algorithm for N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                       " T=" + std::to_string(c.T)};
  return core::Status();
}

core::Status Gemm::launch(const GemmCall& c, const Descs& d, const Algo& a, cudaStream_t stream) const {
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, a.data, sizeof algo);
  const float alpha = 1.0f, beta = 0.0f;
  DF_LT_TRY(cublasLtMatmul(handle_, d.op, &alpha, c.W, d.a, c.x, d.b, &beta, c.y, d.c, c.y, d.c, &algo,
                           workspace_, workspace_bytes_, stream));
  return core::Status();
}

core::Expected<const Gemm::Algo*> Gemm::algo_for(const GemmCall& c, Descs& d) {
  const Key key = key_of(c);
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    std::vector<Algo> first;
    DF_TRY(heuristics(c, d, 1, first));
    it = algos_.emplace(key, first[0]).first;
  }
  return &it->second;
}

core::Status Gemm::run(const GemmCall& c, cudaStream_t stream) {
  if (c.N == 0 || c.T == 0) return core::Status();
  Descs d;
  DF_TRY(describe(c, d));
  DF_ASSIGN(const Algo* a, algo_for(c, d));
  return launch(c, d, *a, stream);
}

bool Gemm::supports(const GemmCall& c) {
  Descs d;
  return describe(c, d).is_ok() && algo_for(c, d).is_ok();
}

core::Status Gemm::tune(const GemmCall& c, int candidates, cudaStream_t stream) {
  if (c.N == 0 || c.T == 0) return core::Status();
  const Key key = key_of(c);
  if (algos_.count(key)) return core::Status();
  Descs d;
  DF_TRY(describe(c, d));
  std::vector<Algo> algos;
  DF_TRY(heuristics(c, d, std::max(candidates, 1), algos));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  DF_CUDA_TRY(cudaEventCreate(&e0));
  DF_CUDA_TRY(cudaEventCreate(&e1));
  struct Guard {
    cudaEvent_t a, b;
    ~Guard() {
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
  } guard{e0, e1};
  constexpr int kReps = 3;
  GemmTuning rec{c.N, c.K, c.T, 0, 0, 0, 0};
  int best = -1;
  for (size_t i = 0; i < algos.size(); ++i) {
    // An algorithm cuBLASLt offers but cannot run on these buffers is passed over, not an error.
    if (!launch(c, d, algos[i], stream).is_ok()) continue;
    DF_CUDA_TRY(cudaEventRecord(e0, stream));
    core::Status st;
    for (int r = 0; r < kReps && st.is_ok(); ++r) st = launch(c, d, algos[i], stream);
    DF_CUDA_TRY(cudaEventRecord(e1, stream));
    DF_CUDA_TRY(cudaEventSynchronize(e1));
    if (!st.is_ok()) continue;
    float ms = 0;
    DF_CUDA_TRY(cudaEventElapsedTime(&ms, e0, e1));
    const double s = ms * 1e-3 / kReps;
    ++rec.candidates;
    if (i == 0) rec.heuristic_s = s;
    if (best < 0 || s < rec.best_s) {
      best = static_cast<int>(i);
      rec.best_s = s;
    }
  }
  if (best < 0)
    return core::Error{"cuBLASLt: no algorithm ran for N=" + std::to_string(c.N) +
                       " K=" + std::to_string(c.K) + " T=" + std::to_string(c.T)};
  rec.chosen = best;
  algos_.emplace(key, algos[static_cast<size_t>(best)]);
  tunings_.push_back(rec);
  return core::Status();
}

}  // namespace deltaflow::backend::cuda
