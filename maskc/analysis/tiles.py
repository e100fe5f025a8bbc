"""Run-length tile rows: the shared currency of classify and pack (int32 CSR of (begin, end, kind))."""
from __future__ import annotations

import functools

import numpy as np

from maskc.analysis.keys import covered_by_all, subtract, union
from maskc.runs import EMPTY, FULL, PARTIAL, any_true, ceil_blocks, floor_blocks, runs_of, sorted_unique


def merge_runs(row: np.ndarray, begin: np.ndarray, end: np.ndarray, kind: np.ndarray, rows: int,
               ordered: bool = False):
    """CSR from unsorted, non-overlapping runs: sorted per row, empty ones dropped, adjacent runs of
    one kind merged; ``ordered``: they come sorted by row and begin and none empty already (no sort)."""
    if not ordered:
        keep = begin < end
        row, begin, end, kind = row[keep], begin[keep], end[keep], kind[keep]
        order = np.lexsort((begin, row))
        row, begin, end, kind = row[order], begin[order], end[order], kind[order]
    return _joined(row, begin, end, kind, rows)


def _joined(row: np.ndarray, begin: np.ndarray, end: np.ndarray, kind: np.ndarray, rows: int):
    """CSR from non-empty runs sorted by row and begin, adjacent runs of one kind merged; so are runs of one
    kind that overlap the previous one where the ends do not decrease along the overlaps (:func:`_unordered`:
    the shared PARTIAL blocks of :func:`runs_of_keys`). Disjoint runs overlap none: there it joins adjacent ones."""
    joins = (row[1:] == row[:-1]) & (kind[1:] == kind[:-1]) & (begin[1:] <= end[:-1])
    if any_true(joins):
        head = np.concatenate([[True], ~joins]).nonzero()[0]
        end = np.maximum.reduceat(end, head)
        row, begin, kind = row[head], begin[head], kind[head]
    offsets = np.zeros(rows + 1, np.int32)
    offsets[1:] = np.bincount(row, minlength=rows).cumsum()      # (cumsum into the int32 view: twice the time)
    runs = np.empty((len(row), 3), np.int32)
    runs[:, 0], runs[:, 1], runs[:, 2] = begin, end, kind
    return offsets, runs


def starts_of(block: np.ndarray) -> np.ndarray:
    """The index of the first element of each run of equal values of ``block``."""
    new = np.empty(len(block), bool)
    new[:1] = True
    np.not_equal(block[1:], block[:-1], out=new[1:])
    return new.nonzero()[0]


