"""Descriptor packing: runs rebuild the tile map, the transposed view agrees, LPT order, Flex arrays."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import maskc
from maskc.analysis.descriptor import check_descriptor, pack, to_flex_block_mask_arrays, unpack
from maskc.runs import PARTIAL_COST, heaviest_first, runs_of, transposed
from maskc.kernel_ir import EMPTY, FULL, PARTIAL, TileMap

from conftest import EXAMPLE_NAMES, EXAMPLES, example_params, tile_truth
from mask_strategies import binding, mask_text, tile_shape


def _classes_from_cols(desc):
    b, qt, kt = desc.batch, desc.n_q_blocks, desc.n_kv_blocks
    out = np.zeros((b, qt, kt), np.int8)
    for c in range(b * kt):
        for begin, end, kind in desc.col_runs[desc.col_offsets[c]:desc.col_offsets[c + 1]]:
            assert 0 <= begin < end <= qt and kind in (PARTIAL, FULL)
            out[c // kt, begin:end, c % kt] = kind
    return out


def check_all(desc, classes):
    check_descriptor(desc)
    assert np.array_equal(unpack(desc), classes)
    # transposed view: the same tiles by column block, and itself well-formed runs
    assert desc.col_offsets[0] == 0 and desc.col_offsets[-1] == len(desc.col_runs)
    assert np.all(np.diff(desc.col_offsets) >= 0)
    assert np.array_equal(_classes_from_cols(desc), classes)
    for c in range(desc.batch * desc.n_kv_blocks):
        runs = desc.col_runs[desc.col_offsets[c]:desc.col_offsets[c + 1]]
        assert np.all(runs[1:, 0] >= runs[:-1, 1])
        assert not np.any((runs[1:, 0] == runs[:-1, 1]) & (runs[1:, 2] == runs[:-1, 2]))
    # runs are maximal: the number of runs is the number of class changes into a non-empty class
    flat = classes.reshape(-1, classes.shape[-1])
    padded = np.concatenate([np.zeros((flat.shape[0], 1), np.int8), flat], axis=1)
    starts = (flat != EMPTY) & (padded[:, 1:] != padded[:, :-1])
    assert len(desc.runs) == starts.sum()
    # work order: heaviest first, non-increasing cost, empty rows last, ties by row index
    cost = (flat == FULL).sum(1) + PARTIAL_COST * (flat == PARTIAL).sum(1)
    ordered = cost[desc.work_order]
    assert np.all(np.diff(ordered) <= 0)
    empty = cost == 0
    n_live = int((~empty).sum())
    assert np.all(~empty[desc.work_order[:n_live]]) and np.all(empty[desc.work_order[n_live:]])
    for a, b in zip(desc.work_order[:-1], desc.work_order[1:]):
        if cost[a] == cost[b]:
            assert a < b
    # the backward's column order: a permutation of the column blocks, heaviest first
    cols = classes.transpose(0, 2, 1).reshape(-1, classes.shape[1])
    col_cost = (cols == FULL).sum(1) + PARTIAL_COST * (cols == PARTIAL).sum(1)
    assert sorted(desc.col_work_order.tolist()) == list(range(len(cols)))
    assert np.all(np.diff(col_cost[desc.col_work_order]) <= 0)


def check_flex(tile_map):
    arrays = to_flex_block_mask_arrays(tile_map)
    classes = tile_map.classes
    b, qt, kt = classes.shape
    rebuilt = np.zeros_like(classes)
    for prefix, kind in (("", PARTIAL), ("full_", FULL)):
        num, idx = arrays[prefix + "kv_num_blocks"], arrays[prefix + "kv_indices"]
        assert num.shape == (b, 1, qt) and idx.shape == (b, 1, qt, kt)
        assert num.dtype == np.int32 and idx.dtype == np.int32
        for bi in range(b):
            for i in range(qt):
                n = int(num[bi, 0, i])
                cols = idx[bi, 0, i, :n]
                assert np.all(np.diff(cols) > 0), "indices ascending, distinct"
                assert np.all(idx[bi, 0, i, n:] == 0), "unused tail is zero"
                assert np.all(rebuilt[bi, i, cols] == EMPTY), "a block is PARTIAL or FULL, not both"
                rebuilt[bi, i, cols] = kind
    assert np.array_equal(rebuilt, classes)


@given(text=mask_text(exact=False), b=binding(), shape=tile_shape)
def test_descriptor_round_trip_random_masks(text, b, shape):
    c = maskc.compile_mask(text)
    bound = c.bind(b[0], b[1], **b[2])
    tm = bound.tile_map(*shape)
    desc = bound.descriptor(*shape)
    assert (desc.block_m, desc.block_n, desc.batch) == (shape[0], shape[1], 1)
    assert tm.classes.shape == (1, desc.n_q_blocks, desc.n_kv_blocks)
    check_all(desc, tm.classes)
    check_flex(tm)
    # sound: FULL and EMPTY never wrong
    truth = tile_truth(bound.dense(), *shape)
    assert np.all((tm.classes[0] == EMPTY) <= (truth == EMPTY))
    assert np.all((tm.classes[0] == FULL) <= (truth == FULL))


@given(classes=st.integers(1, 3).flatmap(lambda b: st.integers(1, 7).flatmap(lambda qt: st.integers(1, 9).flatmap(
    lambda kt: st.lists(st.sampled_from([EMPTY, PARTIAL, FULL]), min_size=b * qt * kt, max_size=b * qt * kt)
    .map(lambda v: np.asarray(v, np.int8).reshape(b, qt, kt))))), bm=st.integers(1, 16), bn=st.integers(1, 16))
def test_pack_arbitrary_tile_maps(classes, bm, bn):
    b, qt, kt = classes.shape
    offsets, runs = [0], []
    for row in classes.reshape(b * qt, kt):          # runs by hand, not with maskc.analysis.tiles
        j = 0
        while j < kt:
            e = j
            while e + 1 < kt and row[e + 1] == row[j]:
                e += 1
            if row[j] != EMPTY:
                runs.append((j, e + 1, row[j]))
            j = e + 1
        offsets.append(len(runs))
    tm = TileMap(bm, bn, qt * bm - (bm > 1), kt * bn, b, np.asarray(offsets, np.int32),
                 np.asarray(runs, np.int32).reshape(-1, 3), True)
    assert np.array_equal(tm.classes, classes)
    desc = pack(tm, np.zeros(3, np.int32), np.zeros(b + 1, np.int32))
    check_all(desc, classes)
    check_flex(tm)


@given(data=st.data(), shape=tile_shape)
def test_jagged_batch_descriptors(data, shape):
    seq_len = data.draw(st.integers(1, 60))
    n = data.draw(st.integers(2, 4))
    m = maskc.load(EXAMPLES / "shared_prompt.mask")
    prompts, responses = [], []
    for _ in range(n):
        p = data.draw(st.integers(0, seq_len))
        cuts = sorted(data.draw(st.lists(st.integers(0, seq_len - p), max_size=3)))
        responses.append([b - a for a, b in zip([0] + cuts, cuts + [seq_len - p])])
        prompts.append(p)
    bound = m.bind(seq_len, prompt=prompts, responses=responses)
    desc = bound.descriptor(*shape)
    tm = bound.tile_map(*shape)
    assert desc.batch == n and tm.classes.shape[0] == n
    check_all(desc, tm.classes)
    check_flex(tm)
    assert len(desc.mask_offsets) == n + 1 and desc.mask_offsets[-1] == len(desc.mask_data)
    qt = desc.n_q_blocks
    for b in range(n):
        single = m.bind(seq_len, prompt=prompts[b], responses=responses[b])
        assert np.array_equal(tm.classes[b], single.tiles(*shape))
        sd = single.descriptor(*shape)
        # row block b*QT + i of the batch holds single element b's row i
        for i in range(qt):
            r = b * qt + i
            assert np.array_equal(desc.runs[desc.run_offsets[r]:desc.run_offsets[r + 1]],
                                  sd.runs[sd.run_offsets[i]:sd.run_offsets[i + 1]])
        tbl = desc.mask_data[desc.mask_offsets[b]:desc.mask_offsets[b + 1]]
        assert np.array_equal(tbl, sd.mask_data)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
@pytest.mark.parametrize("block", [(16, 16), (32, 8), (128, 128)])
def test_example_descriptors(name, block):
    rng = np.random.default_rng(3)
    c = maskc.load(EXAMPLES / f"{name}.mask")
    s = 150
    try:
        bound = c.bind(s, **example_params(name, s, rng))
    except maskc.errors.BindError:
        pytest.skip("unbindable draw")
    desc = bound.descriptor(*block)
    check_all(desc, bound.tile_map(*block).classes)
    check_flex(bound.tile_map(*block))
    truth = tile_truth(bound.dense(), *block)
    if c.exact and not c.ranges.uses_head:           # one map for every head of a mask that reads h
        assert np.array_equal(bound.tiles(*block), truth)
    heads = range(bound.num_heads) if c.ranges.uses_head else (0,)
    assert bound.visible_pairs() == sum(int(bound.dense(0, h).sum()) for h in heads)


def test_visible_pairs_of_a_non_exact_example():
    c = maskc.load(EXAMPLES / "clear.mask")
    bound = c.bind(100, text=10, width=9, radius=3)
    assert bound.visible_pairs() == int(bound.dense().sum())


def test_all_empty_rows_come_last():
    c = maskc.compile_mask("mask m()\n  allow q >= 40, k <= q\n")
    desc = c.bind(64).descriptor(16, 16)
    assert list(desc.work_order[-2:]) == [0, 1]
    assert desc.run_offsets[1] == 0 and desc.run_offsets[2] == 0


def test_causal_descriptor_by_hand():
    desc = maskc.compile_mask("mask m()\n  allow k <= q\n").bind(32).descriptor(16, 16)
    assert desc.runs.tolist() == [[0, 1, PARTIAL], [0, 1, FULL], [1, 2, PARTIAL]]
    assert desc.run_offsets.tolist() == [0, 1, 3]
    assert desc.col_runs.tolist() == [[0, 1, PARTIAL], [1, 2, FULL], [1, 2, PARTIAL]]
    assert desc.work_order.tolist() == [1, 0]


@given(mask_text(exact=False), binding(max_len=40), st.sampled_from([(16, 32), (8, 16), (32, 32)]),
       st.integers(0, 2**32 - 1))
def test_backward_walk_of_the_transposed_view_gives_the_gradients(text, bind_args, shape, seed):
    """The dK/dV kernel's walk (column blocks, GQA group, transposed runs, the predicate on PARTIAL tiles
    only) in float32 against the float64 textbook gradients: a wrong run or a FULL tile that is not full
    shows up as a large error."""
    from maskc.runtime.cpu_check import blocked_attention_backward, relative_error
    from maskc.runtime.reference import reference_attention_backward
    try:
        bound = maskc.compile_mask(text).bind(seq_len=bind_args[0], kv_len=bind_args[1], **bind_args[2])
    except maskc.MaskError:
        return
    rng = np.random.default_rng(seed)
    b = bound.batch
    q = rng.standard_normal((b, 2, bound.seq_len, 8))
    k, v = (rng.standard_normal((b, 1, bound.kv_len, 8)) for _ in range(2))
    dout = rng.standard_normal(q.shape)
    got = blocked_attention_backward(q, k, v, dout, bound, *shape)
    for g, ref in zip(got, reference_attention_backward(q, k, v, dout, bound)):
        assert relative_error(g, ref) < 1e-4 or np.abs(ref).max() < 1e-6


def _dense_descriptor(bound, block_m, block_n):
    """The oracle: the descriptor's arrays as they were built before linear memory, from every batch
    element's brute-force tile grid (bound.dense())."""
    grid = np.stack([tile_truth(bound.dense(b), block_m, block_n) for b in range(bound.batch)])
    offsets, runs = runs_of(grid.reshape(-1, grid.shape[-1]))
    cols = np.ascontiguousarray(grid.transpose(0, 2, 1)).reshape(-1, grid.shape[1])
    col_offsets, col_runs = runs_of(cols)
    return (offsets, runs, heaviest_first(offsets, runs), col_offsets, col_runs,
            heaviest_first(col_offsets, col_runs))


