"""Tile runs of masks linear in k from q-pieces: work O(pieces x forms^2), not O(rows), never O(tiles).

A *piece* is a run of rows inside one q_block on which every bound and guard of every region is affine in
q, the bounds with slope -1, 0 or 1. :func:`maskc.analysis.piece_tiles.piece_starts` cuts the q_blocks at segment
boundaries, at the steps of floors of q and where a min or max changes its winner; one more round of cuts
follows here, where any two of the forms change order: every bound and guard of every region, the constants
0 and kv_len - 1 that clip the bounds, and every upper bound plus one (a region's keys end there, exclusive).

"Change order" means the outcome of comparing them (<, = or >) changes: two affine forms do so at most
twice on a piece, at rows computed exactly from the piece's first two rows. On the pieces that remain, each
region's lower end (the max of 0 and its lower bounds) is one of them all along the piece, so is its upper
end, its guards keep their truth, and every comparison :func:`maskc.analysis.intervals.combine` makes to union
the allow regions' intervals and subtract the deny regions' (region ends against region ends, exclusive
upper ends included) has one outcome at every row: all rows of a piece have slots of one structure, each
slot end one region end, affine with slope -1, 0 or 1. Consecutive rows' slots then overlap or abut: a
slot's keys over the piece are the hull of its first and last rows', the keys it has at every row the
intersection of theirs, which :func:`maskc.analysis.tiles.runs_of_keys` turns into tile runs.

The forms are evaluated once, at the first two rows of each piece of the first cut; every later value is
extrapolated along its piece's slope, exactly (the forms are affine there). Masks whose forms are not
affine this way (a bound ``k <= q // 2``, a product of q) are left to the row-by-row classification.
"""
from __future__ import annotations

import numpy as np

from maskc.analysis.intervals import NONE, combine_stacked, masked
from maskc.analysis.piece_tiles import Breaks, last_rows, piece_starts, slopes
from maskc.analysis.formprog import Env, FormProgram
from maskc.analysis.tiles import runs_of_keys
from maskc.runs import sorted_unique


class PiecePlan:
    """What :func:`runs_from_pieces` needs of a mask's regions, worked out once: where pieces end
    (``breaks``), every bound and guard once (shared forms evaluated once) as rows of a table after the
    constants 0 and kv_len - 1 that clip the bounds, each region's rows of it (padded to one width with
    rows that change nothing: 0 among lower bounds and guards, kv_len - 1 among upper bounds), and the
    pairs of rows (of the table and the upper bounds' rows plus one after it) whose order the cuts follow:
    every pair but those of one slope, parallel on every piece."""

    ZERO, LAST = 0, 1

    def __init__(self, allow, deny, breaks: Breaks):
        self.allow, self.deny, self.breaks = tuple(allow), tuple(deny), breaks
        self._index: dict = {}
        self.forms: list = ["0", "kv_len - 1"]
        regions = [([self.ZERO] + [self._add(b, True) for b in r.lower],
                    [self.LAST] + [self._add(b, False) for b in r.upper],
                    [self._add(g, None) for g in r.guards + r.static_guards]) for r in self.allow + self.deny]
        self.lower, self.upper, self.guard = (_padded([r[i] for r in regions], pad)
                                              for i, pad in enumerate((self.ZERO, self.LAST, self.ZERO)))
        self.uppers = np.array(sorted({u for r in regions for u in r[1]}))
        # each region's rows of the table in one index, [lower bounds + upper bounds + guards, regions]: one take
        # a bind, each kind a contiguous block of it
        self._region_rows = np.ascontiguousarray(np.concatenate([self.lower, self.upper, self.guard], axis=1).T)
        self._upper_at = self.lower.shape[1], self.lower.shape[1] + self.upper.shape[1]
        self._program: FormProgram | None = None
        # Two forms of one slope (parallel on every piece: two constants, two of slope 1) never change order.
        slope = [frozenset({0})] * 2 + [slopes(item.lin, Breaks()) for item, _ in self.forms[2:]]
        slope += [slope[u] for u in self.uppers]
        i, j = _pairs([list(range(len(slope)))])
        crossing = np.array([len(slope[a]) > 1 or slope[a] != slope[b] for a, b in zip(i, j)], bool)
        self.pairs = i[crossing], j[crossing]

    def with_ends(self, values: np.ndarray) -> np.ndarray:
        """The table's values with, after them, those of the upper bounds plus one."""
        return np.concatenate([values, values.take(self.uppers, axis=0) + 1])

    def intervals(self, values: np.ndarray) -> np.ndarray:
        """int64[2, regions, rows]: each region's keys ``[lo, hi)`` at the rows of ``values`` (the table's values,
        [forms, rows]): ``lo`` the greatest of its lower bounds (0 among them), ``hi`` one past the least of its
        upper bounds (kv_len - 1 among them); both NONE where a guard fails or the interval is empty, as
        :func:`~maskc.analysis.intervals.masked` gives them."""
        if not self.allow and not self.deny:
            return np.full((2, 0, values.shape[1]), NONE, np.int64)
        rows = values.take(self._region_rows, axis=0)             # [lower + upper + guards, regions, rows]
        a, b = self._upper_at
        ends = np.empty((2,) + rows.shape[1:], np.int64)
        np.maximum.reduce(rows[:a], axis=0, out=ends[0])
        np.minimum.reduce(rows[a:b], axis=0, out=ends[1])
        ends[1] += 1
        seen = (rows[b:] <= 0).all(axis=0) & (ends[0] < ends[1])
        return np.where(seen, ends, NONE)

    def _add(self, item, lower) -> int:
        key = (item.lin, getattr(item, "den", 1), lower)
        if key not in self._index:
            self._index[key] = len(self.forms)
            self.forms.append((item, lower))
        return self._index[key]

    def values(self, env: Env, kv_len: int) -> np.ndarray:
        """int64[forms, rows]: every form at the rows ``env.q`` (bounds rounded inward: ceil for lower, floor
        for upper), by a program compiled on the first call."""
        if self._program is None:
            self._program = FormProgram([(item.lin, None) if lower is None else (item, lower)
                                         for item, lower in self.forms[2:]])
        out = np.empty((len(self.forms), len(env.q)), np.int64)
        out[self.ZERO], out[self.LAST] = 0, kv_len - 1
        for i, v in enumerate(self._program.run(env), 2):
            out[i] = v
        return out


