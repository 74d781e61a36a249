#!/usr/bin/env bash
# The fuzzing campaign: every libFuzzer target of tests/fuzz, each for SECONDS, starting from its corpus kept in
# the repository (tests/fuzz/corpus/<target>/).
#
#   tests/fuzz/run_campaign.sh SECONDS [TARGET...]
#
# Builds with clang, -DDELTAFLOW_FUZZ=ON (libFuzzer + ASan + UBSan, our libraries instrumented for coverage)
# in build-fuzz/ (override with BUILD_DIR), then runs the targets one after another (JOBS=N: N at once). New
# inputs libFuzzer finds go to BUILD_DIR/corpus/<target>/, never into the repository; findings (crash-*,
# timeout-*, oom-*, leak-*) to BUILD_DIR/findings/<target>/. Prints per target: runs, execs/s, coverage
# (edges) and features, corpus size, findings; exits 1 when any target has a finding, 2 when the build fails.
# Findings stay in BUILD_DIR/findings until removed, so a later run reports them again. A finding's input,
# once fixed, belongs in tests/fuzz/corpus/<target>/ as a regression seed. Time: ~12 minutes for the first
# build on 2 shared cores, then SECONDS x 11 targets (JOBS=1).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ || "$1" -lt 1 ]]; then
  echo "usage: tests/fuzz/run_campaign.sh SECONDS [TARGET...]" >&2
  exit 2
fi
SECONDS_PER_TARGET=$1
shift
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-1}
CC_BIN=${CC:-clang}
CXX_BIN=${CXX:-clang++}
if ! command -v "$CXX_BIN" >/dev/null; then
  echo "run_campaign.sh: $CXX_BIN not found (apt-get install clang)" >&2
  exit 2
fi

if [[ $# -gt 0 ]]; then
  TARGETS=("$@")
else
  mapfile -t TARGETS < <(cd tests/fuzz && ls fuzz_*.cpp | sed 's/\.cpp$//')
fi

echo "=== building ${TARGETS[*]} in $BUILD_DIR ==="
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  mkdir -p "$BUILD_DIR"
  CC=$CC_BIN CXX=$CXX_BIN cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDELTAFLOW_CUDA=OFF -DDELTAFLOW_FUZZ=ON >"$BUILD_DIR/cmake.log" 2>&1 ||
    { cat "$BUILD_DIR/cmake.log" >&2; exit 2; }
fi
ninja -C "$BUILD_DIR" -j"${BUILD_JOBS:-2}" "${TARGETS[@]}" || exit 2

run_target() {
  local t=$1
  local work="$BUILD_DIR/corpus/$t" findings="$BUILD_DIR/findings/$t" log="$BUILD_DIR/logs/$t.log"
  mkdir -p "$work" "$findings" "$(dirname "$log")"
  : >"$log"
  local end=$(($(date +%s) + SECONDS_PER_TARGET)) left
  # A run that stops on a timeout or slow-unit report that does not reproduce alone (recheck_reports) goes
  # on for the time left: the finding was the machine, not the input, and the hour is still owed.
  while left=$((end - $(date +%s))); [[ $left -gt 0 ]]; do
    # The first folder receives new inputs; the repository's corpus is read only.
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$BUILD_DIR/tests/$t" -max_total_time="$left" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$findings/" "$work" "tests/fuzz/corpus/$t" \
      >>"$log" 2>&1 || true
    [[ -n $(find "$findings" -maxdepth 1 -type f) ]] || break
    recheck_reports "$t"
    [[ -z $(find "$findings" -maxdepth 1 -type f) ]] || break
  done
}

# A timeout or slow-unit report (libFuzzer's 10 s) is timed again alone: one that runs in under 2 s (a fuzzer
# starved by other work on the machine, not a slow input) moves to findings/<target>/unreproduced/ and is not
# counted.
recheck_reports() {
  local t=$1 f ms
  for f in $(find "$BUILD_DIR/findings/$t" -maxdepth 1 -type f \( -name 'slow-unit-*' -o -name 'timeout-*' \)); do
    ms=$(timeout 60 "$BUILD_DIR/tests/$t" -runs=1 "$f" 2>&1 | sed -n 's/^Executed .* in \([0-9]*\) ms$/\1/p')
    if [[ -n "$ms" && "$ms" -lt 2000 ]]; then
      mkdir -p "$BUILD_DIR/findings/$t/unreproduced"
      mv "$f" "$BUILD_DIR/findings/$t/unreproduced/"
      echo "$t: $(basename "$f") ran in $ms ms alone: not counted (findings/$t/unreproduced/)" >&2
    fi
  done
}

summary() {
  local t=$1 log="$BUILD_DIR/logs/$1.log"
  local execs rate cov ft corpus found
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | awk '{s += $1} END {if (NR) print s}')
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corpus=$(find "$BUILD_DIR/corpus/$t" "tests/fuzz/corpus/$t" -type f | wc -l)
  recheck_reports "$t"
  found=$(find "$BUILD_DIR/findings/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' \
    -o -name 'leak-*' -o -name 'slow-unit-*' \) | wc -l)
  printf '%-26s %12s %9s %8s %8s %8s %9s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$corpus" "$found"
  [[ "$found" -eq 0 && -n "$execs" ]]
}

echo "=== fuzzing ${#TARGETS[@]} targets for ${SECONDS_PER_TARGET}s each (JOBS=$JOBS) ==="
start=$(date +%s)
running=0
for t in "${TARGETS[@]}"; do
  run_target "$t" &
  running=$((running + 1))
  if [[ $running -ge $JOBS ]]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait
printf '%-26s %12s %9s %8s %8s %8s %9s\n' target execs exec/s cov ft corpus findings
status=0
for t in "${TARGETS[@]}"; do
  summary "$t" || status=1
done
echo "=== $(( $(date +%s) - start ))s; logs in $BUILD_DIR/logs, findings in $BUILD_DIR/findings ==="
if [[ $status -ne 0 ]]; then
  for t in "${TARGETS[@]}"; do
    for f in $(find "$BUILD_DIR/findings/$t" -maxdepth 1 -type f 2>/dev/null); do echo "finding: $t: $f" >&2; done
    grep -m1 -A3 'ERROR: \|runtime error' "$BUILD_DIR/logs/$t.log" >&2 || true
  done
fi
exit $status
