#!/usr/bin/env bash
# One device call for the forward (issue 13): a quick probe of the Hopper kernel, the forward GPU tests, the
# side-by-side benchmark against Flex (Triton and FA4 backends), FA4 and cuDNN, and optionally ncu profiles of
# maskc's and FA4's causal kernels. Run from the repo root after the install line of ../shared/gpu/prepare.sh
# fa4 (lark and FA4 on PYTHONPATH). Logs go to $OUT; a short summary and the benchmark's table are printed last.
# Knobs: SKIP_PROBE, SKIP_TESTS, SKIP_BENCH, SANITIZE, NCU=1, PRECOMPILE_ARGS, PYTEST_ARGS, BENCH_ARGS (for bench_fwd.py, repeated runs
# separated by ';'), *_TIMEOUT; PROFILE_ARGS for bench/profile_case.py (`--backward` with
# NCU_KERNEL='dkdv|BackwardSm90' profiles the two backwards instead).
set -u
OUT=${OUT:-/tmp/maskc_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MASKC_CACHE_DIR=/tmp/maskc_cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
summary=()

# NVRTC compiles of the kernels the tests and benchmark use, in parallel (the GPU idles meanwhile anyway).
timeout ${PRECOMPILE_TIMEOUT:-120} python3 bench/precompile.py ${PRECOMPILE_ARGS:-} > "$OUT/precompile.log" 2>&1
summary+=("precompile: rc=$? $(tail -n 1 "$OUT/precompile.log")")

if [ -z "${SKIP_PROBE:-}" ]; then
  timeout ${PROBE_TIMEOUT:-60} python3 bench/wgmma_probe.py wgmma_tma > "$OUT/probe.log" 2>&1
  rc=$?; summary+=("probe: rc=$rc"); cat "$OUT/probe.log"
  if [ $rc -ne 0 ]; then SKIP_BENCH=1; NCU=; summary+=("probe failed: benchmark and profiles skipped"); fi
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  eval timeout ${PYTEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -p no:cacheprovider -x \
    ${PYTEST_ARGS:-tests/test_runtime_gpu.py} > "$OUT/pytest.log" 2>&1
  summary+=("pytest: $(tail -n 1 "$OUT/pytest.log")")
  grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -n 10
fi
if [ -n "${SANITIZE:-}" ]; then   # SANITIZE="memcheck racecheck": the forward on sanitize_case.py's cases
  for tool in $SANITIZE; do
    timeout ${SAN_TIMEOUT:-60} compute-sanitizer --tool $tool python3 bench/sanitize_case.py --forward > "$OUT/sanitize_$tool.log" 2>&1
    summary+=("sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -n 1)")
  done
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  IFS=';' read -ra runs <<< "${BENCH_ARGS:---lengths 4096,32768}"
  i=0
  for a in "${runs[@]}"; do
    eval timeout ${BENCH_TIMEOUT:-300} python3 bench/bench_fwd.py --out "$OUT/fwd$i.json" $a > "$OUT/bench$i.log" 2>&1
    summary+=("bench $i ($a): rc=$?"); i=$((i + 1))
  done
fi
if [ -n "${NCU:-}" ]; then
  for who in maskc fa4; do
    timeout ${NCU_TIMEOUT:-120} ncu --clock-control none --set full -k regex:${NCU_KERNEL:-"maskc_fwd|FlashAttention|flash_fwd"} \
      -c 1 --launch-skip ${NCU_SKIP:-3} --csv --page details python3 bench/profile_case.py $who ${PROFILE_ARGS:-} > "$OUT/ncu_$who.csv" 2> "$OUT/ncu_$who.err"
    summary+=("ncu $who: rc=$? $(wc -l < "$OUT/ncu_$who.csv") lines")
  done
  python3 bench/ncu_compare.py "$OUT/ncu_maskc.csv" "$OUT/ncu_fa4.csv" | tee "$OUT/ncu_compare.txt"
fi
for s in "${summary[@]}"; do echo "$s"; done
for f in "$OUT"/bench*.log; do [ -f "$f" ] && grep -E '^\||^#' "$f"; done