def _padded(rows: list[list[int]], pad: int) -> np.ndarray:
    """int[len(rows), widest]: the lists of rows, each padded with ``pad``."""
    width = max((len(r) for r in rows), default=0)
    return np.array([r + [pad] * (width - len(r)) for r in rows], np.intp).reshape(len(rows), width)


def plan_of(allow, deny) -> PiecePlan | None:
    """The plan of regions whose forms are affine on pieces (every region linear, bounds of slope -1, 0 or 1
    and divided only where constant, guards affine), else None."""
    breaks = Breaks()
    for region in tuple(allow) + tuple(deny):
        if not region.linear:
            return None
        for g in region.guards + region.static_guards:
            if slopes(g.lin, breaks) is None:
                return None
        for b in region.lower + region.upper:
            s = slopes(b.lin, breaks)
            if s is None or any(abs(x) > 1 for x in s) or (s != {0} and b.den != 1):
                return None
    return PiecePlan(_unsubsumed(allow), _unsubsumed(deny), breaks)


def _unsubsumed(regions) -> tuple:
    """The regions less those inside another of them (:func:`_inside`): the same union of keys per row, from
    fewer intervals (a case split of ``q == k or d > 0`` over clamps leaves several sub-cases of one region)."""
    kept: list = []
    for region in regions:
        if any(_inside(region, other) for other in kept):
            continue
        kept = [other for other in kept if not _inside(other, region)] + [region]
    return tuple(r for r in regions if any(r is k for k in kept))


def _inside(inner, outer) -> bool:
    """Whether every row's keys of linear region ``inner`` lie in those of ``outer``, read off their forms:
    each bound and guard of ``outer`` is implied by one of ``inner`` that differs from it by a constant (a
    lower bound or guard at least as high, an upper bound at least as low)."""
    def implied(mine, theirs, sign: int) -> bool:         # per (lin, den): sign * (mine - theirs) >= 0
        return all(any(d == e and m.terms == t.terms and sign * (m.const - t.const) >= 0 for m, d in mine)
                   for t, e in theirs)

    def forms(items):
        return [(x.lin, getattr(x, "den", 1)) for x in items]

    return (implied(forms(inner.lower), forms(outer.lower), 1) and implied(forms(inner.upper), forms(outer.upper), -1)
            and implied(forms(inner.guards + inner.static_guards), forms(outer.guards + outer.static_guards), 1))