def _arrays(desc):
    return (desc.run_offsets, desc.runs, desc.work_order, desc.col_offsets, desc.col_runs, desc.col_work_order)


@given(text=mask_text(exact=True), b=binding(), shape=tile_shape)
def test_linear_memory_descriptor_equals_the_dense_derived_one(text, b, shape):
    """Exact masks: the descriptor built from runs (never a tile grid) has exactly the arrays the
    dense-grid construction gives, the transposed view and both work orders included."""
    try:
        mask = maskc.compile_mask(text)
        bound = mask.bind(seq_len=b[0], kv_len=b[1], **b[2])
    except maskc.MaskError:
        return
    desc = bound.descriptor(*shape)
    assert desc.tile_map.exact
    for got, want in zip(_arrays(desc), _dense_descriptor(bound, *shape)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
@given(seed=st.integers(0, 2**32 - 1), seq_len=st.integers(1, 400), shape=tile_shape)
def test_example_descriptors_equal_the_dense_derived_ones(name, seed, seq_len, shape):
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    try:
        bound = mask.bind(seq_len=seq_len, **example_params(name, seq_len, np.random.default_rng(seed)))
    except maskc.MaskError:
        return
    desc = bound.descriptor(*shape)
    # a mask that reads h has one descriptor for every head: its classes are combined over heads, sound
    # but not exact (a tile FULL for one head and PARTIAL for another is PARTIAL)
    assert desc.tile_map.exact == (mask.exact and not mask.ranges.uses_head)
    if desc.tile_map.exact:
        for got, want in zip(_arrays(desc), _dense_descriptor(bound, *shape)):
            np.testing.assert_array_equal(got, want)


@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.data())
def test_transposed_runs_equal_the_transposed_grid(batch, qt, kt, data):
    grid = np.array(data.draw(st.lists(st.sampled_from([EMPTY, PARTIAL, FULL]), min_size=batch * qt * kt,
                                       max_size=batch * qt * kt)), np.int8).reshape(batch * qt, kt)
    offsets, runs = runs_of(grid)
    want = runs_of(np.ascontiguousarray(grid.reshape(batch, qt, kt).transpose(0, 2, 1)).reshape(batch * kt, qt))
    got = transposed(offsets, runs, batch, qt, kt)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_dense_grid_past_the_tile_cap_is_a_bind_error():
    """A tile map of a huge sequence is cheap (its runs); asking for its dense grid there is a BindError, not a
    petabyte allocation (hypothesis found causal at seq_len 2**31 - 1 with 64 x 128 tiles)."""
    from maskc.errors import BindError

    tiles = maskc.load(EXAMPLES / "causal.mask").bind(2 ** 31 - 1).tile_map(64, 128)
    assert tiles.counts()["PARTIAL"] > 0
    with pytest.raises(BindError, match="2\\*\\*28"):
        tiles.classes


