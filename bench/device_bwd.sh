#!/usr/bin/env bash
# One device call for the backward (issue 14): its GPU tests, bench/bench_bwd.py side by side with Flex
# (Triton and FA4 backends), FA4 and cuDNN, and optionally ncu profiles of maskc's dK/dV kernel and FA4's
# backward (causal 32K). Run from the repo root after the install line of ../shared/gpu/prepare.sh fa4. Logs
# go to $OUT; a short summary and the benchmark's tables are printed last.
# Knobs: PYTEST_ARGS (tests/test_backward_gpu.py ...; SKIP_TESTS=1), PRECOMPILE_ENGINES (dK/dV engines whose
# kernels NVRTC compiles in parallel beside the tests), BWD_BENCH_ARGS (SKIP_BENCH=1), NCU=1 with NCU_ENGINES (the
# dK/dV engines to profile, default the schedule's), NCU_SASS=1 (also per-instruction SASS counts), *_TIMEOUT.
set -u
OUT=${OUT:-/tmp/maskc_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MASKC_CACHE_DIR=${MASKC_CACHE_DIR:-/tmp/maskc_cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
summary=()
if [ -z "${SKIP_TESTS:-}" ]; then
  [ -n "${PRECOMPILE_ENGINES:-}" ] && timeout ${PYTEST_TIMEOUT:-240} python3 bench/precompile.py \
    --backward-engines "$PRECOMPILE_ENGINES" > "$OUT/precompile.log" 2>&1 &
  eval timeout ${PYTEST_TIMEOUT:-240} python3 -m pytest -m gpu -v -p no:cacheprovider -rf \
    ${PYTEST_ARGS:-tests/test_backward_gpu.py} > "$OUT/pytest.log" 2>&1
  summary+=("pytest: rc=$? $(grep -c PASSED "$OUT/pytest.log") passed; $(tail -n 1 "$OUT/pytest.log")")
  [ -n "${PRECOMPILE_ENGINES:-}" ] && { kill $! 2> /dev/null; wait; }
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -n 20
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  eval timeout ${BENCH_TIMEOUT:-300} python3 bench/bench_bwd.py --out "$OUT/bwd.json" \
    ${BWD_BENCH_ARGS:---lengths 4096,32768} > "$OUT/bench.log" 2>&1
  summary+=("bench_bwd: rc=$?")
fi
if [ -n "${NCU:-}" ]; then
  for engine in ${NCU_ENGINES:-default}; do
    [ "$engine" = default ] && unset MASKC_BWD_ENGINE || export MASKC_BWD_ENGINE=$engine
    timeout ${NCU_TIMEOUT:-100} ncu --clock-control none --set full -k regex:dkdv -c 1 --launch-skip 2 --csv \
      --page details python3 bench/profile_case.py maskc --backward > "$OUT/ncu_$engine.csv" 2> "$OUT/ncu_$engine.err"
    summary+=("ncu $engine: rc=$? $(wc -l < "$OUT/ncu_$engine.csv") lines")
    if [ -n "${NCU_SASS:-}" ]; then   # executed instructions per SASS line, for the instruction budget
      timeout ${NCU_TIMEOUT:-100} ncu --clock-control none --section InstructionStats --section SourceCounters \
        -k regex:dkdv -c 1 --launch-skip 2 --page source --print-source sass --csv python3 bench/profile_case.py \
        maskc --backward > "$OUT/sass_$engine.csv" 2> "$OUT/sass_$engine.err"
      summary+=("ncu sass $engine: rc=$? $(wc -l < "$OUT/sass_$engine.csv") lines")
    fi
  done
  unset MASKC_BWD_ENGINE
  [ -f "$OUT/ncu_fa4.csv" ] || timeout ${NCU_TIMEOUT:-100} ncu --clock-control none --set full -k regex:BackwardSm90 \
    -c 1 --launch-skip 2 --csv --page details python3 bench/profile_case.py fa4 --backward > "$OUT/ncu_fa4.csv" \
    2> "$OUT/ncu_fa4.err"
  for engine in ${NCU_ENGINES:-default}; do
    python3 bench/ncu_compare.py "$OUT/ncu_$engine.csv" "$OUT/ncu_fa4.csv" > "$OUT/ncu_compare_$engine.txt"
    grep -E "Duration|Executed Instructions  |Registers Per|L2 Hit Rate|DRAM Throughput|Issue Slots Busy" \
      "$OUT/ncu_compare_$engine.txt"
  done
fi
for s in "${summary[@]}"; do echo "$s"; done
[ -f "$OUT/bench.log" ] && grep -E '^\||^#' "$OUT/bench.log"
