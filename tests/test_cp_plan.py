"""Context-parallel planning without torch: work per block, sharding and traffic against brute force from
dense masks, and the balance target at realistic lengths."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import maskc
import maskc.distributed as cp
from maskc.distributed.shard import ShardingError

from conftest import CROSS_EXAMPLES, EXAMPLE_NAMES, EXAMPLES, batch_params, example_params

CP_EXAMPLES = [n for n in EXAMPLE_NAMES if n not in CROSS_EXAMPLES]      # one sequence: kv_len = seq_len
MASKS = {name: maskc.load(EXAMPLES / f"{name}.mask") for name in CP_EXAMPLES}


def bound_of(name, S, seed, batch=1):
    rng = np.random.default_rng(seed)
    for _ in range(50):
        try:
            if batch == 1:
                return MASKS[name].bind(S, **example_params(name, S, rng))
            return MASKS[name].bind(S, **batch_params(MASKS[name], name, S, rng, batch))
        except maskc.MaskError:
            continue
    raise AssertionError("no binding")


def dense_all(bound):
    """bool[B, S, K] (the mask per batch element, OR over heads for a mask that reads h)."""
    heads = range(bound.num_heads) if bound.num_heads else (0,)
    return np.stack([np.logical_or.reduce([bound.dense(b, h) for h in heads]) for b in range(bound.batch)])


@pytest.mark.parametrize("name", CP_EXAMPLES)
def test_block_pairs_count_the_dense_mask(name):
    for seed in range(3):
        bound = bound_of(name, 96, seed, batch=1 + seed % 2)
        heads = range(bound.num_heads) if bound.mask.ranges.uses_head else (0,)   # pairs of every head
        dense = np.stack([bound.dense(b, h) for b in range(bound.batch) for h in heads])
        for block in (1, 7, 32, 96):
            want = np.add.reduceat(dense.sum(axis=(0, 2)), np.arange(0, 96, block))
            np.testing.assert_array_equal(cp.block_pairs(bound, block), want)


def test_block_pairs_of_a_head_dependent_mask():
    bound = maskc.compile_mask("mask m()\n  allow k <= q, q - k <= 2 * h\n").bind(40, num_heads=3)
    want = sum(bound.dense(0, h).sum(axis=1) for h in range(3))
    np.testing.assert_array_equal(cp.block_pairs(bound, 8), np.add.reduceat(want, np.arange(0, 40, 8)))


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=12), st.sampled_from([1, 2, 3, 4, 8]),
       st.integers(1, 4), st.floats(1.0, 1.5))
def test_assign_is_a_balanced_partition(unit_weights, world_size, repeat, tolerance):
    """Every block once, equal counts, ascending per rank, a permutation; never worse than contiguous
    slices unless within tolerance."""
    work = np.repeat(np.asarray(unit_weights * world_size, np.int64), repeat)
    block = 2
    sh = cp.assign(work, world_size, len(work) * block, block, tolerance)
    assert sorted(sh.rank_blocks.reshape(-1).tolist()) == list(range(len(work)))
    assert np.all(np.diff(sh.rank_blocks, axis=1) > 0)
    assert sorted(sh.permutation.tolist()) == list(range(len(work) * block))
    assert sh.loads.sum() == work.sum()
    np.testing.assert_array_equal(sh.owner[sh.rank_blocks], np.arange(world_size)[:, None] + 0 * sh.rank_blocks)
    contiguous = work.reshape(world_size, -1).sum(axis=1)
    mean = contiguous.mean()
    assert sh.imbalance <= max(tolerance, contiguous.max() / mean if mean else 1.0) + 1e-9
    for r in range(world_size):
        rows = sh.rows(r)
        np.testing.assert_array_equal(rows // block, np.repeat(sh.rank_blocks[r], block))


@given(st.lists(st.integers(0, 10**6), min_size=4, max_size=40), st.sampled_from([(4, 2), (8, 4), (8, 2), (6, 3)]))
def test_nodes_first_keeps_each_nodes_blocks_together(weights, shape):
    """ranks_per_node: a partition with equal counts whose node groups are the node-level assignment."""
    world_size, per_node = shape
    work = np.asarray(weights * world_size, np.int64)
    sh = cp.assign(work, world_size, len(work) * 3, 3, ranks_per_node=per_node)
    nodes = cp.assign(work, world_size // per_node, len(work) * 3, 3)
    assert sorted(sh.rank_blocks.reshape(-1).tolist()) == list(range(len(work)))
    assert np.all(np.diff(sh.rank_blocks, axis=1) > 0)
    for n, blocks in enumerate(nodes.rank_blocks):
        mine = sh.rank_blocks[n * per_node:(n + 1) * per_node].reshape(-1)
        assert sorted(mine.tolist()) == blocks.tolist()


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_causal_is_zigzag(world_size):
    """Two units per rank: rank r holds units r and 2R-1-r, exactly balanced."""
    S = 2 * world_size * 4 * 16
    sh = cp.shard(MASKS["causal"].bind(S), world_size, block=16)
    assert sh.units_per_rank == 2 and sh.imbalance == 1.0
    unit = S // (2 * world_size)
    for r in range(world_size):
        assert set(sh.rows(r) // unit) == {r, 2 * world_size - 1 - r}


def test_uniform_work_stays_contiguous():
    sh = cp.shard(MASKS["bidirectional_document"].bind(4096, docs=[512] * 8), 8, block=64)
    assert sh.units_per_rank == 1 and sh.imbalance == 1.0
    np.testing.assert_array_equal(sh.permutation, np.arange(4096))


def test_lengths_that_do_not_split():
    with pytest.raises(ShardingError, match="multiple of world_size"):
        cp.shard(MASKS["causal"].bind(1000), 8, block=128)
    with pytest.raises(ShardingError, match="kv_len"):
        cp.shard(MASKS["causal"].bind(1024, kv_len=512), 2, block=128)


def workloads(S):
    """Realistic parameters for every example at length S (bench/bench_bind.py's, scaled)."""
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, S), 11, replace=False))
    docs = np.diff(np.concatenate([[0], cuts, [S]])).tolist()
    users = [S // 4] * 4
    prompt = S // 4
    return {"causal": {}, "sliding_window": {"window": 1024}, "prefix_lm": {"prefix": S // 8},
            "document": {"docs": docs}, "bidirectional_document": {"docs": docs},
            "shared_prompt": {"prompt": prompt, "responses": [(S - prompt) // 4] * 4},
            "hstu": {"users": users, "context": 32, "targets": [u // 10 for u in users]},
            "clear": {"text": 512, "width": 128, "radius": 16},
            "global_local": {"globals": 16, "window": 2048},
            "neighborhood": {"width": 181, "window": 13},
            "video": {"width": 32, "height": 32, "radius": 3, "past": 1},
            "morton_local": {"radius": 3},
            "per_head_window": {"num_heads": 8, "window": [256, 256, 512, 512, 1024, 2048, 4096, S]},
            "alibi": {"num_heads": 8, "slope": [2 ** (-i - 1) for i in range(8)]}, "softcap": {"cap": 50.0},
            "block_diffusion": {"n": S // 2, "block": 16},
            "sliding_tile": {"tiles_t": 8, "tiles_h": 8, "tiles_w": 8, "text": S - 8 ** 3 * 64 if S > 8 ** 3 * 64 else 0}}


@pytest.mark.parametrize("S", [32768, 131072])
@pytest.mark.parametrize("name", CP_EXAMPLES)
def test_balance_target_at_8_ranks(name, S):
    """Issue 21's target: max / mean visible pairs per rank <= 1.05 at 8 ranks. clear's pairs are counted
    pair by pair inside its PARTIAL tiles (seconds at 128K): 32K only."""
    if name == "clear" and S > 32768:
        pytest.skip("clear is counted pair by pair: 32K only in the quick suite")
    bound = MASKS[name].bind(S, **workloads(S)[name])
    sh = cp.shard(bound, 8)
    assert sh.imbalance <= 1.05
    if MASKS[name].exact:
        assert sh.work.sum() == bound.visible_pairs()


@pytest.mark.parametrize("name", CP_EXAMPLES)
def test_traffic_and_calls_against_the_dense_mask(name):
    """For every rank: the blocks received at each step are those of the source that its rows see (all of
    them for exact masks; a superset, never fewer, for sound ones), and the calls' rectangles cover each
    visible pair of its rows exactly once, with the right local rows."""
    for world_size, seed in ((2, 1), (4, 2), (3, 3)):
        block = 4
        S = world_size * block * 6
        bound = bound_of(name, S, seed, batch=2)
        plan = cp.plan(bound, world_size, block=block)
        sh = plan.sharding
        block = sh.block
        visible = dense_all(bound).any(axis=0)
        for r in range(world_size):
            rows = sh.rows(r)
            seen_blocks = np.nonzero(visible[rows].reshape(len(rows), -1, block).any(axis=(0, 2)))[0]
            cover = np.zeros((len(rows), S), np.int64)
            for s in range(world_size):
                src = plan.source(r, s)
                got = plan.recv[r][s]
                assert np.all(sh.owner[got] == src) and np.all(np.diff(got) > 0)
                want = seen_blocks[sh.owner[seen_blocks] == src]
                if MASKS[name].exact:
                    np.testing.assert_array_equal(got, want)
                else:
                    assert set(want) <= set(got)
                buffer_rows = sh.rows(r) if s == 0 else (got[:, None] * block + np.arange(block)).reshape(-1)
                for call in plan.calls[r][s]:
                    q_pos = rows[call.q_rows[0]:call.q_rows[1]]
                    kv_pos = buffer_rows[call.kv_rows[0]:call.kv_rows[1]]
                    np.testing.assert_array_equal(q_pos, np.arange(*call.q_range))
                    np.testing.assert_array_equal(kv_pos, np.arange(*call.kv_range))
                    cover[call.q_rows[0]:call.q_rows[1], call.kv_range[0]:call.kv_range[1]] += 1
                if s:
                    np.testing.assert_array_equal(plan.send(src, s), got)
            assert cover.max() <= 1
            assert np.all(cover[visible[rows]] == 1)


def test_shard_and_unshard_are_inverse():
    torch = pytest.importorskip("torch")
    plan = cp.plan(MASKS["document"].bind(256, docs=[100, 56, 100]), 4, block=16)
    x = np.random.default_rng(0).normal(size=(2, 3, 256, 5))
    parts = [plan.shard(x, r) for r in range(4)]
    np.testing.assert_array_equal(plan.unshard(parts), x)
    t = torch.from_numpy(x)
    np.testing.assert_array_equal(plan.unshard([plan.shard(t, r) for r in range(4)]).numpy(), x)
    np.testing.assert_array_equal(np.concatenate(parts, axis=2), x[:, :, plan.permutation])


@pytest.mark.parametrize("budget", [1, 64, 200, 10**9])
def test_prefetch_depth_keeps_in_flight_kv_within_budget(budget):
    """Posting ``depth`` steps ahead never holds more than the budget (sent + received positions) on any
    rank, and one step more would (unless every step is already posted)."""
    bound = MASKS["document"].bind(512, docs=[100, 200, 50, 162])
    sh = cp.shard(bound, 8, block=16)
    plan = cp.make_plan(bound, sh, prefetch_tokens=budget)
    R = 8

    def held(d):
        return max(sum(len(plan.recv[r][t]) + len(plan.send(r, t)) for t in range(s, min(s + d, R))) * sh.block
                   for r in range(R) for s in range(1, R))

    assert 1 <= plan.depth <= R - 1
    assert plan.depth == 1 or held(plan.depth) <= budget
    assert plan.depth == R - 1 or held(plan.depth + 1) > budget
