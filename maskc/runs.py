"""Tile classes as runs: the CSR of ``(begin, end, kind)`` that descriptors hold, and what is computed from runs
alone, whatever the mask (the dense grid and back, the column view, the launch order, the memory budget). The
layer under both the analysis passes that make runs and the kernel IR that carries them."""
from __future__ import annotations

from typing import Callable

import numpy as np

from maskc.errors import BindError

EMPTY, PARTIAL, FULL = 0, 1, 2
# The most tiles a dense grid (TileMap.classes) or the per-tile classification of opaque regions may take.
MAX_TILES = 1 << 28

PARTIAL_COST = 1.25     # a PARTIAL tile also evaluates the predicate: a little dearer than a FULL one


def sizes_text(seq_len: int, kv_len: int, block_m: int, block_n: int, batch: int) -> str:
    """The sizes of a tile map as messages name them."""
    return (f"seq_len = {seq_len}, kv_len = {kv_len} at {block_m} x {block_n} tiles"
            + (f" x {batch} batch elements" if batch > 1 else ""))


def any_true(x) -> bool:
    """Whether some value of ``x`` (an array of any shape, or a scalar) is true: one C call (np.count_nonzero),
    where ``ndarray.any()`` goes through numpy's Python methods (0.5 against 1.3 us at a few hundred values)."""
    return bool(np.count_nonzero(x))


def all_true(x) -> bool:
    """Whether every value of ``x`` (an array of any shape, or a scalar) is true; as :func:`any_true`."""
    return np.count_nonzero(x) == np.size(x)


class RunBudget:
    """The bytes a descriptor may take, counted as its runs are made: a BindError naming ``max_bytes`` (what
    a user raises) as soon as the total passes it. ``what`` names the sizes (text, or a function that writes it:
    made only for the error, not on every bind); ``used``: bytes already taken."""

    RUN_BYTES = 12                  # (begin, end, kind), int32

    def __init__(self, max_bytes, what: str | Callable[[], str], used: int = 0):
        if not isinstance(max_bytes, (int, np.integer)) or isinstance(max_bytes, bool) or max_bytes < 1:
            raise BindError(f"max_bytes (the descriptor memory cap) must be a positive integer, got {max_bytes!r}")
        self.max_bytes, self.what, self.used = int(max_bytes), what, 0
        self.add_bytes(used)

    def add(self, runs: np.ndarray) -> None:
        self.add_bytes(self.RUN_BYTES * len(runs))

    def add_bytes(self, n: int) -> None:
        self.used += n
        if self.used > self.max_bytes:
            what = self.what if isinstance(self.what, str) else self.what()
            raise BindError(f"the descriptor of {what} takes more than max_bytes = {self.max_bytes} bytes "
                            f"({_size(self.max_bytes)}), the memory cap on descriptors",
                            hint="raise it: bound.descriptor(..., max_bytes=N), or maskc.Options("
                                 "max_descriptor_bytes=N) for maskc.attention (MASKC_MAX_DESCRIPTOR_BYTES); or "
                                 "use larger tiles, or split the sequence with restrict() (context parallelism)")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} B"


_KIND_COST = np.array([1.0, 1.0, 1.0])     # a tile's cost by its kind (EMPTY, PARTIAL, FULL), for row_costs
_KIND_COST[PARTIAL] = PARTIAL_COST


