"""Tile runs of masks linear in k from q-pieces: work O(pieces x forms^2), not O(rows), never O(tiles).

A *piece* is a run of rows inside one q_block on which every bound and guard of every region is affine in
q, the bounds with slope -1, 0 or 1. :func:`maskc.piece_tiles.piece_starts` cuts the q_blocks at segment
boundaries, at the steps of floors of q and where a min or max changes its winner; two more rounds of cuts
follow here:

1. where two lower bounds of one region change order (the region's lower end, the max of 0 and its lower
   bounds, is then one of them all along the piece), two of its upper bounds, or a guard changes sign;
2. where two region ends change order: every lower and upper end of every region, allow and deny, against
   every other.

"Change order" means the outcome of comparing them (<, = or >) changes: two affine forms do so at most
twice on a piece, at rows computed exactly from the piece's first two rows. On the pieces that remain,
every comparison :func:`maskc.intervals.combine` makes to union the allow regions' intervals and subtract
the deny regions' has one outcome at every row, so all rows of a piece have slots of one structure, each
slot end one region end, affine with slope -1, 0 or 1. Consecutive rows' slots then overlap or abut: a
slot's keys over the piece are the hull of its first and last rows', the keys it has at every row the
intersection of theirs, which :func:`maskc.tiles.runs_of_keys` turns into tile runs.

The forms are evaluated once, at the first two rows of each piece of the first cut; every later value is
extrapolated along its piece's slope, exactly (the forms are affine there). Masks whose forms are not
affine this way (a bound ``k <= q // 2``, a product of q) are left to the row-by-row classification.
"""
from __future__ import annotations

import numpy as np

from .intervals import combine, masked
from .piece_tiles import Breaks, piece_starts, slopes
from .rows import RowValues, k_bound_rows
from .tiles import runs_of_keys


def qualifies(regions, breaks: Breaks) -> bool:
    """Whether every region is linear with forms affine on pieces (bounds of slope -1, 0 or 1, divided only
    where constant); records in ``breaks`` where pieces must end."""
    for region in regions:
        if not region.linear:
            return False
        for g in region.guards + region.static_guards:
            if slopes(g.lin, breaks) is None:
                return False
        for b in region.lower + region.upper:
            s = slopes(b.lin, breaks)
            if s is None or any(abs(x) > 1 for x in s) or (s != {0} and b.den != 1):
                return False
    return True


class _Forms:
    """Every bound and guard of the regions once (shared forms evaluated once), as rows of a table, with
    the constants 0 and kv_len - 1 that clip the bounds."""

    def __init__(self, regions, kv_len: int):
        self.index: dict = {}
        self.forms: list = [np.int64(0), np.int64(kv_len - 1)]
        self.zero, self.last = 0, 1
        # per region: (lower rows, upper rows, guard rows), each list including the clipping constant
        self.regions = [([self.zero] + [self._add(b, True) for b in r.lower],
                         [self.last] + [self._add(b, False) for b in r.upper],
                         [self._add(g, None) for g in r.guards + r.static_guards]) for r in regions]

    def _add(self, item, lower) -> int:
        key = (item.lin, getattr(item, "den", 1), lower)
        if key not in self.index:
            self.index[key] = len(self.forms)
            self.forms.append((item, lower))
        return self.index[key]

    def values(self, rows: RowValues, n: int) -> np.ndarray:
        """int64[forms, n]: every form at the rows (bounds rounded inward: ceil for lower, floor for upper)."""
        out = np.empty((len(self.forms), n), np.int64)
        for i, form in enumerate(self.forms):
            if isinstance(form, tuple):
                item, lower = form
                form = rows.lin(item.lin) if lower is None else k_bound_rows(item, rows, lower=lower)
            out[i] = form
        return out