def runs_of_keys(block: np.ndarray, slots, need: np.ndarray, kv_len: int, block_n: int, rows: int):
    """CSR runs of ``rows`` q_blocks from the key intervals of their *owners* (rows, or pieces of rows).

    Owner i lies in q_block ``block[i]`` (``block`` ascending). ``slots`` is a list of ``(lo, hi, lo_b, hi_b)``
    arrays over the owners: slot j of owner i holds keys ``[lo, hi)`` at the owner's first row and
    ``[lo_b, hi_b)`` at its last (empty at both or at neither), every row between seeing an interval that
    moves from one to the other by one key per row at most, so that the rows' union is the hull of the two
    and their intersection the intersection. An owner's slots are disjoint, not adjacent and ascending (its
    empty ones last: :func:`~maskc.analysis.intervals.compact`); ``need[q]`` counts q_block q's owners. A key
    block is FULL where every owner covers it at every row, PARTIAL where some row touches it. Work and memory are O(owners x slots): the tile grid is never built.

    Most q_blocks are settled from per-slot hulls (the keys touched are the hull of each slot's intervals
    where consecutive owners' intervals chain; a block every owner covers lies in one slot where the slots'
    hulls are disjoint, and where they share blocks, those are PARTIAL if some owner covers none of them:
    :func:`_none_full`, :func:`_unordered`); the touched and covered key blocks of the others' owners and
    slots are counted (:func:`_counted_runs`)."""
    kt = -(-kv_len // block_n)
    live, t0, t1, c0, c1 = _touched_and_covered(slots, kv_len, block_n)
    flat = (live, t0, t1, c0, c1)
    n = len(block)
    first = starts_of(block)                                  # each q_block's first owner
    present = block[first]
    at_block = present.searchsorted(block)                    # each owner's place among the q_blocks present
    # A hole: consecutive live owners of one slot and q_block whose key blocks are apart.
    idx = live.ravel().nonzero()[0]
    slot, q_block = idx // n, block.take(idx % n)                  # each live cell's slot and q_block
    t0l, t1l = t0.ravel().take(idx), t1.ravel().take(idx)
    hole = (slot[1:] == slot[:-1]) & (q_block[1:] == q_block[:-1]) & ((t0l[1:] > t1l[:-1]) | (t0l[:-1] > t1l[1:]))
    bad = np.zeros(len(first), bool)
    bad[present.searchsorted(q_block[:-1][hole])] = True
    h0, h1 = np.minimum.reduceat(t0, first, axis=1), np.maximum.reduceat(t1, first, axis=1)   # [slots, q_blocks]
    f0, f1 = np.maximum.reduceat(c0, first, axis=1), np.minimum.reduceat(c1, first, axis=1)
    some = h0 < h1
    shared = None
    if len(slots) > 1:                                        # a key block two slots' hulls share
        i, j = _slot_pairs(len(slots))
        s0 = np.maximum(h0.take(i, axis=0), h0.take(j, axis=0))    # empty where either hull is (2**40, -1)
        s1 = np.minimum(h1.take(i, axis=0), h1.take(j, axis=0))
        pair = s0 < s1
        shared = pair.any(axis=0) & ~bad                      # (those with holes are counted anyway)
        if shared.any():
            bad |= shared & ~_none_full(pair, s0, s1, first, at_block, c0, c1)
    h0, h1 = np.where(some, h0, 0), np.where(some, h1, 0)
    cut0, cut1 = np.maximum(f0, h0), np.minimum(f1, h1)
    has_full = cut0 < cut1
    cut0, cut1 = np.where(has_full, cut0, h1), np.where(has_full, cut1, h1)
    # Per q_block, each slot's PARTIAL, FULL, PARTIAL runs, slot after slot: in order where no hulls share a block.
    begin = np.array([h0, cut0, cut1]).transpose(1, 0, 2).reshape(-1, len(first)).T      # [q_blocks, 3 x slots]
    end = np.array([cut0, cut1, h1]).transpose(1, 0, 2).reshape(-1, len(first)).T
    keep = begin < end
    keep[bad] = False
    at, col = keep.nonzero()
    cell = col * len(first) + at          # (at, col) in the [3 x slots, q_blocks] arrays begin and end transpose
    out = (present[at], begin.T.ravel().take(cell), end.T.ravel().take(cell), _slot_run_kinds(len(slots)).take(col))
    if shared is not None and (shared & ~bad).any():          # shared blocks PARTIAL: runs in order, or counted
        unordered = _unordered(out[0], out[2])
        if len(unordered):
            bad[present.searchsorted(unordered)] = True
            kept = ~np.isin(out[0], unordered)
            out = (out[0][kept], out[1][kept], out[2][kept], out[3][kept])
    if not bad.any():
        return _joined(*out, rows)
    owners = bad[at_block]
    live = flat[0] & owners
    if np.count_nonzero(live) <= FEW_COUNTED:
        # few slots to count (global_local's one q_block): by hand, sorted; the per-slot runs leave out the bad
        # q_blocks and come sorted, so one stable sort by q_block puts the two lists in order
        row, begin, end, kind = _cat(out, _counted_by_hand(block, live, flat, need))
        order = row.argsort(kind="stable")
        return _joined(row[order], begin[order], end[order], kind[order], rows)
    return merge_runs(*_cat(out, _counted_runs(block, owners, flat, need, kt)), rows)


def _touched_and_covered(slots, kv_len: int, block_n: int):
    """For runs_of_keys' ``slots`` (``(lo, hi, lo_b, hi_b)`` arrays over the owners), [slots, owners] arrays:
    whether the slot is live (``lo < hi``: then also ``lo_b < hi_b``), the key blocks ``[t0, t1)`` it touches at
    some row (the hull of its two intervals, rounded out) and ``[c0, c1)`` it covers at every row (their
    intersection, rounded in; a last key block cut short by kv_len counts as covered when the keys reach kv_len).
    Dead slots get the empty ranges ``[2**40, -1)``.

    One pass over a stacked [4, slots, owners] array: the pairs' minima (t0, c1) and maxima (c0, t1) by one call
    each, then the hull's low end and the intersection's high end floored by one shift, the other two ends negated
    first, so that the same shift ceils them (``ceil(x / n) = -floor(-x / n)``), and negated back."""
    kt = -(-kv_len // block_n)
    # [4 (lo, hi, lo_b, hi_b), slots, owners], contiguous: each call below then runs one loop over all slots (one
    # slot's [slots, 4, owners] is that already, and stacks faster)
    ends = (np.array(slots).reshape(4, 1, -1) if len(slots) == 1 else
            np.array([[slot[i] for slot in slots] for i in range(4)]))
    live = ends[0] < ends[1]
    x = np.empty(ends.shape, np.int64)                        # t0, c1 (floored), then c0, t1 (ceiled)
    np.minimum(ends[:2], ends[2:], out=x[:2])
    np.maximum(ends[:2], ends[2:], out=x[2:])
    short_last = x[1] >= kv_len                               # c1: kt where the keys reach kv_len
    np.negative(x[2:], out=x[2:])
    x = floor_blocks(x, block_n)
    np.negative(x[2:], out=x[2:])
    x[1][short_last] = kt
    x = np.where(live, x, _DEAD_BLOCKS)
    return live, x[0], x[3], x[2], x[1]


# The touched and covered block ranges of a dead slot (t0, c1, c0, t1: _touched_and_covered's order): empty, below
# every q_block's hull.
_DEAD_BLOCKS = np.array([1 << 40, -1, 1 << 40, -1], np.int64).reshape(4, 1, 1)


# Live slots up to which runs_of_keys counts its bad q_blocks in Python (:func:`_counted_by_hand`): there each numpy
# call of :func:`_counted_runs` and the merge after it costs more than the work.
FEW_COUNTED = 32


def _counted_by_hand(block: np.ndarray, live: np.ndarray, flat, need: np.ndarray) -> "Runs":
    """:func:`_counted_runs`' runs of the owners' slots ``live`` ([slots, owners]), sorted by q_block and begin
    (the order :func:`_row_counts` gives), computed in Python for a few slots: per q_block, a sweep over the
    ends of its touched ``[t0, t1)`` and covered ``[c0, c1)`` key blocks counts how many slots touch and how many
    cover each stretch between consecutive ends; FULL where ``need[q_block]`` cover (an owner's covered ranges
    are disjoint, so only every owner covering makes that count), PARTIAL where some slot touches. Adjacent
    stretches of one class stay apart (:func:`_joined` merges them)."""
    _, t0, t1, c0, c1 = flat
    events: dict = {}
    for q, a, b, c, d in zip(*(x.tolist() for x in (block[live.nonzero()[1]], t0[live], t1[live], c0[live], c1[live]))):
        mine = events.setdefault(q, [])
        mine += [(a, 0, 1), (b, 0, -1)] + ([(c, 1, 1), (d, 1, -1)] if c < d else [])
    found = []
    for q in sorted(events):
        counts, full = [0, 0], int(need[q])
        at = None
        for key, which, delta in sorted(events[q]):
            if at is not None and key > at:
                cls = FULL if counts[1] == full else PARTIAL if counts[0] else EMPTY
                if cls != EMPTY:
                    found.append((q, at, key, cls))
            counts[which] += delta
            at = key
    if not found:
        return (np.zeros(0, np.int64),) * 4
    row, begin, end, kind = (np.array(x, np.int64) for x in zip(*found))
    return row, begin, end, kind


def _none_full(pair, s0, s1, first, at_block, c0, c1) -> np.ndarray:
    """bool[q_blocks]: whether some owner of the q_block covers, with no slot, any key block of the hull of the
    blocks that two slots' hulls share (``pair`` [pairs, q_blocks] where the pair's hulls share ``[s0, s1)``;
    ``first``, each q_block's first owner, ``at_block`` each owner's q_block (its index in ``first``); ``[c0,
    c1)`` [slots, owners], the key blocks each slot of an owner covers at every row). Then no shared block is
    FULL: a FULL block is covered by every owner. Read only where some pair shares blocks (elsewhere the
    answer means nothing)."""
    if len(pair) == 1:                                        # the shared blocks' hull [lo, hi) per q_block
        lo, hi = s0[0], s1[0]
    else:
        lo, hi = np.where(pair, s0, np.int64(1) << 40).min(axis=0), np.where(pair, s1, -1).max(axis=0)
    covers = ((c0 < c1) & (c0 < hi[at_block]) & (c1 > lo[at_block])).any(axis=0)
    return ~np.logical_and.reduceat(covers, first)


def _unordered(row, end) -> np.ndarray:
    """The rows (sorted, unique) of :func:`runs_of_keys`' per-slot runs (slot after slot) where a run overlaps
    the previous one and ends before it (one slot's hull inside another's): what :func:`_joined` cannot merge.
    Otherwise they are in its order: overlaps are of PARTIAL runs only (a slot's FULL blocks lie in no other
    slot's hull), a slot's first run begins no earlier than the previous slot's (an owner's slots ascend), and a
    run that begins before the previous one overlaps it, so that this test finds it (it would have to hold the
    previous run, a slot's last PARTIAL run after its FULL ones, whose blocks its hull cannot reach). A
    non-empty run that ends before the previous one's end overlaps it unless it begins before it."""
    wrong = (row[1:] == row[:-1]) & (end[1:] < end[:-1])
    return sorted_unique(row[1:][wrong])


@functools.lru_cache(maxsize=None)
def _slot_run_kinds(slots: int) -> np.ndarray:
    """The kind of each of runs_of_keys' (PARTIAL, FULL, PARTIAL) runs of ``slots`` slots, slot after slot."""
    kinds = np.array([PARTIAL, FULL, PARTIAL] * slots, np.int64)
    kinds.flags.writeable = False
    return kinds


@functools.lru_cache(maxsize=None)
def _slot_pairs(slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays of every pair (i < j) of ``slots`` slots."""
    pairs = [(i, j) for i in range(slots) for j in range(i + 1, slots)]
    return np.array([i for i, _ in pairs]), np.array([j for _, j in pairs])


def _counted_runs(block, owners, flat, need, kt: int):
    """Runs ``(q_block, begin, end, kind)`` of the q_blocks of the ``owners`` (a mask over them; None: all)
    from their slots' touched ``[t0, t1)`` and covered ``[c0, c1)`` key blocks ([slots, owners]): see
    :func:`block_runs` (:func:`_row_counts` for up to :data:`ROW_COUNT_CELLS` counters)."""
    live, t0, t1, c0, c1 = flat
    pick = live if owners is None else live & owners
    rows = np.repeat(block[None, :], len(live), axis=0)
    cover = pick & (c0 < c1)
    touch, cover = (rows[pick], t0[pick], t1[pick]), (rows[cover], c0[cover], c1[cover])
    if owners is not None:
        blocks = sorted_unique(touch[0])
        if len(blocks) * (kt + 1) <= ROW_COUNT_CELLS:
            return _row_counts(blocks, touch, cover, need, kt)
    return block_runs(touch, cover, need, kt)


# Key-block counters _row_counts may take for a few q_blocks at once (int64 each): a bounded scratch, not the
# tile grid.
ROW_COUNT_CELLS = 1 << 16


def _row_counts(blocks: np.ndarray, touch, cover, need: np.ndarray, kt: int) -> "Runs":
    """:func:`block_runs` for the q_blocks ``blocks`` (sorted, every q_block of ``touch`` among them), counted
    on one row of kt + 1 counters per q_block: the same runs in fewer operations, for a few q_blocks."""
    width = kt + 1
    size = len(blocks) * width

    def counts(q, begin, end):
        at = blocks.searchsorted(q) * width
        diff = np.bincount(at + begin, minlength=size) - np.bincount(at + end, minlength=size)
        return diff.reshape(len(blocks), width).cumsum(axis=1)[:, :kt]

    full = counts(*cover) == need[blocks][:, None]
    classes = np.where(full, FULL, np.where(counts(*touch) > 0, PARTIAL, EMPTY)).astype(np.int8)
    offsets, runs = runs_of(classes)
    return np.repeat(blocks, offsets[1:] - offsets[:-1]), runs[:, 0], runs[:, 1], runs[:, 2]


Runs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]      # (row, begin, end, kind), flat


def _cat(a: Runs, b: Runs) -> Runs:
    return np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]), np.concatenate([a[2], b[2]]), \
        np.concatenate([a[3], b[3]])


def block_runs(touch, cover, need: np.ndarray, kt: int) -> Runs:
    """Runs ``(q_block, begin, end, kind)``, unsorted, from flat lists of key blocks: ``touch`` =
    (q_block, begin, end) ranges some row touches, ``cover`` = ranges of ``need[q_block]`` owners (rows, or
    pieces of rows) each of which covers them at every row, an owner's ranges disjoint. FULL where every
    owner covers (a count of ``need``), PARTIAL where touched and not FULL."""
    touched = union(touch[0], touch[1], touch[2], kt)
    covered = covered_by_all(cover[0], cover[1], cover[2], need, kt)
    partial = subtract(touched, covered, kt)
    return _cat((*covered, np.full(len(covered[0]), FULL)), (*partial, np.full(len(partial[0]), PARTIAL)))


def key_block_runs(row_block: np.ndarray, row: np.ndarray, lo: np.ndarray, hi: np.ndarray, need: np.ndarray,
                   kv_len: int, block_n: int, rows: int):
    """CSR runs of ``rows`` q_blocks from flat key intervals ``[lo, hi)`` of rows ``row`` (a row's
    intervals disjoint, not adjacent; ``row_block[r]`` is row r's q_block, ``need[q]`` q_block q's rows)."""
    kt = -(-kv_len // block_n)
    live = lo < hi
    block, lo, hi = row_block[row[live]], lo[live], hi[live]
    c0, c1 = ceil_blocks(lo, block_n), np.where(hi >= kv_len, kt, floor_blocks(hi, block_n))   # short last tile
    ok = c0 < c1
    found = block_runs((block, floor_blocks(lo, block_n), ceil_blocks(hi, block_n)), (block[ok], c0[ok], c1[ok]),
                       need, kt)
    return merge_runs(*found, rows)


def concat_csr(parts, rows: int):
    """One CSR from consecutive ones (each ``(offsets, runs)`` for the next rows), ``rows`` rows in all."""
    if len(parts) == 1:
        return parts[0]
    offsets = np.zeros(rows + 1, np.int32)
    at, base = 0, 0
    for o, r in parts:
        offsets[at + 1: at + len(o)] = o[1:] + base
        at, base = at + len(o) - 1, base + len(r)
    runs = np.concatenate([r for _, r in parts]) if parts else np.zeros((0, 3), np.int32)
    return offsets, np.ascontiguousarray(runs, np.int32)


def agree(csrs, cols: int):
    """Runs where several CSRs of the same rows (one per head) agree on a class, PARTIAL where they differ
    (a tile FULL for one head and EMPTY for another is PARTIAL): O(runs log runs), no grid."""
    stride = cols + 1
    keyed = []
    for offsets, runs in csrs:
        row = np.repeat(np.arange(len(offsets) - 1), offsets[1:] - offsets[:-1]).astype(np.int64)
        keyed.append((row * stride + runs[:, 0], row * stride + runs[:, 1], runs[:, 2]))
    cuts = sorted_unique(np.concatenate([k for b, e, _ in keyed for k in (b, e)]))
    if not len(cuts):
        return csrs[0]
    seg_lo, seg_hi = cuts[:-1], cuts[1:]
    inside = seg_lo // stride == (seg_hi - 1) // stride           # elementary segments within one row
    seg_lo, seg_hi = seg_lo[inside], seg_hi[inside]
    found = []
    for begin, end, kind in keyed:              # each CSR's class on each segment (runs sorted and disjoint)
        if not len(begin):
            found.append(np.full(len(seg_lo), EMPTY))
            continue
        at = begin.searchsorted(seg_lo, side="right") - 1
        hit = (at >= 0) & (end[np.maximum(at, 0)] >= seg_hi)
        found.append(np.where(hit, kind[np.maximum(at, 0)], EMPTY))
    kinds = np.array(found)
    kind = np.where((kinds == kinds[0]).all(axis=0), kinds[0], PARTIAL)
    live = kind != EMPTY
    row = seg_lo[live] // stride
    return _joined(row, seg_lo[live] - row * stride, seg_hi[live] - row * stride, kind[live],
                   len(csrs[0][0]) - 1)
