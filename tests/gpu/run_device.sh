#!/usr/bin/env bash
# Runs the CUDA checks and benchmarks on the GPU machine from binaries built elsewhere (it has no -dev packages):
#   BIN=<folder with df_gpu_tests and deltaflow> OUT=<log folder> tests/gpu/run_device.sh [tests] [bench] [memcheck]
# The test binary has the fixtures' absolute path compiled in (DF_FIXTURES); FIXTURE_ROOT is where that path
# should point (the checkout this runs in).
set -u
BIN=${BIN:-build-cuda-carry}
# `deltaflow bench`, or df_bench (the same command linked without the HTTP server's shared libraries).
BENCH=${BENCH:-$BIN/deltaflow bench}
[ -x "$BIN/df_bench" ] && BENCH="$BIN/df_bench bench"
OUT=${OUT:-/tmp/df_out}
FIXTURE_ROOT=${FIXTURE_ROOT:-/work/main}
mkdir -p "$OUT"
# Each argument is a target name below or, when quoted with spaces, a shell command of its own.
[ $# -gt 0 ] || set -- tests bench

if [ ! -e "$FIXTURE_ROOT/tests/fixtures" ]; then
  mkdir -p "$(dirname "$FIXTURE_ROOT")" && ln -sfn "$PWD" "$FIXTURE_ROOT"
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"

section() { echo; echo "=== $* ($(date +%T))"; }

for w in "$@"; do
  case $w in
    tests)
      section "gpu tests"
      timeout 150 "$BIN/df_gpu_tests" --gtest_brief=1 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "^\[ +(FAILED|PASSED|OK) +\]|Failure|error|vs cpu|decode steps|tests ran|Expected|Which is|actual" | head -150
      echo "exit ${PIPESTATUS[0]}"
      ;;
    memcheck)
      section "compute-sanitizer memcheck, op tests"
      timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/df_gpu_tests" \
        --gtest_filter='CudaOps.*:CudaEmbedding.*' --gtest_brief=1 >"$OUT/memcheck.log" 2>&1
      echo "exit $?"
      tail -5 "$OUT/memcheck.log"
      ;;
    bench27)
      section "bench qwen3.6-27b"
      timeout 120 $BENCH --synthetic bench/configs/qwen3.6-27b.json --batches 1,8,32 \
        --contexts 512,8192 --prefill 512,8192 --steps 16 2>&1 | tee "$OUT/bench_27b.txt"
      ;;
    bench)
      section "bench qwen3.6-27b"
      timeout 70 $BENCH --synthetic bench/configs/qwen3.6-27b.json --batches 1,8,32 --contexts 512,8192 \
        --prefill 512,8192 --steps 16 2>&1 | tee "$OUT/bench_27b.txt"
      section "bench qwen3.5-35b-a3b"
      timeout 50 $BENCH --synthetic bench/configs/qwen3.5-35b-a3b.json --batches 1,8,32 --contexts 512,8192 \
        --prefill 512,8192 --steps 16 2>&1 | tee "$OUT/bench_35b.txt"
      for m in qwen3.5-4b qwen3.5-0.8b; do
        section "bench $m"
        timeout 30 $BENCH --synthetic bench/configs/$m.json --batches 1,8,32 --contexts 512 \
          --prefill 512,8192 --steps 16 2>&1 | tee "$OUT/bench_$m.txt"
      done
      ;;
    qtests)
      section "gpu tests: quantized kernels and models"
      timeout 120 "$BIN/df_gpu_tests" --gtest_brief=1 \
        --gtest_filter='CudaGemvQuant*:CudaQuant*:CudaFp8Gemm*:Fixtures/CudaQuantModel*' 2>&1 | tee "$OUT/gpu_qtests.log" |
        grep -E "^\[ +(FAILED|PASSED|OK) +\]|Failure|error|vs cpu|tests ran|Expected|Which is|actual" | head -80
      echo "exit ${PIPESTATUS[0]}"
      ;;
    gemv)
      section "bench --gemv"
      timeout 120 $BENCH --gemv nvfp4,fp8-block,bf16 --shapes 17408x5120,5120x17408,34816x5120 \
        --rows 1,4,8,16,32 2>&1 | tee "$OUT/bench_gemv.txt"
      ;;
    gemvsweep)
      for ks in 4 8; do
        for u in 4 8; do
          section "bench --gemv, DELTAFLOW_QGEMV_KS=$ks DELTAFLOW_QGEMV_U=$u"
          DELTAFLOW_QGEMV_KS=$ks DELTAFLOW_QGEMV_U=$u timeout 60 $BENCH --gemv nvfp4,fp8-block \
            --shapes 17408x5120,5120x17408,34816x5120,1024x2048,2048x512 --rows 1,4,8 2>&1 |
            tee "$OUT/bench_gemv_ks${ks}_u$u.txt"
        done
      done
      ;;
    gemvmoe)
      section "bench --gemv --experts 256 (Qwen3.5-35B-A3B's expert shapes: gate_up, down)"
      timeout 60 $BENCH --gemv nvfp4,fp8-block --shapes 1024x2048,2048x512 --experts 256 --rows 8,64 2>&1 |
        tee "$OUT/bench_gemv_moe.txt"
      ;;
    ncugemv)
      for rows in 1 8; do
        section "ncu: NVFP4 GEMV 17408x5120, $rows rows"
        timeout 120 ncu --kernel-name regex:kernel_gemv --launch-skip 20 --launch-count 1 \
          --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
          $BENCH --gemv nvfp4 --shapes 17408x5120 --rows $rows --iters 30 2>&1 |
          grep -E "kernel_gemv|Throughput|Duration|Occupancy|Registers|Grid Size|Block Size|Warp Cycles|Stall|stalled|Est\." |
          tee "$OUT/ncu_gemv_$rows.txt" | head -40
      done
      ;;
    bench27q)
      for q in "" nvfp4-mixed fp8-block; do
        section "bench qwen3.6-27b ${q:-bf16}"
        timeout 150 $BENCH --synthetic bench/configs/qwen3.6-27b.json ${q:+--quant $q} --batches 1,8 \
          --contexts 512 --prefill 8192 --steps 16 2>&1 | tee "$OUT/bench_27b_${q:-bf16}.txt"
      done
      ;;
    bench35q)
      for q in "" nvfp4-mixed; do
        section "bench qwen3.5-35b-a3b ${q:-bf16}"
        timeout 120 $BENCH --synthetic bench/configs/qwen3.5-35b-a3b.json ${q:+--quant $q} --batches 1,8 \
          --contexts 512 --prefill 4096 --steps 16 2>&1 | tee "$OUT/bench_35b_${q:-bf16}.txt"
      done
      ;;
    prof27q)
      section "profile qwen3.6-27b nvfp4-mixed decode"
      timeout 120 $BENCH --synthetic bench/configs/qwen3.6-27b.json --quant nvfp4-mixed --batches 1 \
        --contexts 512 --prefill 512 --steps 8 --profile 2>&1 | tee "$OUT/prof_27b_nvfp4.txt" | head -60
      ;;
    prof35q)
      section "profile qwen3.5-35b-a3b nvfp4-mixed decode"
      timeout 120 $BENCH --synthetic bench/configs/qwen3.5-35b-a3b.json --quant nvfp4-mixed --batches 1 \
        --contexts 512 --prefill 512 --steps 8 --profile 2>&1 | tee "$OUT/prof_35b_nvfp4.txt" | head -60
      ;;
    *)
      section "$w"
      timeout 200 bash -c "$w" 2>&1 | tee -a "$OUT/extra.log"
      ;;
  esac
done
