"""Rows' visible keys as flat interval lists: chunked regions enumerated, regions unioned, denies subtracted.

Classification's exact instrument for masks with chunked regions (:class:`~maskc.ir.ChunkedKeys`), where a
row's keys are a variable number of intervals. A *flat* list is three int64 arrays ``(row, lo, hi)``: key
intervals ``[lo, hi)`` of the rows ``row`` (indices into the caller's rows). :func:`row_keys` returns,
per row, the keys of the allow regions minus those of the deny regions as sorted, disjoint, non-adjacent
intervals, with work proportional to the intervals enumerated (``budget`` caps them: beyond it
:class:`TooMany` is raised and the caller falls back to sound bounds).

:func:`enumerate_keys` is the enumeration itself, for one region, at one or two points per owner: one
(rows), or a piece's two end rows (:mod:`maskc.analysis.piece_tiles` reads the second point to tell which chunks,
and which intervals, a whole piece of rows shares). Given a level-1 step (``records``:
:func:`maskc.analysis.strided.records`), at two points, it returns what that step makes of the level-1 families
where it makes something (runs of families whose intervals are translates of one another, one record each).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L
from maskc.analysis.formprog import Env, FamilyProgram, FormProgram, OwnerRuns, gathered_at
from maskc.analysis.rows import split_on_chunks
from maskc.runs import all_true, any_true, sorted_unique


class TooMany(Exception):
    """More intervals than the budget allows: the caller classifies this mask soundly instead."""


@dataclasses.dataclass(frozen=True)
class EndBounds:
    """Every level-0 bound of a two-point enumeration's intervals (:func:`enumerate_keys`), each rounded inward:
    ``of(pick)`` is ``[lows at the first point, highs at the first, lows at the second, highs at the second]``,
    lists of arrays over the intervals ``pick`` (the clip to [0, kv_len - 1] last in each list); ``peak`` is the
    most chunks one level enumerated (what its budget was checked against). ``empty`` are the intervals empty at
    one point at least (ascending); ``monotone`` (bool over ``empty``) those whose ends settle them, lo and hi
    moving in opposite directions between the points or staying (:func:`enumerate_keys`); ``pending`` the
    others and ``of_pending`` their bounds, ``of(pending)`` stacked as four int64[bounds, len(pending)] arrays:
    evaluated once for :func:`_blind_and_cuts` and kept for the caller, who reads the intervals that empty
    between the points (:func:`~maskc.analysis.piece_tiles._emptying_hulls`)."""
    of: Callable[[np.ndarray], list]
    peak: int
    empty: np.ndarray
    monotone: np.ndarray
    pending: np.ndarray
    of_pending: tuple


def values_at(params, seq_len: int, kv_len: int, head: int, batch_index: int):
    """The ``make`` that :func:`enumerate_keys` takes, for one batch element and head: ``make(q, chunks)`` is
    the :class:`~maskc.analysis.formprog.Env` of positions q (and chunk indices)."""
    def make(q, chunks: dict | None = None) -> Env:
        return Env(params, seq_len, kv_len, head, batch_index, q, chunks)
    return make


def nest_of(region: ir.RegionBounds) -> ir.ChunkedKeys:
    """The region's keys as a nest: its chunks, or for a linear region a nest of one level (k), made once and kept
    on the region (a RegionBounds is immutable)."""
    if region.chunks is not None:
        return region.chunks
    assert region.linear, "an opaque region without chunks has no exact keys"
    return ir.kept_on(region, "_linear_nest", lambda: ir.ChunkedKeys((ir.ChunkLevel(F.K, region.lower, region.upper),)))


class _NestProgram:
    """What enumerating one region's keys evaluates, compiled once (:mod:`maskc.analysis.formprog`): its guards
    and, per level, its lower and upper bounds grouped by the part of their form that reads chunk indices
    (and divisor): per group ``(moving, den, fixed)``, ``moving`` the step of the chunk-reading part in the
    level's FamilyProgram (None: bounds free of chunks), ``fixed`` the steps of the rest of each bound
    (constant included) in the owners' FormProgram."""

    def __init__(self, region: ir.RegionBounds, nest: ir.ChunkedKeys):
        self.owners = FormProgram()
        self.guards = [self.owners.lin(g.lin) for g in region.static_guards + region.guards + nest.guards]
        self.levels = []
        for level in nest.levels:
            family = FamilyProgram(self.owners)
            sides = []
            for bounds in (level.lower, level.upper):
                found: dict = {}
                for b in bounds:
                    fixed, moving = split_on_chunks(b.lin)
                    found.setdefault((ir.Lin(moving, 0) if moving else None, b.den), []).append(fixed)
                sides.append([(None if m is None else family.lin(m), den, [self.owners.lin(x) for x in fixed])
                              for (m, den), fixed in found.items()])
            self.levels.append((family, sides))
        self.level_1_var = nest.levels[1].var if len(nest.levels) > 1 else None
        form = translate_stride(nest)
        self.stride = None if form is None else self.owners.lin(form)
        # level 0's chunking (k + offset) // size, to tell where kv_len cuts the last chunk short
        level = nest.levels[0]
        self.chunking = None
        if form is not None:
            assert level.offset is not None and level.size is not None, "a nest of two levels chunks level 0"
            self.chunking = (self.owners.lin(level.offset), self.owners.lin(level.size))
        # Level 0's bounds one by one (the cut proposals read every pair): groups of one.
        family = self.levels[0][0]
        self.each = [[(None if not moving else family.lin(ir.Lin(moving, 0)), b.den, [self.owners.lin(fixed)])
                      for b in bounds for fixed, moving in [split_on_chunks(b.lin)]]
                     for bounds in (nest.levels[0].lower, nest.levels[0].upper)]


