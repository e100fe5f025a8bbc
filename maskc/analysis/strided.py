"""Runs of translates among a two-point enumeration's families, as records: video's image rows.

Where level 0's chunk-reading bounds are all ``J1 * s`` plus parts free of J1
(:func:`~maskc.analysis.keys.translate_stride`), the level-0 intervals of a level-1 family's chunks are one
interval moved by ``j * s`` keys at its j-th chunk, wherever its chunk-free bounds (a frame's ends, the clip to
[0, kv_len)) do not bind. :func:`records`, the level-1 step that :func:`~maskc.analysis.keys.enumerate_keys`
takes, returns such runs as one record each (:class:`StridedFamilies`: 2016 records for video's 16884 families
at 32K), so that level 0 and what follows (:func:`maskc.analysis.piece_tiles._strided_runs`) run on the records.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from maskc.analysis import keys
from maskc.analysis.formprog import OwnerRuns, gathered_at
from maskc.analysis.keys import Enumeration, expanded, group_values
from maskc.runs import all_true, any_true


@dataclasses.dataclass(frozen=True)
class StridedFamilies:
    """A two-point enumeration (:func:`~maskc.analysis.keys.enumerate_keys`) whose families come in *records*: record
    i stands for ``count[i]`` families of owner ``owner[i]`` (consecutive chunks of one level-1 family, in
    enumerate_keys' order), the j-th of them (j < count[i]) with the interval ``[lo[p][i] + j * stride[i], hi[p][i] +
    j * stride[i])`` at point p; ``stride >= 1``. A record of several is non-empty at both points; a record of one
    may be a *peeled* member, its interval clamped by a chunk-free bound and possibly empty at one point or both.
    Records ascend by owner, then by chunk; ``unsure`` and ``peak`` are enumerate_keys'. :meth:`expand` returns
    what enumerate_keys returns without ``records`` (computed then, by the same code)."""
    owner: np.ndarray
    lo: list
    hi: list
    count: np.ndarray
    stride: np.ndarray
    unsure: np.ndarray
    peak: int
    _rest: Callable

    def expand(self):
        return self._rest()


def records(enumeration: Enumeration, owner, counts, chunks: dict, first, per, unsure, peak: int):
    """The level-1 families ``(owner, counts, chunks)``, with ``per`` chunks of J1 each from ``first``, as a
    :class:`StridedFamilies`, or None where they are not runs of translates (or there are none).

    Level 0's chunk-reading bounds are ``J1 * s`` plus parts free of J1, one group a side
    (:attr:`keys._NestProgram.stride`), so a family's lower bound at chunk ``J = first + j`` is the greatest of its
    chunk-free lower bounds F and ``m(first) + j * s`` (m: the chunk-reading group, evaluated at ``first``
    only). With ``s >= 1`` (equal at both points), m + j * s grows with j, so F binds (exceeds it) at a prefix of
    the range's chunks, and on the upper side at a suffix (a clip to kv_len in a short last image row). Where F
    binds nowhere, a family is one record; where it binds, the members it binds at are peeled off as records of
    one, clamped (:func:`_peeled`), and the rest stays one record if its interval is non-empty."""
    program, owner_values = enumeration.program, enumeration.owner_values
    if _clipped_at_one_end(program, owner_values, enumeration.kv_len, owner, first, per):
        return None
    rest = functools.partial(_expanded_rest, enumeration, owner, counts, chunks, first, per, unsure, peak)
    keep = per > 0
    if not all_true(keep):                  # families without chunks have no members (nor any in enumerate_keys)
        owner, first, per = owner[keep], first[keep], per[keep]
        chunks = {v: a[keep] for v, a in chunks.items()}
        counts = np.bincount(owner, minlength=len(counts))
    if not len(owner):
        return None
    runs = OwnerRuns(2, counts, len(owner))
    assert program.stride is not None
    stride = gathered_at(owner_values[program.stride], runs)          # a scalar, or [1 or 2, records]
    if np.ndim(stride) and len(stride) == 2 and stride[0].tobytes() != stride[1].tobytes():
        return None                                        # the translate moves between the points
    if not np.ndim(stride):                                # usual: one stride (an image's width)
        if stride < 1:
            return None
        value, stride = stride, np.empty(len(owner), np.int64)
        stride.fill(value)
    elif stride[0].min() < 1:
        return None
    else:
        stride = stride[0]
    family, (lower, upper) = program.levels[0]
    at_first = dict(chunks)
    at_first[program.level_1_var] = first
    family_values = family.values(enumeration.make(None, at_first), owner_values, runs) if family.steps else []
    sides = []                          # per side: m at the range's first chunk, and F (scalars or [1 or 2, records])
    for side, lower_side, fn, clip in ((lower, True, np.maximum, 0),
                                       (upper, False, np.minimum, enumeration.kv_len - 1)):
        moving = [group_values(g, lower_side, owner_values, family_values, runs, fn) for g in side if g[0] is not None]
        assert len(moving) == 1, "keys._NestProgram.stride: one chunk-reading group a side"
        free = functools.reduce(fn, [np.int64(clip)] + [group_values(g, lower_side, owner_values, family_values, runs,
                                                                      fn) for g in side if g[0] is None])
        sides.append((moving[0], free))
    (m_lo, f_lo), (m_hi, f_hi) = sides
    # where F binds: at the range's first chunk (lower side), at its last (upper side); at one point at least
    low, high = f_lo > m_lo, f_hi < m_hi + stride * (per - 1)
    if any_true(low) or any_true(high):
        if _at_one_point(low) or _at_one_point(high):
            # a peeled member clamped at one end of its piece only (video's short last image row, seen from rows
            # left of the clip and right of it) empties between its ends as a min of bounds, not monotone: its
            # piece is refused (_settled_peeled) after the records are made. A choice of path only.
            return None
        return _peeled(owner, per, stride, sides, low, high, unsure, peak, rest)
    if any_true(m_hi + 1 - m_lo <= 0):
        return None
    return StridedFamilies(owner, _two(m_lo), _two(m_hi + 1), per, stride, unsure, peak, rest)


def _clipped_at_one_end(program: keys._NestProgram, owner_values: list, kv_len: int, owner, first, per) -> bool:
    """Whether kv_len cuts level 0's last chunk short (``(kv_len + offset) % size``, both free of q) and the clip to
    kv_len binds at one end row of a piece but not the other, in the member of that chunk of a level-1 family
    reaching it (chunks ``first`` to ``first + per - 1``): its upper end there is its owners' chunk-free part of
    level 0's chunk-reading upper bounds plus ``J1 * s`` (:func:`~maskc.analysis.keys.translate_stride`). Such
    a member empties between its ends as a min of bounds (video's short last image row, seen from a piece that
    crosses the clip): records would be refused after being made (:func:`_at_one_point`), at the cost of most
    of them, so they are not tried. Read off the owners' values, a dozen operations. A choice of path only."""
    assert program.chunking is not None and program.stride is not None
    offset, size = (owner_values[i] for i in program.chunking)
    if np.ndim(offset) or np.ndim(size) or size <= 0 or (kv_len + offset) % size == 0:
        return False                          # the last chunk whole (or a chunking read at q: not told here)
    j_last = (kv_len - 1 + offset) // size
    _, (lower, upper) = program.levels[0]
    fixed = next(f for moving, _, f in upper if moving is not None)
    reach = functools.reduce(np.minimum, [owner_values[i] for i in fixed])
    if not np.ndim(reach):
        return False
    binds = reach > kv_len - 1 - j_last * owner_values[program.stride]
    n = len(binds) // 2                                   # the owners' rows at the first point, then the second
    differ = binds[:n] != binds[n:]
    return bool(any_true(differ) and any_true(differ[owner[first + per - 1 >= j_last]]))