def row_costs(offsets: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """float64 per CSR row: its FULL tiles + PARTIAL_COST * its PARTIAL tiles, what launch orders weigh it by."""
    rows = len(offsets) - 1
    row_of_run = np.arange(rows).repeat(offsets[1:] - offsets[:-1])
    weight = (runs[:, 1] - runs[:, 0]) * _KIND_COST.take(runs[:, 2])
    return np.bincount(row_of_run, weight, minlength=rows)


def heaviest_first(offsets: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """int32 permutation of the CSR rows by non-increasing cost (:func:`row_costs`), ties in row order: the launch
    order that finishes the longest rows first (LPT)."""
    return np.argsort(-row_costs(offsets, runs), kind="stable").astype(np.int32)   # stable: ties stay in row order


FRONT_SLACK = 1.25
"""How many times a section's share of an SM's work a row may take and still run inside its section
(:func:`front_rows`). Within a section the heaviest rows go first, so a row a little longer than the share still
ends about when the section's others do: causal's longest column is 1.02-1.03 shares in the backward at 16K and
32K, and a list-scheduling model of the launch puts it within 0.2% of a perfect balance; CLEAR's text rows are
1.4-1.5 shares in the forward and about 3 in the backward, and there the model's tail is 10-30% (bench/NOTES.md,
session 14)."""


def front_rows(costs: np.ndarray, order: np.ndarray, pairs: int, section_pairs: int, sms: int) -> int:
    """How many of the first rows of ``order`` (heaviest first; ``costs`` per row, :func:`row_costs`) a launch
    should run for all its ``pairs`` (batch, head) pairs before it goes on in L2 sections of ``section_pairs``
    pairs: the rows heavier than FRONT_SLACK times a section's share of an SM's work (the work of all rows and
    pairs over ``sms`` SMs, divided by the number of sections).

    Why: sections run one after another (the CTAs resident together read the K and V, or Q and dO, of few heads),
    so the last starts at about (n - 1) / n of the launch's time on ``sms`` SMs, and a row longer than 1/n of that
    time, started then, ends past every other: CLEAR's text rows and columns, which see every key (or query), made
    the last section's tail 20-30% of its forward and backward at 32K (bench/NOTES.md, session 14). Started first
    for every pair, they overlap the sections. 0 with one section (the whole launch is longest first already) and
    for masks whose rows are alike (causal's longest column is about a section's share: no tail to remove)."""
    sections = -(-pairs // max(1, section_pairs))
    if sections <= 1 or len(order) == 0:
        return 0
    per_sm = float(costs.sum()) * pairs / max(1, sms)
    return int(np.count_nonzero(costs[order] > FRONT_SLACK * per_sm / sections))   # a prefix: order is heaviest first


def runs_of(classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR runs of equal non-EMPTY classes along the last axis of int8[R, C]:
    ``offsets`` int32[R + 1] and ``runs`` int32[n, 3] of (begin, end, kind)."""
    rows, cols = classes.shape
    padded = np.full((rows, cols + 2), -1, np.int8)
    padded[:, 1:-1] = classes
    live = classes != EMPTY
    starts = live & (padded[:, 1:-1] != padded[:, :-2])       # a non-empty run begins here
    ends = live & (padded[:, 1:-1] != padded[:, 2:])          # ... and ends here (inclusive)
    r, c = np.nonzero(starts)
    _, e = np.nonzero(ends)                                   # same runs, same row-major order
    offsets = np.zeros(rows + 1, np.int32)
    np.bincount(r, minlength=rows).cumsum(out=offsets[1:])
    runs = np.array([c, e + 1, classes[r, c]]).T.astype(np.int32) if len(r) else np.zeros((0, 3), np.int32)
    return offsets, np.ascontiguousarray(runs)


def dense_of(offsets: np.ndarray, runs: np.ndarray, cols: int) -> np.ndarray:
    """int8[R, cols] classes from CSR runs (the inverse of :func:`runs_of`), vectorized."""
    rows = len(offsets) - 1
    out = np.zeros(rows * (cols + 1), np.int16)
    if len(runs):
        row = np.repeat(np.arange(rows), offsets[1:] - offsets[:-1])
        base = row * (cols + 1)
        kind = runs[:, 2].astype(np.int16)
        np.add.at(out, base + runs[:, 0], kind)
        np.add.at(out, base + runs[:, 1], -kind)
    return out.reshape(rows, cols + 1).cumsum(axis=1)[:, :cols].astype(np.int8)


def floor_blocks(x, block: int):
    """``x // block`` (the block that holds position x), by a shift where ``block`` is a power of two: an
    arithmetic shift floors as // does, at about a quarter of int64 division's cost."""
    block = int(block)
    return x >> (block.bit_length() - 1) if block & (block - 1) == 0 else x // block


def ceil_blocks(x, block: int):
    """``-(-x // block)``: the blocks that ``[0, x)`` reaches; where ``block`` is a power of two, ``(x + block - 1)``
    shifted (two passes, where the negations take three; positions are far from int64's end)."""
    block = int(block)
    if block & (block - 1) == 0:
        return (x + (block - 1)) >> (block.bit_length() - 1)
    return -(-x // block)


def sorted_unique(values: np.ndarray, return_inverse: bool = False, runs: bool = False):
    """``np.unique`` of int64 values by one sort (numpy's own hashes first: several times slower on the
    short arrays classification makes), and with ``return_inverse`` where each value went. ``runs``: the values
    are a few ascending runs (sorted lists concatenated), which a stable sort (timsort) merges in linear time
    (2.5x faster than the default at 400-900 values; 2x slower on values in no order)."""
    if return_inverse:
        order = values.argsort(kind="stable")
        ordered = values[order]
    else:
        ordered = values.copy()
        ordered.sort(kind="stable" if runs else None)
    new = np.empty(len(ordered), bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    if not return_inverse:
        return ordered[new]
    inverse = np.empty(len(values), np.intp)
    inverse[order] = new.cumsum() - 1
    return ordered[new], inverse


def transposed(offsets: np.ndarray, runs: np.ndarray, batch: int, qt: int, kt: int):
    """The CSR of the same tiles by column: for column block ``b * kt + j``, runs of ``(q_begin, q_end, kind)``
    over the q_blocks of batch element b. Built from the row runs: a column's class changes between
    consecutive q_blocks only where their runs differ, so the work is O(runs log runs + column runs), never
    the tile grid."""
    row = np.repeat(np.arange(batch * qt), offsets[1:] - offsets[:-1]).astype(np.int64)
    b, i = row // qt, row % qt
    stride = kt + 1
    # Pair p = b * (qt + 1) + i compares q_block i - 1 ("before", empty for i = 0) with q_block i ("now",
    # empty for i = qt); a run of q_block i is "now" in pair p and "before" in pair p + 1.
    pair_now = b * (qt + 1) + i
    now = (pair_now * stride + runs[:, 0], pair_now * stride + runs[:, 1], runs[:, 2])
    before = ((pair_now + 1) * stride + runs[:, 0], (pair_now + 1) * stride + runs[:, 1], runs[:, 2])
    cuts = sorted_unique(np.concatenate([now[0], now[1], before[0], before[1]]))
    seg_lo, seg_hi = cuts[:-1], cuts[1:]
    inside = seg_lo // stride == (seg_hi - 1) // stride          # elementary segments of one pair
    seg_lo, seg_hi = seg_lo[inside], seg_hi[inside]

    def kind_on(keyed):
        begin, end, kind = keyed
        at = np.maximum(begin.searchsorted(seg_lo, side="right") - 1, 0)
        hit = (begin[at] <= seg_lo) & (end[at] >= seg_hi) if len(begin) else np.zeros(len(seg_lo), bool)
        return np.where(hit, kind[at] if len(begin) else 0, EMPTY)

    k_before, k_now = kind_on(before), kind_on(now)
    change = k_before != k_now
    seg_lo, seg_hi, k_now = seg_lo[change], seg_hi[change], k_now[change]
    pair = seg_lo // stride
    width = seg_hi - seg_lo
    # One event per column at each change: (column, q_block, new kind), columns numbered b * kt + j.
    first = np.repeat(seg_lo - pair * stride - width.cumsum() + width, width) + np.arange(int(width.sum()))
    pair = np.repeat(pair, width)
    col = (pair // (qt + 1)) * kt + first
    at_row = pair % (qt + 1)
    kind = np.repeat(k_now, width)
    order = np.lexsort((at_row, col))
    col, at_row, kind = col[order], at_row[order], kind[order]
    starts = (kind != EMPTY).nonzero()[0]             # every run ends at its column's next event
    col_offsets = np.zeros(batch * kt + 1, np.int32)
    np.bincount(col[starts], minlength=batch * kt).cumsum(out=col_offsets[1:])
    col_runs = np.empty((len(starts), 3), np.int32)
    col_runs[:, 0], col_runs[:, 1], col_runs[:, 2] = at_row[starts], at_row[starts + 1], kind[starts]
    return col_offsets, col_runs


def partial_slots(offsets: np.ndarray, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The PARTIAL tiles of a CSR of runs, numbered in the order a kernel walks them (row by row, each row's runs
    in order, each run's blocks ascending): ``(run_slots, tiles)``.

    ``run_slots`` int32[n_runs]: the number of each run's first block (a PARTIAL run's block ``j`` is number
    ``run_slots[run] + j - begin``; a FULL run holds the number the next PARTIAL block gets); ``tiles``
    int32[n_partial, 2]: the (row, block) of each number. O(runs + PARTIAL tiles), never the tile grid."""
    lengths = np.where(runs[:, 2] == PARTIAL, runs[:, 1] - runs[:, 0], 0).astype(np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    rows = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    partial = lengths > 0
    total = int(ends[-1]) if len(ends) else 0
    first = np.repeat(starts[partial], lengths[partial])
    tiles = np.empty((total, 2), np.int32)
    tiles[:, 0] = np.repeat(rows[partial], lengths[partial])
    tiles[:, 1] = np.repeat(runs[partial, 0], lengths[partial]) + (np.arange(total) - first)
    return starts.astype(np.int32), tiles


def _column_steps(offsets: np.ndarray, runs: np.ndarray, batch: int, qt: int):
    """Every step of a column view (CSR of query-block runs per key column), in walking order: ``(column, key,
    first)``, the step's column and query block key ``b * qt + qb`` (b its batch element), and each run's first step
    index (length len(runs) + 1)."""
    cols = len(offsets) - 1
    col_of_run = np.repeat(np.arange(cols), offsets[1:] - offsets[:-1])
    lengths = (runs[:, 1] - runs[:, 0]).astype(np.int64)
    first = np.zeros(len(runs) + 1, np.int64)
    np.cumsum(lengths, out=first[1:])
    run_of_step = np.repeat(np.arange(len(runs)), lengths)
    qb = runs[run_of_step, 0] + (np.arange(int(first[-1])) - first[run_of_step])
    column = col_of_run[run_of_step]
    key = (column // max(cols // max(batch, 1), 1)) * qt + qb
    return column, key, first


def ordered_columns(offsets: np.ndarray, runs: np.ndarray, batch: int, qt: int, first_wave: int | None = None):
    """The column view's launch order and dQ turns for a backward whose dQ additions happen in a fixed order
    (deterministic): ``(order, rank_base, ranks)``.

    ``order`` int32[B*KT]: the columns shortest first (ties: the later key block first), so that the columns
    adding to a query block arrive at it in about the order of their turns (causal: the diagonal's column at its
    first step, the one before it at its second...). With ``first_wave``: only the first ``first_wave`` columns
    so (the CTAs that start together, which then never wait on each other), the others longest first (they start
    one by one as CTAs end, so the longest no longer start last and run alone at the end: bench/turns_model.py).
    ``ranks[rank_base[r] + qb]`` is the turn, among the
    columns that see query block ``qb`` of their batch element, of the column of run ``r`` (``col_runs[r]``
    covers qb): how many of those columns come before it in ``order``. Turns follow the launch order, so a
    column waits only for columns launched before it (no deadlock, whatever stays resident)."""
    cols = len(offsets) - 1
    order = np.lexsort((-np.arange(cols), row_costs(offsets, runs))).astype(np.int32)
    if first_wave is not None:
        order = np.concatenate([order[:first_wave], order[first_wave:][::-1]])
    position = np.empty(cols, np.int64)
    position[order] = np.arange(cols)
    # one entry per step: (query block key b * qt + qb, the column's position in the order)
    column, key, first = _column_steps(offsets, runs, batch, qt)
    by_key = np.lexsort((position[column], key))
    starts = np.ones(len(by_key), bool)
    starts[1:] = key[by_key][1:] != key[by_key][:-1]
    group_start = np.maximum.accumulate(np.where(starts, np.arange(len(by_key)), 0))
    ranks = np.empty(len(by_key), np.int32)
    ranks[by_key] = np.arange(len(by_key)) - group_start
    rank_base = (first[:-1] - runs[:, 0]).astype(np.int32)
    return order, rank_base, ranks


TURN_HOLD = 1.0
"""How long a deterministic dQ turn holds its query block, in steps (a step: one column's products over one query
block): the staged tile's bulk reduce-add, the wait for it to land and the counter the next turn polls. With it a
list-scheduling model of the turns (bench/turns_model.py) gives CLEAR's deterministic backward at 32K 0.51x the
fast mode's time, measured 0.54x (run 73); a hold of 0.05 gives 0.96x."""


def turn_section_pairs(offsets: np.ndarray, runs: np.ndarray, batch: int, qt: int, pairs: int, section_pairs: int,
                       sms: int, group: int = 1) -> int:
    """How many (batch, head) pairs a deterministic backward whose dQ additions take turns should launch per
    section: ``section_pairs`` (what the L2 holds), or more where the longest chain of turns would outlast a
    section.

    Why: a query block's additions happen one after another, each holding it TURN_HOLD steps, so a block that
    ``chain`` columns add to takes at least ``chain * TURN_HOLD`` steps, while a section of ``s`` pairs lasts about
    ``s * group * steps / sms`` (``steps``: the view's steps, which a CTA takes once for each of the ``group``
    query heads of its kv head). Sections run one after another, so where the
    chains are longer the pairs' chains run one after another too: CLEAR's text rows, which every one of its 256 key
    columns adds to at 32K against 82 steps per head and SM, made the deterministic backward 0.51x the fast one's
    speed in the model with one head per section, 0.96x with 4 (bench/NOTES.md, session 15). Widening changes only
    where work runs: the turns, and so every bit of dQ, stay as they are. Causal, document, sliding windows: the
    chains fit in a section, nothing changes."""
    needed = 0
    if len(runs):
        _, key, first = _column_steps(offsets, runs, batch, qt)
        chain, steps = int(np.bincount(key).max()), int(first[-1])
        needed = -(-int(chain * TURN_HOLD * sms) // max(1, steps * group))
    return max(1, min(pairs, max(section_pairs, needed)))
