#!/usr/bin/env bash
# A device call for the backward's dQ reductions (run from the repo root, `.whl` carried): compile the
# variants in parallel, their GPU tests, bench/bwd_variants.py, then ncu's view of one wgmma dK/dV kernel
# (causal 8K). Logs to $OUT; the tables last.
set -u
OUT=${OUT:-/tmp/maskc_out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target .whl/site .whl/*.whl \
  && export PYTHONPATH=$PWD:$PWD/.whl/site:${PYTHONPATH:-} || exit 1
export PYTHONUNBUFFERED=1 MASKC_CACHE_DIR=/tmp/maskc_cache
timeout 120 python3 - <<'PY' 2>&1 | tail -n 3
import os
from concurrent.futures import ProcessPoolExecutor
def job(a):
    name, d, red = a
    import maskc
    from maskc.codegen.emit import compile_to_cubin
    from maskc.runtime import binary_name, disk_cache
    options = maskc.Options.from_environment().replace(backward_engine="wgmma", dq_reduction=red)
    src = maskc.load(f"examples/{name}.mask").backward_source(options, head_dim=d)
    disk_cache(options).artifact(binary_name(src), lambda: compile_to_cubin(src))
from maskc.kernel_ir import DQ_REDUCTIONS
jobs = [(n, d, r) for n in ("causal", "document", "hstu") for d in (64, 128) for r in DQ_REDUCTIONS]
with ProcessPoolExecutor(16) as pool:
    list(pool.map(job, jobs))
print("precompiled", len(jobs))
PY
timeout ${PYTEST_TIMEOUT:-200} python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_gpu.py -k "${PYTEST_K:-dq_reductions}" -rf \
  > "$OUT/pytest_dq.log" 2>&1
echo "pytest: $(tail -n 1 "$OUT/pytest_dq.log")"; grep -E "^(FAILED|ERROR)" "$OUT/pytest_dq.log" | head
timeout ${VARIANTS_TIMEOUT:-200} python3 bench/bwd_variants.py ${VARIANTS_ARGS:-} > "$OUT/variants.log" 2>&1; echo "variants rc=$?"
grep '^| ' "$OUT/variants.log"
# PICK=1: the reduction fastest over the variants' 32K rows (dQ within 1e-3 of red2's) is timed by
# bench_bwd.py (wgmma engine) and runs the training example and `maskc run --backward`
if [ -n "${PICK:-}" ]; then
  pick=$(python3 - "$OUT/variants.log" <<'PY'
import sys, collections
total = collections.defaultdict(float)
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(f) == 6 and f[1] == "32768" and f[2] != "det" and (f[5] == "0.0e+00" or float(f[5]) < 1e-3):
        total[f[2]] += float(f[3])
print(min(total, key=total.get) if total else "red2")
PY
)
  echo "picked dQ reduction: $pick"
  export MASKC_BWD_DQ_REDUCTION=$pick
  timeout ${BWD_BENCH_TIMEOUT:-240} python3 bench/bench_bwd.py --engines wgmma --out "$OUT/latest_bwd.json" ${BWD_BENCH_ARGS:-} \
    > "$OUT/bench_bwd.log" 2>&1; echo "bench_bwd rc=$?"
  timeout 60 python3 examples/train_packed.py > "$OUT/train.log" 2>&1; echo "train rc=$? $(tail -n 1 "$OUT/train.log")"
  timeout 60 python3 -m maskc run examples/document.mask --seq-len 3000 --param docs=1000,700,1300 --head-dim 128 \
    --backward > "$OUT/run_backward.log" 2>&1; echo "maskc run --backward rc=$?"; tail -n 5 "$OUT/run_backward.log"
  grep '^| ' "$OUT/bench_bwd.log"
fi
[ -n "${SKIP_NCU:-}" ] && exit 0
# ncu (no clock control): the dK/dV kernel's throughputs, L2 and DRAM traffic and stall reasons, for each of
# its dQ reductions (bwd_variants.py's `det` rows time it without any)
for r in ${NCU_REDUCTIONS:-bulk_tile red2}; do
  MASKC_BWD_DQ_REDUCTION=$r timeout ${NCU_TIMEOUT:-100} ncu --clock-control none -k regex:dkdv -c 1 --section SpeedOfLight \
    --metrics lts__t_sectors_op_red.sum,lts__t_sectors.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
    python3 bench/bwd_variants.py --once --lengths 8192 --masks causal > "$OUT/ncu_$r.log" 2>&1; echo "ncu $r rc=$?"
  grep -E "Duration|Compute \(SM\)|L2 Cache Throughput|lts__|dram__" "$OUT/ncu_$r.log"
  grep -E "issue_stalled" "$OUT/ncu_$r.log" | awk '$NF+0 > 0.2' | sed 's/smsp__average_warps_issue_stalled_//'
done
