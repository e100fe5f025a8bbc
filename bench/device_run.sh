#!/usr/bin/env bash
# The one script a device call runs (from the repo root, with `.whl` carried):
#   GPU tests, compute-sanitizer memcheck + racecheck on a small case, then the forward and backward benchmarks.
# Logs go to $OUT (pytest.log, sanitize_*.log, bench.log, latest.json, bench_bwd.log, latest_bwd.json); the
# benchmarks' tables are printed last.
# Knobs: SKIP_PROBE=1 (bench/wgmma_probe.py, first; PROBE_ENGINES to probe fewer), BENCH_ARGS / BWD_BENCH_ARGS (passed to bench/bench_fwd.py / bench_bwd.py), PYTEST_ARGS, SKIP_TESTS=1,
# SKIP_SANITIZER=1 (SAN_TOOLS to run fewer), SKIP_TRAIN=1, SKIP_BENCH=1, SKIP_BWD_BENCH=1, SKIP_OVERHEAD=1, and *_TIMEOUT for each step.
set -u
OUT=${OUT:-/tmp/maskc_out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .whl/site .whl/*.whl \
  && export PYTHONPATH=$PWD:$PWD/.whl/site:${PYTHONPATH:-} || exit 1
export PYTHONUNBUFFERED=1 MASKC_CACHE_DIR=/tmp/maskc_cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$OUT/gpu.txt"

# Compile every cubin the tests and the benchmark need, in parallel, into MASKC_CACHE_DIR (NVRTC, no GPU).
timeout ${PRECOMPILE_TIMEOUT:-120} python3 - <<'PY' 2>&1 | tail -n 3 | tee "$OUT/precompile.log"
import glob, os, itertools
from concurrent.futures import ProcessPoolExecutor
def job(a):
    path, d, dt, env, tiles = a
    for key in ("MASKC_ENGINE", "MASKC_INTERVAL_PATH", "MASKC_SINGLE_BODY"):   # a pool worker runs many jobs
        os.environ.pop(key, None)
    os.environ.update(env)
    import maskc
    from maskc import runtime
    from maskc.emit import emit_backward_kernel, emit_kernel, compile_to_cubin
    kw = dict(zip(("block_m", "block_n", "num_warps", "engine"), tiles)) if tiles else {}
    mask = maskc.load(path)
    if mask.const_params:   # compiled per value: the tests and the bench build their own
        return 0
    if tiles in ("bwd_mma", "bwd_wgmma"):
        src = emit_backward_kernel(mask.backward_spec(head_dim=d, dtype=dt, engine=tiles[4:]))
    else:
        src = emit_kernel(mask.kernel_spec(head_dim=d, dtype=dt, **kw))
    out = runtime.cache_dir() / f"{src.entry}-{runtime.kernel_key(src)[:32]}.cubin"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp%d" % os.getpid()); tmp.write_bytes(compile_to_cubin(src)); os.replace(tmp, out)
    return 1
ex = sorted(glob.glob("examples/*.mask"))
jobs = [(p, d, dt, {}, t) for p in ex for d in (64, 128) for dt in ("bf16", "fp16") for t in (None, "bwd_mma", "bwd_wgmma")]
jobs += [(p, 128, "bf16", {"MASKC_INTERVAL_PATH": "0", "MASKC_SINGLE_BODY": "0", "MASKC_ENGINE": e}, None)
         for p in ex for e in ("mma", "wgmma", "wgmma_tma")]
jobs += [(p, d, dt, {"MASKC_ENGINE": e}, None) for p in ex for d, dt in ((64, "fp16"), (128, "bf16"))
         for e in ("mma", "wgmma", "wgmma_tma")]
jobs += [("examples/hstu.mask", 256, "bf16", {}, None), ("examples/causal.mask", 128, "bf16", {}, (128, 64, 8, "mma"))]
with ProcessPoolExecutor(min(32, os.cpu_count())) as pool:
    print("precompiled", sum(pool.map(job, jobs)), "kernels")
PY

summary=()
ENGINES=${ENGINES:-mma,wgmma,wgmma_tma}
if [ -z "${SKIP_PROBE:-}" ]; then
  for e in ${PROBE_ENGINES:-mma wgmma wgmma_tma}; do   # one process per engine: a hang costs only its own cases
    timeout ${PROBE_TIMEOUT:-45} python3 bench/wgmma_probe.py $e 2>&1 | tee -a "$OUT/probe.log"
    summary+=("probe $e: rc=${PIPESTATUS[0]}")
  done
  # An engine the probe found wrong, or never reached (a hang), is left out of the tests and benchmarks.
  left_out=()
  for e in wgmma wgmma_tma; do
    if grep -qE "^\S+ +S= *[0-9]+ D= *[0-9]+ $e(/persistent)? *: (FAILED|.*WRONG)" "$OUT/probe.log" \
       || ! grep -qE "S= 4096 D=128 $e( |/)" "$OUT/probe.log"; then
      ENGINES=$(echo $ENGINES | sed "s/,$e\b//"); left_out+=("not $e")
      summary+=("engine $e left out: the probe found it wrong or did not finish")
    fi
  done
  if [ ${#left_out[@]} -gt 0 ]; then
    kexpr=$(IFS=@; echo "${left_out[*]}" | sed 's/@/ and /g')
    PYTEST_ARGS="${PYTEST_ARGS:-tests/test_runtime_gpu.py tests/test_backward_gpu.py} -k '$kexpr'"
  fi
fi
BENCH_ARGS="${BENCH_ARGS:-} --engines $ENGINES"
if [ -z "${SKIP_TESTS:-}" ]; then
  eval timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider ${PYTEST_ARGS:-tests/test_runtime_gpu.py tests/test_backward_gpu.py} > "$OUT/pytest.log" 2>&1
  summary+=("pytest: $(tail -n 1 "$OUT/pytest.log")")
fi
if [ -z "${SKIP_SANITIZER:-}" ]; then
  for tool in ${SAN_TOOLS:-memcheck racecheck}; do
    timeout ${SAN_TIMEOUT:-45} compute-sanitizer --tool $tool --target-processes all python3 bench/sanitize_case.py > "$OUT/sanitize_$tool.log" 2>&1
    summary+=("sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Hazard' "$OUT/sanitize_$tool.log" | tail -n 2 | tr '\n' ' ')")
  done
fi
if [ -z "${SKIP_TRAIN:-}" ]; then
  timeout ${TRAIN_TIMEOUT:-120} python3 examples/train_packed.py > "$OUT/train.log" 2>&1
  summary+=("train_packed.py (GPU): rc=$? $(tail -n 1 "$OUT/train.log")")
fi
rc=skipped; rc_bwd=skipped
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout ${BENCH_TIMEOUT:-170} python3 bench/bench_fwd.py --out "$OUT/latest.json" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  rc=$?
fi
if [ -z "${SKIP_BWD_BENCH:-}" ]; then
  timeout ${BWD_BENCH_TIMEOUT:-240} python3 bench/bench_bwd.py --out "$OUT/latest_bwd.json" ${BWD_BENCH_ARGS:-} > "$OUT/bench_bwd.log" 2>&1
  rc_bwd=$?
fi
[ -f "$OUT/pytest.log" ] && grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -n 30
for f in bench.log bench_bwd.log; do [ -f "$OUT/$f" ] && grep -v '^| ' "$OUT/$f" | grep -v '^{' | tail -n 8; done
if [ -z "${SKIP_OVERHEAD:-}" ]; then
  timeout ${OVERHEAD_TIMEOUT:-60} python3 bench/bench_overhead.py --out "$OUT/overhead.json" > "$OUT/overhead.log" 2>&1
  summary+=("host overhead: rc=$?"); grep '^| ' "$OUT/overhead.log"
fi
for s in "${summary[@]}"; do echo "$s"; done
echo "bench rc=$rc bwd bench rc=$rc_bwd"
for f in bench.log bench_bwd.log; do [ -f "$OUT/$f" ] && grep '^| ' "$OUT/$f"; done