@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.data())
def test_dq_turns_follow_the_launch_order(batch, qt, kt, data):
    """ordered_columns against brute force on the grid: every column once in the order, shortest first (with a
    first wave: that many shortest first, then the others longest first); the turn of column c at query block qb
    is the number of columns of c's batch element that see qb and come before c in the order (so waits go only to
    columns launched earlier)."""
    from maskc.runs import ordered_columns
    classes = np.array(data.draw(st.lists(st.sampled_from([EMPTY, PARTIAL, FULL]), min_size=batch * qt * kt,
                                          max_size=batch * qt * kt)), np.int8).reshape(batch, qt, kt)
    first_wave = data.draw(st.none() | st.integers(0, batch * kt + 2))
    offsets, runs = runs_of(classes.transpose(0, 2, 1).reshape(batch * kt, qt))      # the column view
    order, rank_base, ranks = ordered_columns(offsets, runs, batch, qt, first_wave)
    assert sorted(order.tolist()) == list(range(batch * kt))
    cost = [(runs[offsets[c]:offsets[c + 1], 1] - runs[offsets[c]:offsets[c + 1], 0]
             ) @ np.where(runs[offsets[c]:offsets[c + 1], 2] == PARTIAL, PARTIAL_COST, 1.0) for c in range(batch * kt)]
    wave = len(order) if first_wave is None else min(first_wave, len(order))
    assert all(cost[a] <= cost[b] for a, b in zip(order[:wave - 1], order[1:wave]))         # the wave: shortest first
    assert all(cost[a] >= cost[b] for a, b in zip(order[wave:-1], order[wave + 1:]))         # the rest: longest first
    assert all(cost[a] <= cost[b] for a in order[:wave] for b in order[wave:])               # the wave: the shortest
    position = {c: i for i, c in enumerate(order.tolist())}
    for c in range(batch * kt):
        b = c // kt
        for r in range(offsets[c], offsets[c + 1]):
            for qb in range(runs[r, 0], runs[r, 1]):
                before = [c2 for c2 in range(b * kt, (b + 1) * kt)
                          if classes[b, qb, c2 % kt] != EMPTY and position[c2] < position[c]]
                assert ranks[rank_base[r] + qb] == len(before)