def translate_stride(nest: ir.ChunkedKeys) -> ir.Lin | None:
    """The form ``s`` (free of chunk indices) with level 0's chunk-reading bounds all ``J1 * s`` plus one and the
    same part free of J1, on both sides, none divided: then a level-1 family's level-0 intervals are translates
    of one another by ``s`` keys wherever its chunk-free bounds do not bind (:mod:`maskc.analysis.strided`). None
    where the nest has no level 1, or J1 enters otherwise (under a square, a floor, a min)."""
    if len(nest.levels) < 2:
        return None
    level, var = nest.levels[0], nest.levels[1].var
    moving = [(split_on_chunks(b.lin)[1], b.den) for b in level.lower + level.upper]
    reading = {m for m, _ in moving if m}
    if len(reading) != 1 or any(m and den != 1 for m, den in moving):
        return None
    if not all(any(split_on_chunks(b.lin)[1] for b in side) for side in (level.lower, level.upper)):
        return None
    s = L.ZERO
    for t, c in next(iter(reading)):
        if t == var:
            s = L.add(s, L.const(c))
        elif isinstance(t, ir.Product) and t.left == L.of_term(var) and not F.reads_chunks(t.right):
            s = L.add(s, L.scale(t.right, c))
        elif isinstance(t, ir.Product) and t.right == L.of_term(var) and not F.reads_chunks(t.left):
            s = L.add(s, L.scale(t.left, c))
        elif F.reads(L.of_term(t), var):
            return None
    return s


def _nest_program(region: ir.RegionBounds, nest: ir.ChunkedKeys) -> _NestProgram:
    """The region's _NestProgram (of its one chunk nest, ``nest``), kept on it (a RegionBounds is immutable)."""
    return ir.kept_on(region, "_nest_program", lambda: _NestProgram(region, nest))


