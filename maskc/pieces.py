"""Tile runs from q-pieces: for masks whose regions are affine in q between segment boundaries.

A *piece* is a run of rows inside one q_block with no segment boundary inside it: there every bound of
the region is ``q * a + c`` with ``a`` in {-1, 0, 1} and ``c`` constant, so each row's interval is known
from the piece's first and last rows. With lower bounds all of one slope sign (likewise upper bounds):

* ``lo`` and ``hi`` are monotone, so their extremes over the piece are at its ends;
* ``hi - lo`` is concave (a min of affine functions minus a max of them), so a piece whose end rows see
  keys has every row seeing keys (one blind at both ends is classified only when provably blind);
* consecutive rows' intervals shift by at most one key, so they overlap or abut: the piece's touched key
  blocks are the hull of its end rows', its covered ones the intersection.

q_blocks then combine their pieces as classify combines rows (hull of touched, intersection of covered),
with the same check that the hulls chain without a hole; several regions combine as classify's slots do,
exact where their hulls in a q_block are disjoint. The work is O(pieces), not O(rows); q_blocks outside
these conditions are flagged and go back to the row-by-row classification.
"""
from __future__ import annotations

import numpy as np

from . import ir
from . import linear as L
from .kernel_ir import BatchParams
from .rows import RowValues

_PIECEWISE_LEAVES = (ir.ParamRef, ir.Builtin, ir.SegAttr, ir.SegValue)


def _affine_between_segments(lin: ir.Lin) -> bool:
    """q enters only as ``±q`` and through segment attributes at q; no k, no non-linear term."""
    for t, c in lin.terms:
        if t == L.Q:
            if abs(c) > 1:
                return False
        elif not (isinstance(t, _PIECEWISE_LEAVES) and getattr(t, "pos", "q") == "q"):
            return False
    return True


def _qualifies(region: ir.RegionBounds) -> bool:
    if not region.linear or any(b.den != 1 for b in region.lower + region.upper):
        return False
    if any(g.lin.coef(L.Q) != 0 or not _affine_between_segments(g.lin) for g in region.guards):
        return False
    for bounds in (region.lower, region.upper):
        if not all(_affine_between_segments(b.lin) for b in bounds):
            return False
        if len({b.lin.coef(L.Q) for b in bounds} - {0}) > 1:     # mixed slope signs: not monotone
            return False
    return True


def piecewise_regions(mask: ir.RangeMask) -> tuple[ir.RegionBounds, ...] | None:
    """The mask's allow regions when every one qualifies for piecewise classification, else None."""
    if mask.deny or mask.uses_head or not all(_qualifies(r) for r in mask.allow):
        return None
    return mask.allow


def _segments_read(region: ir.RegionBounds) -> set[str]:
    lins = [g.lin for g in region.guards + region.static_guards] + [b.lin for b in region.lower + region.upper]
    return {t.seg for lin in lins for t, _ in lin.terms if isinstance(t, (ir.SegAttr, ir.SegValue))}


def piece_hulls(region: ir.RegionBounds, params: BatchParams, b: int, head: int, seq_len: int, kv_len: int,
                block_m: int, block_n: int):
    """Per q_block (h0, h1, f0, f1) hulls as classify's slots give them, and which q_blocks this cannot
    classify exactly (``bad``: they go back to the rows)."""
    qt, kt = -(-seq_len // block_m), -(-kv_len // block_n)
    starts = np.arange(0, seq_len, block_m, dtype=np.int64)
    segments = sorted(_segments_read(region))
    if segments:                                               # segment boundaries cut q_blocks
        starts = np.unique(np.concatenate([starts] + [params.segment(s).bounds for s in segments]))
        starts = starts[(starts >= 0) & (starts < seq_len)]
    ends = np.append(starts[1:], seq_len) - 1                  # each piece's last row
    n = len(starts)
    rows = RowValues(params, seq_len, kv_len, head, b, np.concatenate([starts, ends]))
    if any(rows.lin(g.lin) > 0 for g in region.static_guards):
        return np.zeros((4, qt), np.int64), np.zeros(qt, bool)    # the region does not exist here
    at_ends = lambda lin: np.broadcast_to(rows.lin(lin), (2 * n,))   # a constant form gives a scalar
    lowers = [np.zeros(2 * n, np.int64)] + [at_ends(bound.lin) for bound in region.lower]
    uppers = [np.full(2 * n, kv_len - 1, np.int64)] + [at_ends(bound.lin) for bound in region.upper]
    lo, hi = np.maximum.reduce(lowers), np.minimum.reduce(uppers) + 1
    ok = np.ones(2 * n, bool)
    for g in region.guards:                                    # constant within a piece
        ok &= rows.lin(g.lin) <= 0
    seen = ok & (lo < hi)
    block = starts // block_m
    unsure = seen[:n] != seen[n:]                              # a piece sees keys at one end only
    # A piece blind at both ends may still see keys in between (concave hi - lo can peak inside). It is
    # surely blind if its guard fails, or if one upper bound is below one lower bound at both ends
    # (their difference is affine, so then it is negative throughout).
    blind = ~ok[:n]
    for u in uppers:
        for l in lowers:
            blind |= (u[:n] < l[:n]) & (u[n:] < l[n:])
    unsure |= ~seen[:n] & ~blind
    bad = np.zeros(qt, bool)
    bad[block[unsure]] = True
    live = seen[:n] & ~unsure
    lo_a, lo_b, hi_a, hi_b = lo[:n], lo[n:], hi[:n], hi[n:]
    t0 = np.minimum(lo_a, lo_b) // block_n
    t1 = -(-np.maximum(hi_a, hi_b) // block_n)
    c0 = -(-np.maximum(lo_a, lo_b) // block_n)
    top = np.minimum(hi_a, hi_b)
    c1 = np.where(top >= kv_len, kt, top // block_n)
    if n > qt:   # some q_block has several pieces: they must chain (overlap or abut), else a hole
        idx = np.nonzero(live)[0]
        a, c = idx[:-1], idx[1:]
        hole = (block[a] == block[c]) & ((t0[c] > t1[a]) | (t0[a] > t1[c]))
        bad[block[a[hole]]] = True
    big = np.int64(1) << 40
    first = np.flatnonzero(np.diff(block, prepend=-1))        # every q_block starts a piece: qt groups
    h0 = np.minimum.reduceat(np.where(live, t0, big), first)
    h1 = np.maximum.reduceat(np.where(live, t1, -1), first)
    f0 = np.maximum.reduceat(c0, first)
    f1 = np.minimum.reduceat(c1, first)
    all_live = np.logical_and.reduceat(live, first)
    some = h1 >= 0
    return np.stack([np.where(some, h0, 0), np.where(some, h1, 0),
                     np.where(all_live & some, f0, 0), np.where(all_live & some, f1, 0)]), bad