@given(st.integers(1, 12), st.integers(1, 9), st.data())
def test_partial_slots_number_partial_tiles_in_walk_order(rows, kt, data):
    """partial_slots against a walk of the grid as the forward walks it (row by row, key blocks ascending): the
    n-th PARTIAL tile met gets number n, its run's slot plus its offset in the run, and tiles[n] is where it is."""
    from maskc.runs import partial_slots
    grid = np.array(data.draw(st.lists(st.sampled_from([EMPTY, PARTIAL, FULL]), min_size=rows * kt,
                                       max_size=rows * kt)), np.int8).reshape(rows, kt)
    offsets, runs = runs_of(grid)
    run_slots, tiles = partial_slots(offsets, runs)
    met = []
    for r in range(rows):
        for run in range(offsets[r], offsets[r + 1]):
            begin, end, kind = runs[run]
            for j in range(begin, end):
                if kind == PARTIAL:
                    assert run_slots[run] + j - begin == len(met)
                    met.append((r, j))
    assert [tuple(t) for t in tiles.tolist()] == met == [tuple(p) for p in np.argwhere(grid == PARTIAL).tolist()]
    assert run_slots.dtype == tiles.dtype == np.int32 and tiles.shape == (len(met), 2)


def test_partial_slots_count_against_the_descriptor_budget():
    """The slots are part of the descriptor's bytes, under its cap."""
    import dataclasses
    from maskc.errors import BindError
    bound = maskc.load(EXAMPLES / "clear.mask").bind(8192, text=512, width=128, radius=16)
    desc = bound.descriptor(128, 128)
    before = desc.nbytes
    run_slots, tiles = desc.partial_slots
    assert len(tiles) == desc.tile_map.counts()["PARTIAL"] > 0
    assert desc.nbytes == before + run_slots.nbytes + tiles.nbytes
    tight = dataclasses.replace(desc, max_bytes=before + run_slots.nbytes + tiles.nbytes - 1)
    with pytest.raises(BindError, match="max_bytes"):
        tight.partial_slots
    assert dataclasses.replace(desc, max_bytes=desc.nbytes).partial_slots[1].tolist() == tiles.tolist()
    # the column view's: (column block, query block) of every PARTIAL tile, column by column
    _, col_tiles = desc.col_partial_slots
    grid = desc.tile_map.classes[0]                    # (QT, KT), batch 1
    assert col_tiles.tolist() == np.argwhere(grid.T == PARTIAL).tolist()