def _pairs(groups) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of rows within each group (deduplicated)."""
    found = {(min(a, b), max(a, b)) for g in groups for x, a in enumerate(g) for b in g[x + 1:] if a != b}
    if not found:
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    i, j = np.array(sorted(found)).T
    return i, j


def _refine(starts: np.ndarray, span: np.ndarray, ends: np.ndarray, pairs) -> np.ndarray:
    """``starts`` with the rows added where a pair of forms changes order: ``ends`` [forms, 2 x pieces] holds the
    forms' values at each piece's first rows, then at its last rows (``span`` rows after the first; the forms
    affine on each piece), ``pairs`` two index arrays. Affine forms keep their order (<, = or >) over a piece
    when they have it at both ends, so only those pairs and pieces are searched; with many pairs and pieces,
    first only the pieces where the order of all the forms, ties included, differs between the ends."""
    i, j = pairs
    n = len(starts)
    pieces = None
    if len(i) * n > _PAIR_PIECES:
        first, last = ends[:, :n], ends[:, n:]
        order = first.argsort(axis=0, kind="stable")
        column = np.arange(n)
        a, b = first[order, column], last[order, column]
        pieces = (((b[1:] < b[:-1]) | ((a[1:] == a[:-1]) != (b[1:] == b[:-1]))).any(axis=0)).nonzero()[0]
        ends, n = ends.take(np.concatenate([pieces, pieces + n]), axis=1), len(pieces)
    d = ends.take(i, axis=0) - ends.take(j, axis=0)   # [pairs, first rows then last rows] (take: half a fancy index)
    sign = np.sign(d)
    pair, piece = (sign[:, :n] != sign[:, n:]).nonzero()
    if not len(pair):
        return starts
    cell = pair * (2 * n) + piece                 # (pair, piece) in the flat d, its last row n cells on
    d0, d1 = d.take(cell), d.take(cell + n)
    piece = piece if pieces is None else pieces[piece]
    span = span[piece]
    step = (d1 - d0) // span                      # exact: the forms are affine on the piece
    e, m = d0 * np.sign(step), np.abs(step)       # e + m t rises with the row t
    cuts = [starts]
    for t in (-(e // m), (-e) // m + 1):          # the first t with e + m t >= 0, then > 0
        inside = (t > 0) & (t <= span)
        cuts.append(starts[piece[inside]] + t[inside])
    return sorted_unique(np.concatenate(cuts))


# Pairs x pieces up to which every pair is compared on every piece, without first looking for the pieces where
# some order changes (a sort of every piece's forms: worth it for many pairs on many pieces only).
_PAIR_PIECES = 1 << 12


def _one_region(plan: PiecePlan, value0: np.ndarray, slope0: np.ndarray, span: np.ndarray):
    """The slot of a mask of one allow region at each piece's first and last rows, when no piece needs cuts,
    else None. No cut is needed where on every piece the lower bounds' slopes have one sign (so have the upper
    bounds'), every guard holds at both ends or at neither, and the rows see keys at both ends or provably at
    neither: the region's ends are then monotone by one key per row at most, and its width, a min of affine
    forms minus a max of them, is concave, so rows seeing keys at both ends see keys throughout (and an upper
    bound below a lower bound at both ends stays below between them)."""
    lower, upper, guards = plan.lower[0], plan.upper[0], plan.guard[0]
    last = value0 + slope0 * span
    # each gather once, by take (half the cost of fancy indexing on these few rows)
    s_lo, s_hi = slope0.take(lower, axis=0), slope0.take(upper, axis=0)
    monotone = ((s_lo >= 0).all(axis=0) | (s_lo <= 0).all(axis=0)) & ((s_hi >= 0).all(axis=0) | (s_hi <= 0).all(axis=0))
    g_first, g_last = value0.take(guards, axis=0) <= 0, last.take(guards, axis=0) <= 0
    ok = g_first.all(axis=0)
    lower_a, lower_b = value0.take(lower, axis=0), last.take(lower, axis=0)
    upper_a, upper_b = value0.take(upper, axis=0), last.take(upper, axis=0)
    lo_a, lo_b = lower_a.max(axis=0), lower_b.max(axis=0)
    hi_a, hi_b = upper_a.min(axis=0) + 1, upper_b.min(axis=0) + 1
    seen_a, seen_b = ok & (lo_a < hi_a), ok & (lo_b < hi_b)
    below = ((upper_a[:, None] < lower_a[None]) & (upper_b[:, None] < lower_b[None])).any(axis=(0, 1))
    settled = monotone & (g_first == g_last).all(axis=0) & np.where(seen_a, seen_b, ~seen_b & (~ok | below))
    if not settled.all():
        return None
    (lo_a, hi_a), (lo_b, hi_b) = masked(lo_a, hi_a, seen_a), masked(lo_b, hi_b, seen_b)
    return lo_a, hi_a, lo_b, hi_b


def runs_from_pieces(plan: PiecePlan, params, b: int, head: int, seq_len: int, kv_len: int,
                     block_m: int, block_n: int, rows: tuple[int, int] | None = None):
    """CSR tile runs (offsets int32[q_blocks + 1], runs int32[n, 3]) of one batch element and head, exact (see
    the module docstring), for the q_blocks of the rows ``[row0, row1)`` (whole q_blocks; default all)."""
    row0, row1 = rows or (0, seq_len)
    qt = -(-(row1 - row0) // block_m)
    if not plan.allow:                              # nothing is ever visible
        return np.zeros(qt + 1, np.int32), np.zeros((0, 3), np.int32)
    # The forms are affine on the pieces the breaks make: evaluated at their first two rows. With one region
    # the pieces are cut at q_block starts first (most masks need no other cut); with several, the cuts where
    # forms change order are found on the breaks' few pieces, and only then the q_block starts added.
    one = len(plan.lower) == 1
    base = piece_starts(plan.breaks, params, b, head, seq_len, kv_len, block_m if one else None, (row0, row1))
    span = last_rows(base, row1) - base
    both = plan.values(Env(params, seq_len, kv_len, head, b, np.concatenate([base, base + np.minimum(span, 1)])), kv_len)
    value0, slope0 = both[:, :len(base)], both[:, len(base):] - both[:, :len(base)]

    def at(rows: np.ndarray):
        """Every form at the rows (extrapolated along the pieces of the breaks: the forms are affine there)."""
        p = base.searchsorted(rows, side="right") - 1
        return value0.take(p, axis=1) + slope0.take(p, axis=1) * (rows - base.take(p))    # ([:, p]: 1.5x the time)

    if one:                                         # one allow region: often settled without cuts
        ends_ = _one_region(plan, value0, slope0, span)
        if ends_ is not None:
            block = (base - row0) // block_m
            return runs_of_keys(block, [ends_], np.bincount(block, minlength=qt), kv_len, block_n, qt)

    # The cuts where two forms change order: on the pieces that remain every slot end is one region end.
    ends = plan.with_ends(np.concatenate([value0, value0 + slope0 * span], axis=1))   # first rows, then last
    refined = _refine(base, span, ends, plan.pairs)
    q_blocks = np.arange(row0, row1, block_m, dtype=np.int64)
    starts = refined if one else sorted_unique(np.concatenate([refined, q_blocks]))
    # The regions unioned at the refined pieces, their slots then extrapolated to the q_block cuts, where those
    # add many pieces; else at every piece (a numpy call costs about as much on a few dozen rows as on a few hundred).
    owners = refined if len(starts) - len(refined) > _UNION_BEFORE_CUTS else starts
    n = len(owners)
    values = at(np.concatenate([owners, last_rows(owners, row1)]))
    slots = combine_stacked(plan.intervals(values), len(plan.allow))     # [2, regions, first rows then last rows]
    if not slots:
        return np.zeros(qt + 1, np.int32), np.zeros((0, 3), np.int32)
    ends = np.array(slots)                                  # [slots, lo and hi, first rows then last rows]
    seen = ends[:, 0] < ends[:, 1]
    if (seen[:, :n] != seen[:, n:]).any():
        raise AssertionError("a piece's slots differ between its first and last rows")
    if owners is starts:
        slot_ends = [(s_lo[:n], s_hi[:n], s_lo[n:], s_hi[n:]) for s_lo, s_hi in slots]
    else:
        slot_ends = slots_at_cuts(ends.reshape(-1, 2 * n), refined, row1, starts)
    block = (starts - row0) // block_m
    return runs_of_keys(block, slot_ends, np.bincount(block, minlength=qt), kv_len, block_n, qt)


# Pieces the q_block cuts add past which runs_from_pieces unions the regions before the cuts (slots_at_cuts): at
# 4096 (27-30 more pieces) unioning after them was 10-18 us faster (bind_ab, session 22), at 32768 (about 250
# more) 0-35 us slower, at 131072 (about 1000 more) 30-220 us slower.
_UNION_BEFORE_CUTS = 128


def slots_at_cuts(ends: np.ndarray, pieces: np.ndarray, end: int, starts: np.ndarray) -> list:
    """runs_of_keys' ``(lo, hi, lo_b, hi_b)`` per slot at the first and last rows of the pieces beginning at
    ``starts``, from the slots' ends ``ends`` (int64[2 x slots, 2 x pieces]: each slot's lo then hi, at the first then
    the last rows of the coarser ``pieces``, ascending, all of them among ``starts``; the last piece of each list
    ends before ``end``).

    Invariant relied on: along each of ``pieces`` every slot end is affine in the row with slope -1, 0 or 1
    (one region end: :func:`_refine`'s cuts; :func:`plan_of` admits no steeper bound), or NONE at both rows
    (the slot empty throughout). So its slope is the sign of its last row's value less its first's (0 where
    the piece is one row), and its value at any row of the piece is extrapolated from the first row; a finer
    piece lies inside one coarse piece, its first and last rows with it."""
    n = len(pieces)
    first, slope = ends[:, :n], np.sign(ends[:, n:] - ends[:, :n])
    rows = np.concatenate([starts, last_rows(starts, end)])
    p = pieces.searchsorted(rows, side="right") - 1                   # each row's coarse piece
    at = first.take(p, axis=1) + slope.take(p, axis=1) * (rows - pieces.take(p))
    m = len(starts)
    return [(at[j, :m], at[j + 1, :m], at[j, m:], at[j + 1, m:]) for j in range(0, len(at), 2)]
