#!/usr/bin/env bash
# One device call that checks everything on a GPU (from the repo root, `.whl` carried as for the other
# device scripts): every GPU test, compute-sanitizer memcheck and racecheck on bench/sanitize_case.py
# (forward and backward), and the training example. The benchmarks have their own entry points
# (device_fwd.sh, bench_bwd.py, bench_overhead.py, device_bwd_variants.sh) but the end-to-end HSTU training step
# (bench/bench_train_step.py at 32K: re-bind + forward + backward against Flex-FA4, issue 16), run last; for its
# flex_fa4 records FA4 must be on PYTHONPATH (the install line of ../shared/gpu/prepare.sh fa4). Logs go to $OUT;
# a summary last. Knobs: PYTEST_FWD / PYTEST_REST (the two processes' test files), SKIP_TESTS=1, SKIP_SANITIZER=1
# (SAN_TOOLS to run fewer), SKIP_TRAIN=1, SKIP_TRAIN_STEP=1 (TRAIN_STEP_ARGS for its options), and *_TIMEOUT for
# each step. The MASKC_* variables apply (README: Options and environment
# variables), for instance MASKC_ENGINE=mma to run everything on the portable kernels.
set -u
OUT=${OUT:-/tmp/maskc_out}; mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .whl/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=$PWD/.whl/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 MASKC_CACHE_DIR=${MASKC_CACHE_DIR:-/tmp/maskc_cache}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
summary=()

# NVRTC compiles of every engine's kernels, in parallel, beside the tests (which find them in the shared disk
# cache, or compile what they reach first); two pytest processes share the GPU, since each mostly waits for
# NVRTC. -v: a test's result is in the log as soon as it ends, so a run cut short still names its failures.
timeout ${PRECOMPILE_TIMEOUT:-180} python3 bench/precompile.py --backward --all-engines > "$OUT/precompile.log" 2>&1 &
if [ -z "${SKIP_TESTS:-}" ]; then
  eval timeout ${PYTEST_TIMEOUT:-540} python3 -m pytest -m gpu -v -p no:cacheprovider -rf \
    ${PYTEST_FWD:-tests/test_runtime_gpu.py tests/test_exp2_fma_gpu.py} > "$OUT/pytest_fwd.log" 2>&1 &
  eval timeout ${PYTEST_TIMEOUT:-540} python3 -m pytest -m gpu -v -p no:cacheprovider -rf \
    ${PYTEST_REST:-tests/test_backward_gpu.py tests/test_widths_gpu.py tests/test_tma.py tests/test_distributed.py} \
    > "$OUT/pytest_rest.log" 2>&1 &
  wait
  for log in "$OUT"/pytest_fwd.log "$OUT"/pytest_rest.log; do
    summary+=("$(basename "$log"): $(grep -c ' PASSED' "$log") passed, $(grep -c ' FAILED' "$log") failed; $(tail -n 1 "$log")")
    grep -E " FAILED|^E  " "$log" | head -n 40
  done
fi
wait
summary+=("precompile: $(tail -n 1 "$OUT/precompile.log")")
if [ -z "${SKIP_SANITIZER:-}" ]; then
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    timeout ${SAN_TIMEOUT:-60} compute-sanitizer --tool $tool --target-processes all python3 bench/sanitize_case.py \
      > "$OUT/sanitize_$tool.log" 2>&1
    summary+=("sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Hazard' "$OUT/sanitize_$tool.log" \
      | tail -n 2 | tr '\n' ' ')")
  done
fi
if [ -z "${SKIP_TRAIN:-}" ]; then
  timeout ${TRAIN_TIMEOUT:-120} python3 examples/train_packed.py > "$OUT/train.log" 2>&1
  summary+=("train_packed.py (GPU): rc=$? $(tail -n 1 "$OUT/train.log")")
fi
if [ -z "${SKIP_TRAIN_STEP:-}" ]; then
  eval timeout ${TRAIN_STEP_TIMEOUT:-360} python3 bench/bench_train_step.py --out "$OUT/train_step.json" \
    ${TRAIN_STEP_ARGS:---lengths 32768} > "$OUT/train_step.log" 2>&1
  summary+=("bench_train_step: rc=$? $(grep -c '"ms": [0-9]' "$OUT/train_step.log") records timed")
fi
for s in "${summary[@]}"; do echo "$s"; done
[ -f "$OUT/train_step.log" ] && grep -E '^\||^#' "$OUT/train_step.log"