def _launch_makespan(costs, order, pairs: int, section: int, sms: int, front: int) -> float:
    """When the last of a launch's items ends, each taking its row's cost on the first SM free (one CTA per SM,
    items in launch order): the first ``front`` rows of ``order`` for every pair, then the rest in sections of
    ``section`` pairs, a section's rows in order with its pairs inner (the kernels' launch order)."""
    import heapq
    items = [order[w] for w in range(front) for _ in range(pairs)]
    for first in range(0, pairs, section):
        items += [order[w] for w in range(front, len(order)) for _ in range(first, min(pairs, first + section))]
    free = [0.0] * sms
    for row in items:
        heapq.heappush(free, heapq.heappop(free) + costs[row])
    return max(free)


@pytest.mark.parametrize("name,seq_len,order,block_m,pairs,section,front_wanted,gain", [
    ("clear", 32768, "8x16", 128, 16, 2, 4, 1.15),      # the forward: 4 text rows see every key
    ("clear", 32768, "8x16", 64, 16, 1, 4, 1.2),        # the dK/dV kernel's column view (transposed)
    ("clear", 16384, "8x16", 64, 16, 2, 4, 1.15),
    ("clear", 32768, "raster", 128, 16, 2, 4, 1.03),
    ("causal", 32768, "raster", 128, 16, 2, 0, None),   # the longest row is a section's share or less: no tail
    ("causal", 32768, "raster", 64, 16, 1, 0, None),
    ("causal", 16384, "raster", 64, 16, 2, 0, None),
    ("causal", 4096, "raster", 128, 16, 16, 0, None),   # one section
])
def test_long_rows_run_first_where_the_last_section_would_leave_a_tail(name, seq_len, order, block_m, pairs, section,
                                                                        front_wanted, gain):
    """Descriptor.front counts the rows launched for every pair before the L2 sections; the launch (list-scheduled,
    each item a row's cost) then ends within 3% of a perfect balance, and where the count is not 0, ``gain`` times
    sooner than with every row in its section."""
    from maskc.ordered import token_order
    from maskc.runs import row_costs
    params = {"text": 512, "width": 128, "radius": 16} if name == "clear" else {}       # the benchmark's CLEAR
    bound = maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len, **params)
    if order != "raster":
        bound = token_order(bound, order).inner
    desc = bound.descriptor(block_m, 128)
    transposed = block_m == 64
    offsets, runs, work = ((desc.col_offsets, desc.col_runs, desc.col_work_order) if transposed
                           else (desc.run_offsets, desc.runs, desc.work_order))
    costs, sms = row_costs(offsets, runs), 132
    front = desc.front(pairs, section, sms, transposed)
    assert front == front_wanted
    with_front = _launch_makespan(costs, work, pairs, section, sms, front)
    assert with_front <= 1.03 * costs.sum() * pairs / sms
    if gain is not None:
        assert _launch_makespan(costs, work, pairs, section, sms, 0) >= gain * with_front