def group_values(group, lower: bool, owner_values: list, family_values: list, index, fn, plus: int = 0):
    """One group's bound (:class:`_NestProgram`) at the families of ``index`` (as
    :func:`~maskc.analysis.formprog.gathered_at` takes it): the extreme ``fn`` of its
    chunk-free parts at the owners' rows, gathered, plus its chunk-reading part, rounded inward; then ``plus``
    (added to the chunk-free part at the owners' rows where nothing is divided: fewer values than families)."""
    moving, den, fixed = group
    fixed_part = owner_values[fixed[0]] if len(fixed) == 1 else functools.reduce(fn, [owner_values[i] for i in fixed])
    if plus and den == 1:
        fixed_part, plus = fixed_part + plus, 0
    v = gathered_at(fixed_part, index)
    if moving is not None:
        v = v + family_values[moving]
    if den != 1:
        v = -((-v) // den) if lower else v // den
    return v + plus if plus else v


def _extremes(sides, owner_values: list, family_values: list, index, clip: tuple | None, ends: bool = False):
    """A level's greatest lower bound and least upper bound, int64[points, families] each, at the families of
    ``index`` ([points, families] rows of the owners, or :class:`~maskc.analysis.formprog.OwnerRuns`); with
    ``ends``, the least upper bound plus 1 (the intervals' exclusive ends: min commutes with the addition, made
    on each bound where it is cheapest, :func:`group_values`).

    By groups (:class:`_NestProgram`): the greatest of a group's chunk-free parts is taken at the owners' rows,
    gathered once, and its chunk-reading part added once: ``max(ceil((a + m) / d), ceil((b + m) / d)) =
    ceil((max(a, b) + m) / d)`` (and so for floors and minima); ``clip``, the bounds (0, kv_len - 1) of the
    keys at level 0."""
    out = []
    for side, (lower, fn) in zip(sides, ((True, np.maximum), (False, np.minimum))):
        plus = 1 if ends and not lower else 0
        found = [] if clip is None else [clip[0 if lower else 1] + plus]
        found += [group_values(group, lower, owner_values, family_values, index, fn, plus) for group in side]
        # smallest first (scalars, then values equal at every point, [1, families]): one pass over [points,
        # families] for the last only, where the groups' order would spend one on each
        if len(found) > 2:
            found.sort(key=np.size)
        acc = functools.reduce(fn, found)          # a level's bounds include its chunk's range: never empty
        if np.shape(acc) != index.shape:           # equal at every point: repeated (a C call; broadcast_to is Python)
            acc = np.full(index.shape, acc) if not np.ndim(acc) else acc.reshape(1, -1).repeat(index.shape[0], axis=0)
        out.append(acc)
    return out


def _owner_extremes(sides, owner_values: list, points: int, owner: np.ndarray, clip: tuple | None,
                    ends: bool = False):
    """:func:`_extremes` of a nest's top level whose bounds read no chunk index (a one-level region's, as clear's
    ``q < text`` and ``k < text``; level 1 of clear's disc), where each family is one of the owners ``owner``
    (ascending, each once): its bounds are the owner's, so each side is reduced at the owners' rows first
    (scalars stay scalars, the clip among them) and taken at the families once: no OwnerRuns, no gather per
    group, no broadcast of a [1, families] value. ``ends``: as :func:`_extremes`'. A side that is one value for
    every family comes as a list of one array, the same for every point (callers index points only)."""
    out = []
    for side, (lower, fn) in zip(sides, ((True, np.maximum), (False, np.minimum))):
        found = [] if clip is None else [clip[0 if lower else 1]]
        for moving, den, fixed in side:
            assert moving is None, "a bound that reads no chunk index"
            v = functools.reduce(fn, [owner_values[i] for i in fixed])
            found.append(v if den == 1 else -((-v) // den) if lower else v // den)
        acc = functools.reduce(fn, found)
        if ends and not lower:
            acc = acc + 1
        if np.ndim(acc):
            # every owner a family (all kept): the owners' rows as they are, a view (nothing writes into bounds)
            rows = acc.reshape(points, -1)
            out.append(rows if len(owner) == rows.shape[1] else rows.take(owner, axis=1))
        else:                                   # two C calls, where np.full adds its Python
            row = np.empty(len(owner), np.int64)
            row.fill(acc)
            out.append([row] * points)          # one array for every point (the callers index points)
    return out


def enumerate_keys(region: ir.RegionBounds, make, points: list[np.ndarray], kv_len: int, budget: int,
                   records: Callable | None = None):
    """Every (owner, chunk) of one region and its key interval at each point.

    ``points`` are one or two int64 arrays of query positions, one entry per owner; ``make(q, chunks)``
    returns the formprog Env at positions ``q`` with chunk indices ``chunks`` (:func:`values_at`); the
    region's forms are compiled once (:class:`_NestProgram`). Returns ``(owner, lo, hi, unsure,
    blind, cut, ends)``: per enumerated interval its owner and, per point, ``[lo, hi)`` (empty where lo >= hi); with
    two points, ``unsure`` flags owners whose guards' conjunction may change between the points (not every
    guard true at both, none false at both) or whose chunk ranges differ between them (their intervals are left
    out), ``blind`` the intervals empty at both points and between (some upper bound keeps
    them below some lower bound at both points, or their width is monotone), and ``cut`` (-1 where none) for
    intervals empty at one point only and whose width is not monotone, the row where they would change from
    empty to not or back if every bound were affine between the points (see :func:`_blind_and_cuts`), and
    ``ends``, the intervals' bounds at both points (:class:`EndBounds`; None with one point).

    With two points, the points are a piece's end rows (:mod:`maskc.analysis.piece_tiles`), where lo and hi are
    monotone: where they move in opposite directions or stay (``monotone``), the width is monotone, so an
    interval empty at both points is empty between, and one empty at one point only narrows towards it (its
    keys at every row lie inside its interval at the other point): no bound is read for those.

    With two points and ``records`` (:func:`maskc.analysis.strided.records`, tried where level 0's intervals move
    with J1 only by a translate: :func:`translate_stride`), what ``records(enumeration, owner, counts, chunks,
    first, per, unsure, peak)`` returns from the level-1 families where it returns something: the same families
    as records of translates.
    """
    nest = nest_of(region)
    program = _nest_program(region, nest)
    n = len(points[0])
    owner = np.arange(n)
    unsure = np.zeros(n, bool)
    count = len(points)               # the points stacked: the owners' forms evaluated at all of them at once
    at = points[0] if count == 1 else np.concatenate(points)
    owner_values = program.owners.values(make(at))
    ok = None                                     # every guard holds, at the owners' rows point after point
    fails_at_both = None                          # two points: some guard false at both (so at every row between)
    for g in program.guards:
        holds = owner_values[g] <= 0
        if not np.ndim(holds):                    # one truth at every row
            if holds:
                continue
            holds = np.zeros(n * count, bool)
        ok = holds if ok is None else ok & holds
        if count == 2:
            fails = ~(holds[:n] | holds[n:])
            fails_at_both = fails if fails_at_both is None else fails_at_both | fails
    if ok is not None:
        at_point = ok.reshape(count, n)
        kept = at_point[0]
        if count == 2:
            # Each affine guard's truth changes once at most between the points, but their conjunction (an
            # interval of rows) may be false at both and true between (q == 1000): it is known only where every
            # guard holds at both points or one fails at both.
            sure = (at_point[0] & at_point[1]) | fails_at_both
            unsure = ~sure
            kept = kept & sure
        owner = kept.nonzero()[0]
        counts = kept.astype(np.intp)             # each owner's families (in owner order)
    else:                                         # no guard, or none false (clear's disc, `k < text`): every owner
        counts = np.ones(n, np.intp)
    enumeration = Enumeration(program, make, points, owner_values, kv_len)
    chunks: dict = {}
    peak = 0
    for depth in range(len(nest.levels) - 1, 0, -1):
        lo, hi = enumeration.extremes(depth, owner, counts, chunks)
        lo, hi = list(lo), list(hi)
        if count == 2:
            differ = (lo[0] != lo[1]) | (hi[0] != hi[1])
            if any_true(differ):                  # usual: none (a piece in one image row)
                unsure[owner[differ]] = True
                hi[0] = np.where(differ, lo[0] - 1, hi[0])
        per = np.maximum(hi[0] - lo[0] + 1, 0)
        total = int(np.add.reduce(per))
        if total > budget:
            raise TooMany(f"{total} chunks")
        peak = max(peak, total)
        if depth == 1 and records is not None and count == 2 and program.stride is not None:
            found = records(enumeration, owner, counts, chunks, lo[0], per, unsure, peak)
            if found is not None:
                return found
        # at the top level with every owner kept, each owner is one family: its chunks are its new count
        one_each = depth == len(nest.levels) - 1 and len(owner) == n
        owner, counts, chunks = expanded(nest.levels[depth].var, owner, counts, chunks, lo[0], per, one_each)
    return enumeration.level_0(owner, counts, chunks, unsure, peak)


def expanded(var, owner, counts, chunks: dict, first: np.ndarray, per: np.ndarray, one_each: bool = False):
    """``(owner, counts, chunks)`` one level down: each family repeated once per chunk of its range (``per``
    chunks of ``var`` from ``first``), the chunks numbered from its lower bound up, in the families' order.
    ``one_each``: the families are the owners themselves, one each (``counts`` all 1), so an owner's families one
    level down are its chunks, ``per``. (ndarray.repeat and np.add.accumulate: np.repeat and np.cumsum add numpy's
    Python wrappers, ~1-3 us a call.)"""
    below = np.zeros(len(per) + 1, np.int64)                # the chunks of the families before each
    np.add.accumulate(per, out=below[1:])
    total = int(below[-1])
    chunks = {v: a.repeat(per) for v, a in chunks.items()}
    chunks[var] = (first - below[:-1]).repeat(per) + np.arange(total)
    if one_each:
        return owner.repeat(per), per, chunks
    edges = np.zeros(len(counts) + 1, np.intp)              # each owner's first family, before this level
    np.add.accumulate(counts, out=edges[1:])
    return owner.repeat(per), below[edges[1:]] - below[edges[:-1]], chunks


class Enumeration:
    """One region's enumeration at ``points``: its program, the owners' values there, and the level-0 step
    (:meth:`level_0`) that :func:`enumerate_keys` and
    :meth:`~maskc.analysis.strided.StridedFamilies.expand` end with."""

    def __init__(self, program: "_NestProgram", make, points, owner_values: list, kv_len: int):
        self.program, self.make, self.points = program, make, points
        self.owner_values, self.kv_len = owner_values, kv_len

    def extremes(self, depth: int, owner, counts, chunks: dict, clip=None, ends: bool = False):
        """Level ``depth``'s bounds' extremes (lo, hi inclusive; with ``ends``, hi exclusive) [points, families],
        all points at once (forms of the chunks alone evaluated once per owner, not per point)."""
        family, sides = self.program.levels[depth]
        if depth == len(self.program.levels) - 1 and not family.steps:       # the top level: families are owners
            return _owner_extremes(sides, self.owner_values, len(self.points), owner, clip, ends)
        runs = OwnerRuns(len(self.points), counts, len(owner))
        family_values = family.values(self.make(None, chunks), self.owner_values, runs) if family.steps else []
        return _extremes(sides, self.owner_values, family_values, runs, clip, ends)

    def level_0(self, owner, counts, chunks: dict, unsure, peak: int):
        """:func:`enumerate_keys`' answer from the level-0 families ``(owner, counts, chunks)``."""
        program, make, points, owner_values, kv_len = (self.program, self.make, self.points, self.owner_values,
                                                       self.kv_len)
        count, n = len(points), len(points[0])
        lo, hi = self.extremes(0, owner, counts, chunks, (np.int64(0), np.int64(kv_len - 1)), ends=True)
        lo, hi = list(lo), list(hi)
        blind = np.zeros(len(owner), bool)
        cut = np.empty(len(owner), np.int64)
        cut.fill(-1)
        ends = None
        if count == 2:
            def bounds_at(pick):          # every bound of level 0 at both points, for the families ``pick``
                sub = owner[pick][None] + n * np.arange(count)[:, None]     # their owners' rows at each point
                family = program.levels[0][0]
                family_values = family.values(make(None, {v: c[pick] for v, c in chunks.items()}), owner_values,
                                              sub) if family.steps else []
                zero = np.zeros(sub.shape, np.int64)
                lows, highs = ([group_values(g, lower, owner_values, family_values, sub, fn) + zero for g in each]
                               + [zero + clip] for each, lower, fn, clip in zip(program.each, (True, False),
                                                                                (np.maximum, np.minimum),
                                                                                (0, kv_len - 1)))
                return [[v[p] for v in vs] for p in range(2) for vs in (lows, highs)]
            if lo[0] is lo[1] and hi[0] is hi[1]:          # one array for both points: one test
                empty = (lo[0] >= hi[0]).nonzero()[0]
            else:
                empty = (~((lo[0] < hi[0]) & (lo[1] < hi[1]))).nonzero()[0]
            monotone, pending = np.zeros(0, bool), empty
            of_pending: tuple = ()
            if len(empty):                   # usual: none
                lo_a, hi_a, lo_b, hi_b = lo[0][empty], hi[0][empty], lo[1][empty], hi[1][empty]
                monotone = (lo_b - lo_a) * (hi_b - hi_a) <= 0
                blind[empty[monotone & (lo_a >= hi_a) & (lo_b >= hi_b)]] = True
                pending = empty[~monotone]
                if len(pending):
                    of_pending = tuple(np.array(v) for v in bounds_at(pending))
                    _blind_and_cuts(points, owner, lo, hi, pending, of_pending, blind, cut)
            ends = EndBounds(bounds_at, peak, empty, monotone, pending, of_pending)
        return owner, lo, hi, unsure, blind, cut, ends


def _blind_and_cuts(points, owner, lo, hi, pick, bounds, blind, cut) -> None:
    """``blind`` and ``cut`` of :func:`enumerate_keys` (filled in place) for the intervals ``pick``, those empty
    at one point at least; ``bounds`` are every lower and upper bound of them at both points (lows at the
    first, highs at the first, lows at the second, highs at the second: int64[bounds, len(pick)]).

    An interval is non-empty where every difference ``d = upper - lower`` of one of its upper and one of its
    lower bounds is >= 0. Interpolating each difference between the two points gives, for an interval
    non-empty at the first point only, the first row where some difference turns negative, and for one
    non-empty at the second only, the first row from which all are >= 0: the row where a piece would be cut
    so that the interval is empty at both ends of each part or at neither. Only a proposal: the caller
    keeps the hull of the non-empty rows where the bounds are affine, or finds the parts' intervals again
    (interpolated, or enumerated) and checks them as any piece (bounds that are not affine there just leave
    the parts flagged).
    """
    live_a, live_b = lo[0] < hi[0], lo[1] < hi[1]
    lows_a, highs_a, lows_b, highs_b = bounds
    d_a = (highs_a[:, None] - lows_a[None]).reshape(-1, len(pick))     # every (upper, lower) pair
    d_b = (highs_b[:, None] - lows_b[None]).reshape(-1, len(pick))
    start, end = points[0][owner[pick]], points[1][owner[pick]]
    span = end - start
    never = ((d_a < 0) & (d_b < 0)).any(axis=0)
    down, up = (d_a >= 0) & (d_b < 0), (d_a < 0) & (d_b >= 0)
    step = np.where(down | up, d_b - d_a, 1)
    first_out = np.where(down, start + (d_a * span) // -step + 1, end + 1).min(axis=0)
    first_in = np.where(up, start + (-d_a * span + step - 1) // step, start).max(axis=0)
    blind[pick] = never
    row = np.where(live_a[pick], first_out, first_in)
    proposed = (live_a[pick] != live_b[pick]) & (row > start) & (row <= end)
    cut[pick[proposed]] = row[proposed]


# -- flat interval lists ----------------------------------------------------------------------------

def union(row: np.ndarray, lo: np.ndarray, hi: np.ndarray, kv_len: int):
    """Per row, the union of the intervals as sorted, disjoint, non-adjacent ones (empty ones dropped)."""
    keep = lo < hi
    if not all_true(keep):
        row, lo, hi = row[keep], lo[keep], hi[keep]
    if not len(row):
        return row, lo, hi
    width = kv_len + 1                                 # rows never touch on this line
    base = row * width
    g_lo = base + lo
    if any_true(g_lo[1:] < g_lo[:-1]):                 # often in order already
        order = g_lo.argsort(kind="stable")
        row, lo, hi, g_lo, base = row[order], lo[order], hi[order], g_lo[order], base[order]
    g_hi = base + hi
    # the furthest key reached so far (a running maximum costs ~3 ns a key: skipped where the ends ascend)
    reach = g_hi if not any_true(g_hi[1:] < g_hi[:-1]) else np.maximum.accumulate(g_hi)
    starts = np.empty(len(g_lo), bool)
    starts[:1] = True
    np.greater(g_lo[1:], reach[:-1], out=starts[1:])
    if all_true(starts):                               # disjoint and apart already
        return row, lo, hi
    first = starts.nonzero()[0]
    return row[first], lo[first], np.maximum.reduceat(g_hi, first) - base[first]


def subtract(keys, deny, kv_len: int):
    """Per row, ``keys`` minus ``deny`` (both as :func:`union` returns them)."""
    if not len(deny[0]) or not len(keys[0]):
        return tuple(keys)
    width = kv_len + 1
    a_lo, a_hi = keys[0] * width + keys[1], keys[0] * width + keys[2]
    d_lo, d_hi = deny[0] * width + deny[1], deny[0] * width + deny[2]
    at, inverse = sorted_unique(np.concatenate([a_lo, a_hi, d_lo, d_hi]), return_inverse=True)
    na, nd = len(a_lo), len(d_lo)
    in_a = np.bincount(inverse, np.concatenate([np.ones(na), -np.ones(na), np.zeros(2 * nd)]),
                       minlength=len(at)).cumsum()
    in_d = np.bincount(inverse, np.concatenate([np.zeros(2 * na), np.ones(nd), -np.ones(nd)]),
                       minlength=len(at)).cumsum()
    shown = (in_a[:-1] > 0.5) & (in_d[:-1] < 0.5)       # the segment [at[i], at[i + 1])
    seg_lo, seg_hi = at[:-1][shown], at[1:][shown]
    row = seg_lo // width
    return union(row, seg_lo - row * width, seg_hi - row * width, kv_len)


def covered_by_all(row: np.ndarray, lo: np.ndarray, hi: np.ndarray, need: np.ndarray, width: int):
    """Flat intervals of the points covered ``need[row]`` times by ``[lo, hi)``: where each of a row's
    owners (its rows of keys, or pieces of them) gives disjoint ranges and ``need[row]`` counts the owners,
    the points every owner covers."""
    if not len(row):
        return row, lo, hi
    stride = width + 1
    at, inverse = sorted_unique(np.concatenate([row * stride + lo, row * stride + hi]), return_inverse=True)
    count = np.bincount(inverse, np.concatenate([np.ones(len(row)), -np.ones(len(row))]), minlength=len(at)).cumsum()
    seg_row = at[:-1] // stride
    full = (np.abs(count[:-1] - need[seg_row]) < 0.5).nonzero()[0]
    out_row = seg_row[full]
    return union(out_row, at[full] - out_row * stride, at[full + 1] - out_row * stride, width)


def region_keys(region: ir.RegionBounds, make, q: np.ndarray, kv_len: int, budget: int):
    """The flat intervals of one exact region at the rows ``q`` (unsorted; disjoint within a row)."""
    owner, lo, hi, _, _, _, _ = enumerate_keys(region, make, [q], kv_len, budget)
    keep = lo[0] < hi[0]
    return owner[keep], lo[0][keep], hi[0][keep]


def row_keys(allow, deny, make, q: np.ndarray, kv_len: int, budget: int):
    """Per row of ``q``: the keys of the exact ``allow`` regions minus those of the exact ``deny`` ones."""
    def joined(regions):
        parts = [region_keys(r, make, q, kv_len, budget) for r in regions]
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        row, lo, hi = (np.concatenate(x) for x in zip(*parts))
        return union(row, lo, hi, kv_len)
    keys = joined(allow)
    return subtract(keys, joined(deny), kv_len) if deny else keys
