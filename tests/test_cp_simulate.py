"""The context-parallel simulator against hand arithmetic and brute force on small plans."""
from __future__ import annotations

import numpy as np
import pytest

import maskc
import maskc.distributed as cp
from maskc.distributed.shard import zigzag
from maskc.distributed.simulate import Hardware, Shape, pairs_by_source, predict, seen_kv_tokens

from conftest import EXAMPLES

DOC = maskc.load(EXAMPLES / "document.mask")
BIDI = maskc.load(EXAMPLES / "bidirectional_document.mask")
FREE = Hardware(call_us=0.0, bwd_call_us=0.0, nvlink_gbs=1e12, ib_gbs=1e12, latency_us=0.0, hbm_gbs=1e15)


def dense_pairs_by_source(plan):
    dense = np.stack([plan.bound.dense(b) for b in range(plan.bound.batch)]).sum(axis=0)
    owner = plan.sharding.owner[np.arange(plan.seq_len) // plan.block]
    R = plan.world_size
    return np.array([[dense[np.ix_(owner == r, owner == o)].sum() for o in range(R)] for r in range(R)])


def test_pairs_by_source_is_exact_when_tiles_are_full_or_empty():
    """Documents aligned to the blocks: every tile FULL or EMPTY, so the split by tile cost is exact."""
    bound = BIDI.bind(512, docs=[64, 192, 32, 224])
    plan = cp.plan(bound, 4, block=32)
    np.testing.assert_allclose(pairs_by_source(plan), dense_pairs_by_source(plan))


def test_pairs_by_source_rows_are_the_ranks_loads():
    bound = DOC.bind(1024, docs=[[100, 300, 624], [1024]])
    plan = cp.plan(bound, 4, block=16)
    p = pairs_by_source(plan)
    np.testing.assert_allclose(p.sum(axis=1), plan.sharding.loads)
    want = dense_pairs_by_source(plan)
    assert np.all(p[want == 0] == 0)        # exact tiles: no pairs from a source whose keys none sees
    np.testing.assert_allclose(p.sum(), want.sum())


def test_one_rank_is_its_compute():
    """One rank, no transfers: forward = pairs * 4 D Hq B / throughput + calls + merge."""
    bound = DOC.bind(2048, docs=[1000, 1048])
    plan = cp.plan(bound, 1, block=128)
    shape, hw = Shape(batch=2, heads=8, kv_heads=2, head_dim=64), Hardware()
    p = predict(plan, shape, hw)
    pairs = bound.visible_pairs()
    merge = 2048 * 2 * 8 * 65 * 16 / (hw.hbm_gbs * 1e6)       # O and LSE rows read and written, fp32
    fwd = pairs * 4 * 64 * 8 * 2 / (hw.fwd_tflops * 1e9) + hw.call_us / 1e3 + merge
    assert p.fwd_ms == pytest.approx(fwd)
    assert p.bwd_ms == pytest.approx(2.5 * pairs * 4 * 64 * 8 * 2 / (hw.bwd_tflops * 1e9) + hw.bwd_call_us / 1e3)
    assert p.bytes_fwd == 0 and p.calls.tolist() == [1]


def test_free_links_and_full_prefetch_leave_only_compute():
    """Infinite bandwidth, no overheads, every transfer posted at once: each rank finishes at its own
    compute, and the step is the slowest rank's."""
    bound = DOC.bind(4096, docs=[500, 1500, 96, 2000])
    plan = cp.plan(bound, 4, block=64, prefetch_tokens=10**9)
    p = predict(plan, Shape(), FREE)
    flops = 4 * 128 * 16
    np.testing.assert_allclose(p.fwd_done_ms, p.pairs * flops / (FREE.fwd_tflops * 1e9))
    assert p.efficiency == pytest.approx(p.pairs.mean() / p.pairs.max())


def test_bytes_and_the_ring_volume():
    bound = DOC.bind(4096, docs=[500, 1500, 96, 2000])
    R, shape = 4, Shape(batch=1, heads=4, kv_heads=2, head_dim=64)
    plan = cp.plan(bound, R, block=64)
    p = predict(plan, shape)
    kv = 2 * 2 * 64 * 2     # bytes of K and V per position
    np.testing.assert_allclose(p.recv_bytes, [plan.received_blocks(r) * 64 * kv for r in range(R)])
    ring = cp.make_plan(bound, zigzag(plan.sharding.work, R, 4096, 64), fetch="all")
    np.testing.assert_allclose(predict(ring, shape).recv_bytes, (R - 1) * plan.local_len * kv)
    assert p.bytes_fwd < predict(ring, shape).bytes_fwd
    # what is moved covers what the queries see, and exceeds it by at most partly seen blocks
    seen = seen_kv_tokens(plan)
    moved = np.array([plan.received_blocks(r) * 64 for r in range(R)])
    assert np.all(moved >= seen)
    dense = bound.dense()
    for r in range(R):
        rows = plan.rows(r)
        mask = dense[rows].any(axis=0)
        mask[rows] = False
        assert seen[r] == mask.sum()


def test_slower_links_are_never_faster():
    bound = DOC.bind(8192, docs=[4000, 4192])
    plan = cp.plan(bound, 8, block=64)
    times = [predict(plan, Shape(), Hardware(nvlink_gbs=bw, ib_gbs=bw / 8, gpus_per_node=4)).step_ms
             for bw in (1000.0, 100.0, 10.0, 1.0)]
    assert times == sorted(times)