@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(1, 16), st.integers(1, 16),
       st.integers(1, 200), st.integers(1, 4), st.data())
def test_turn_sections_outlast_the_longest_chain_of_turns(batch, qt, kt, pairs, section, sms, group, data):
    """turn_section_pairs against the grid: the fewest pairs per section, at least ``section`` (and at most
    ``pairs``), whose work on ``sms`` SMs (s * group * steps / sms, steps the visible tiles) lasts as long as the
    longest chain of turns (the most columns of one batch element that see one query block, TURN_HOLD steps each)."""
    from maskc.runs import TURN_HOLD, turn_section_pairs
    classes = np.array(data.draw(st.lists(st.sampled_from([EMPTY, PARTIAL, FULL]), min_size=batch * qt * kt,
                                          max_size=batch * qt * kt)), np.int8).reshape(batch, qt, kt)
    offsets, runs = runs_of(classes.transpose(0, 2, 1).reshape(batch * kt, qt))      # the column view
    chosen = turn_section_pairs(offsets, runs, batch, qt, pairs, section, sms, group)
    steps = int(np.count_nonzero(classes))
    chain = int((classes != EMPTY).sum(axis=2).max())
    outlasts = lambda s: s * group * steps >= chain * TURN_HOLD * sms      # noqa: E731
    assert 1 <= chosen <= max(1, pairs)
    if steps == 0:
        assert chosen == max(1, min(pairs, section))
    elif chosen < pairs:
        assert chosen >= section and outlasts(chosen)
    assert chosen <= section or not outlasts(chosen - 1)