def _peeled(owner, per, stride, sides, low, high, unsure, peak: int, rest):
    """:func:`records`' answer where a chunk-free bound binds at some members (``low``, ``high``: F binds at the
    range's first chunk, at its last, per point): per record, its first ``head`` members (``m_lo + j * s < f_lo``
    at either point: j below ``ceil((f_lo - m_lo) / s)``) and its last ``tail`` (``m_hi + j * s > f_hi``: j above
    ``floor((f_hi - m_hi) / s)``) as records of one, clamped, ``[max(f_lo, m_lo + j s), min(f_hi, m_hi + j s) +
    1)``; the members between as one record, unclamped (None where they are empty). None where more members are
    peeled than there are records (their arrays would outgrow the families')."""
    (m_lo, f_lo), (m_hi, f_hi) = sides
    head, tail = np.zeros(len(owner), np.int64), np.zeros(len(owner), np.int64)
    # worked out on the records where F binds only (few: the last image row's)
    at = _most(low).nonzero()[0]
    if len(at):
        head[at] = np.minimum(np.maximum(_most(-((_at(m_lo, at) - _at(f_lo, at)) // stride[at])), 0), per[at])
    at = _most(high).nonzero()[0]
    if len(at):
        keep = _least((_at(f_hi, at) - _at(m_hi, at)) // stride[at] + 1)      # members up to f_hi, at both points
        tail[at] = np.maximum(per[at] - np.maximum(keep, head[at]), 0)
    middle = per - head - tail
    size = head + 1 + tail                                # record i's entries: head, one record, tail
    total = int(size.sum())
    if total > 2 * len(owner) or any_true((middle > 0) & _most(m_hi + 1 - m_lo <= 0)):
        return None
    src = np.repeat(np.arange(len(owner)), size)          # each entry's record, entries in member order
    rank = np.arange(total) - np.repeat(size.cumsum() - size, size)
    first = head[src]
    one = rank != first                                   # a peeled member (the others: the middle records)
    j = np.where(rank <= first, rank, per[src] - (size[src] - rank))      # the entry's first member
    step = stride[src]
    lo = _at(m_lo, src) + j * step
    hi = _at(m_hi, src) + (j * step + 1)
    lo = np.where(one, np.maximum(lo, _at(f_lo, src)), lo)
    hi = np.where(one, np.minimum(hi, _at(f_hi, src) + 1), hi)
    count = np.where(one, 1, middle[src])
    if any_true(count == 0):                                # every member peeled: no middle record
        keep = count > 0
        src, lo, hi, count, step = src[keep], lo[..., keep], hi[..., keep], count[keep], step[keep]
    return StridedFamilies(owner[src], _two(lo), _two(hi), count, step, unsure, peak, rest)


def _at_one_point(binds) -> bool:
    """Whether a bound binds at one point but not the other for some record (``binds``: [1 or 2, records])."""
    return np.ndim(binds) == 2 and len(binds) == 2 and binds[0].tobytes() != binds[1].tobytes()


def _most(v):
    """The greatest over the points of per-record values ([points, records], or one row as it is)."""
    return v.max(axis=0) if np.ndim(v) == 2 else v


def _least(v):
    """The least over the points of per-record values ([points, records], or one row as it is)."""
    return v.min(axis=0) if np.ndim(v) == 2 else v


def _at(v, src):
    """Per-record values (a scalar, [records] or [points, records]) at the records ``src``."""
    return v.take(src, axis=-1) if np.ndim(v) else v          # take: a third of [:, src]'s cost on [2, n]


def _two(v) -> list:
    """Per-record values ([records], or [1 or 2 points, records]) as a list of two arrays, one per point."""
    return [v[0], v[-1]] if np.ndim(v) == 2 else [v, v]


def _expanded_rest(enumeration: Enumeration, owner, counts, chunks, first, per, unsure, peak: int):
    """What :func:`~maskc.analysis.keys.enumerate_keys` returns from its level-1 families (a
    :class:`StridedFamilies`' expand)."""
    owner, counts, chunks = expanded(enumeration.program.level_1_var, owner, counts, chunks, first, per)
    return enumeration.level_0(owner, counts, chunks, unsure, peak)