def _order_changes(starts: np.ndarray, span: np.ndarray, value: np.ndarray, slope: np.ndarray, pairs):
    """The rows, inside their pieces, where the order of a pair of forms changes: ``value`` and ``slope``
    are [forms, pieces] (the forms affine on each piece), ``pairs`` two index arrays."""
    i, j = pairs
    step = slope[i] - slope[j]
    pair, piece = np.nonzero(step)
    if not len(pair):
        return np.zeros(0, np.int64)
    m = step[pair, piece]
    e = (value[i[pair], piece] - value[j[pair], piece]) * np.sign(m)     # e + |m| t rises with the row t
    m = np.abs(m)
    cuts = []
    for t in (-(e // m), (-e) // m + 1):          # the first t with e + |m| t >= 0, then > 0
        inside = (t > 0) & (t <= span[piece])
        cuts.append(starts[piece[inside]] + t[inside])
    return np.concatenate(cuts)


def _pairs(groups) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of rows within each group (deduplicated)."""
    found = {(min(a, b), max(a, b)) for g in groups for x, a in enumerate(g) for b in g[x + 1:] if a != b}
    if not found:
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    i, j = np.array(sorted(found)).T
    return i, j


def _refine(starts: np.ndarray, seq_len: int, value_slope, pairs) -> np.ndarray:
    """``starts`` with the rows where a pair's order changes added (``value_slope(starts)`` gives the
    forms' values at each piece's first row and their slopes)."""
    if not len(pairs[0]):
        return starts
    span = np.append(starts[1:], seq_len) - 1 - starts
    value, slope = value_slope(starts)
    cuts = _order_changes(starts, span, value, slope, pairs)
    return np.union1d(starts, cuts) if len(cuts) else starts


def runs_from_pieces(allow, deny, breaks: Breaks, params, b: int, head: int, seq_len: int, kv_len: int,
               block_m: int, block_n: int):
    """CSR tile runs (offsets int32[QT + 1], runs int32[n, 3]) of one batch element and head, exact, for
    regions that :func:`qualifies` accepted with ``breaks`` (see the module docstring)."""
    qt = -(-seq_len // block_m)
    regions = tuple(allow) + tuple(deny)
    forms = _Forms(regions, kv_len)
    base = piece_starts(breaks, params, b, head, seq_len, kv_len, block_m)
    base_end = np.append(base[1:], seq_len) - 1
    rows = RowValues(params, seq_len, kv_len, head, b, np.concatenate([base, np.minimum(base + 1, base_end)]))
    both = forms.values(rows, 2 * len(base))
    value0, slope0 = both[:, :len(base)], both[:, len(base):] - both[:, :len(base)]

    def at(positions: np.ndarray) -> np.ndarray:
        """Every form at the rows ``positions`` (extrapolated along the pieces of the first cut)."""
        p = np.searchsorted(base, positions, side="right") - 1
        return value0[:, p] + slope0[:, p] * (positions - base[p])

    def region_ends(values: np.ndarray):
        """[regions, n] lower ends, upper ends (exclusive) and guards, from the forms' values."""
        lo = np.stack([values[lower].max(axis=0) for lower, _, _ in forms.regions])
        hi = np.stack([values[upper].min(axis=0) for _, upper, _ in forms.regions]) + 1
        ok = np.stack([(values[guards] <= 0).all(axis=0) for _, _, guards in forms.regions])
        return lo, hi, ok

    # 1: the winners of each region's max and min, and its guards' truth, constant on every piece.
    groups = [g for lower, upper, guards in forms.regions for g in [lower, upper] + [[x, forms.zero] for x in guards]]
    starts = _refine(base, seq_len, lambda _: (value0, slope0), _pairs(groups))

    # 2: every region end against every other.
    def ends_value_slope(s: np.ndarray):
        lo0, hi0, _ = region_ends(at(s))
        lo1, hi1, _ = region_ends(at(s + 1))
        return np.concatenate([lo0, hi0]), np.concatenate([lo1 - lo0, hi1 - hi0])

    starts = _refine(starts, seq_len, ends_value_slope, _pairs([list(range(2 * len(regions)))]))

    # The slots at each piece's first and last rows, one structure per piece.
    n = len(starts)
    lo, hi, ok = region_ends(at(np.concatenate([starts, np.append(starts[1:], seq_len) - 1])))
    intervals = [masked(lo[r], hi[r], ok[r]) for r in range(len(regions))]
    slots = combine(intervals[:len(allow)], intervals[len(allow):])
    block = starts // block_m
    need = np.bincount(block, minlength=qt)
    if not slots:
        return runs_of_keys(block[:0], block[:0], block[:0], need, kv_len, block_n, qt)
    first = [(s_lo[:n], s_hi[:n]) for s_lo, s_hi in slots]
    last = [(s_lo[n:], s_hi[n:]) for s_lo, s_hi in slots]
    for (a_lo, a_hi), (b_lo, b_hi) in zip(first, last):
        if np.any((a_lo < a_hi) != (b_lo < b_hi)):
            raise AssertionError("a piece's slots differ between its first and last rows")
    cat = lambda pairs, k: np.concatenate([p[k] for p in pairs])                  # noqa: E731
    owner_block = np.tile(block, len(slots))
    return runs_of_keys(owner_block, cat(first, 0), cat(first, 1), need, kv_len, block_n, qt,
                        last=(cat(last, 0), cat(last, 1)))