def _turns_makespan(columns, order, heads: int, section: int, sms: int, turns: bool) -> float:
    """When the last CTA of a deterministic backward ends (bench/turns_model.py's model on any column view): one CTA
    per (column, head), one per SM, launched in sections of ``section`` heads, columns outer in ``order``; a step
    takes 1, its dQ addition TURN_HOLD after every earlier-launched column of the head has added to that query block
    (with ``turns``) and after the CTA's own previous addition; a staging tile is free again two steps later."""
    import heapq
    from maskc.runs import TURN_HOLD
    launch = [(h, c) for first in range(0, heads, section) for c in order
              for h in range(first, min(heads, first + section))]
    added: dict = {}                    # (head, query block) -> when its last addition landed
    free, end_all = [0.0] * sms, 0.0
    for h, c in launch:
        start = heapq.heappop(free)
        computed = last_add = add_before = start
        for qb in columns[c]:
            computed = max(computed, add_before) + 1.0
            add = max(computed, added.get((h, qb), 0.0) if turns else 0.0, last_add) + TURN_HOLD
            added[(h, qb)] = add
            add_before, last_add = last_add, add
        end_all = max(end_all, computed, last_add)
        heapq.heappush(free, max(computed, last_add))
    return end_all


@pytest.mark.parametrize("seq_len,l2_sections", [(16384, 2), (32768, 1)])
def test_wider_sections_keep_clear_deterministic_backward_near_the_fast_one(seq_len, l2_sections):
    """CLEAR (the benchmark's, 8 x 16 order, 16 heads, 132 SMs): in the L2's sections the turns of its text rows,
    which every key column adds to, run head after head and the modelled deterministic backward takes 1.4x (16K) to
    2x (32K) the fast one's time (measured 1.85x at 32K, run 73); in turn_sections' wider sections within 10%."""
    from maskc.ordered import token_order
    bound = token_order(maskc.load(EXAMPLES / "clear.mask").bind(seq_len, text=512, width=128, radius=16), "8x16")
    desc = bound.inner.descriptor(64, 128)
    columns = [[qb for r in range(desc.col_offsets[c], desc.col_offsets[c + 1])
                for qb in range(desc.col_runs[r, 0], desc.col_runs[r, 1])] for c in range(len(desc.col_offsets) - 1)]
    order = desc.turns()[0]
    wider = desc.turn_sections(16, l2_sections, 132)
    assert wider > l2_sections
    fast = _turns_makespan(columns, desc.col_work_order, 16, l2_sections, 132, turns=False)
    assert _turns_makespan(columns, order, 16, l2_sections, 132, turns=True) >= 1.35 * fast
    assert _turns_makespan(columns, order, 16, wider, 132, turns=True) <= 1.1 * fast


@pytest.mark.parametrize("name,seq_len,params,l2_sections", [
    ("causal", 32768, {}, 1), ("causal", 4096, {}, 9), ("sliding_window", 32768, {"window": 1024}, 1),
    ("document", 32768, {"docs": [2731] * 11 + [2727]}, 1),
    ("shared_prompt", 32768, {"prompt": 8192, "responses": [6144] * 4}, 1)])
def test_turn_sections_keep_the_l2_sections_where_chains_are_short(name, seq_len, params, l2_sections):
    """Masks whose longest chain of turns fits in a section (causal's last query block: 256 columns at 32K against
    ~500 steps per head and SM) keep the sections the L2 asks for."""
    desc = maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len, **params).descriptor(64, 128)
    assert desc.turn_sections(16, l2_sections, 132) == l2_sections
