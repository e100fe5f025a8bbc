#!/usr/bin/env bash
# The one script a device call runs (from the repo root, with `.whl` carried):
#   GPU tests, compute-sanitizer memcheck + racecheck on a small case, then the benchmark.
# Logs go to $OUT (pytest.log, sanitize.log, bench.log, latest.json); the benchmark's table is printed last.
# Knobs: BENCH_ARGS (passed to bench/bench_fwd.py), PYTEST_ARGS, SKIP_TESTS=1, SKIP_SANITIZER=1.
set -u
OUT=${OUT:-/tmp/maskc_out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .whl/site .whl/*.whl \
  && export PYTHONPATH=$PWD:$PWD/.whl/site:${PYTHONPATH:-} || exit 1
export PYTHONUNBUFFERED=1 MASKC_CACHE_DIR=/tmp/maskc_cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"

summary=()
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout ${PYTEST_TIMEOUT:-170} python3 -m pytest -m gpu -x -q ${PYTEST_ARGS:-tests/test_runtime_gpu.py} 2>&1 | tee "$OUT/pytest.log"
  summary+=("pytest: $(tail -n 1 "$OUT/pytest.log")")
fi
if [ -z "${SKIP_SANITIZER:-}" ]; then
  for tool in memcheck racecheck; do
    timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool $tool --target-processes all python3 bench/sanitize_case.py > "$OUT/sanitize_$tool.log" 2>&1
    summary+=("sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Hazard' "$OUT/sanitize_$tool.log" | tail -n 2 | tr '\n' ' ')")
  done
fi
timeout ${BENCH_TIMEOUT:-200} python3 bench/bench_fwd.py --out "$OUT/latest.json" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
rc=$?
grep -v '^| ' "$OUT/bench.log" | tail -n 25
for s in "${summary[@]}"; do echo "$s"; done
echo "bench rc=$rc"
grep '^| ' "$OUT/bench.log"
