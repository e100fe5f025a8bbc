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


@dataclasses.dataclass(frozen=True)
class StridedFamilies:
    """A two-point enumeration (:func:`~maskc.analysis.keys.enumerate_keys`) whose families come in *records*, one
    per level-1 family: record i stands for ``count[i]`` families of owner ``owner[i]`` (consecutive chunks, in
    enumerate_keys' order), the j-th of them (j < count[i]) with the interval ``[lo[p][i] + j * stride[i],
    hi[p][i] + j * stride[i])`` at point p; none is empty at either point, ``stride >= 1``. Records ascend by
    owner; ``unsure`` and ``peak`` are enumerate_keys'. :meth:`expand` returns what enumerate_keys returns
    without ``records`` (computed then, by the same code)."""
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


def _whole_last_chunk(program: keys._NestProgram, owner_values: list, kv_len: int) -> bool:
    """Whether kv_len ends level 0's last chunk (``(kv_len + offset) % size == 0``, both free of q), where
    :func:`records` is tried: a chunk cut short by kv_len has its keys clipped, and the clip then binds in every
    run of translates that reaches it (the NATTEN image's short last row), so records would be refused after
    being computed. A choice of path only: both give the same families."""
    assert program.chunking is not None
    offset, size = (owner_values[i] for i in program.chunking)
    return not np.ndim(offset) and not np.ndim(size) and size > 0 and (kv_len + offset) % size == 0


def records(enumeration: Enumeration, owner, counts, chunks: dict, first, per, unsure, peak: int):
    """The level-1 families ``(owner, counts, chunks)``, with ``per`` chunks of J1 each from ``first``, as a
    :class:`StridedFamilies`, or None where one of them is not a run of translates (or there are none).

    Level 0's chunk-reading bounds are ``J1 * s`` plus parts free of J1, one group a side
    (:attr:`keys._NestProgram.stride`), so a family's lower bound at chunk ``J = first + j`` is the greatest of its
    chunk-free lower bounds F and ``m(first) + j * s`` (m: the chunk-reading group, evaluated at ``first``
    only). Where ``s >= 1`` and ``F <= m(first)``, m wins at every chunk of the range (it only grows); so the
    upper side at the range's last chunk. Checked at both points, with ``s`` equal at both and the interval
    non-empty; the upper side first (a clip to kv_len, which binds in a short last image row, fails soonest)."""
    program, owner_values = enumeration.program, enumeration.owner_values
    if not _whole_last_chunk(program, owner_values, enumeration.kv_len):
        return None
    rest = functools.partial(_expanded_rest, enumeration, owner, counts, chunks, first, per, unsure, peak)
    keep = per > 0
    if not keep.all():                  # families without chunks have no members (nor any in enumerate_keys)
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
    stride = stride[0] if np.ndim(stride) else np.full(len(owner), stride)
    if stride.min() < 1:
        return None
    family, (lower, upper) = program.levels[0]
    at_first = dict(chunks)
    at_first[program.level_1_var] = first
    family_values = family.values(enumeration.make(None, at_first), owner_values, runs) if family.steps else []
    ends = []
    for side, lower_side, fn, clip in ((upper, False, np.minimum, enumeration.kv_len - 1),
                                       (lower, True, np.maximum, 0)):
        moving = [group_values(g, lower_side, owner_values, family_values, runs, fn) for g in side if g[0] is not None]
        assert len(moving) == 1, "keys._NestProgram.stride: one chunk-reading group a side"
        free = functools.reduce(fn, [np.int64(clip)] + [group_values(g, lower_side, owner_values, family_values, runs,
                                                                      fn) for g in side if g[0] is None])
        # the chunk-free bounds bind at no chunk of the range: at its last (upper side), its first (lower)
        if (free < moving[0] + stride * (per - 1) if not lower_side else free > moving[0]).any():
            return None
        ends.append(moving[0])
    hi, lo = ends[0] + 1, ends[1]
    if (lo >= hi).any():
        return None
    lo, hi = (np.broadcast_to(v, (2, len(owner))) for v in (lo, hi))
    return StridedFamilies(owner, [lo[0], lo[1]], [hi[0], hi[1]], per, stride, unsure, peak, rest)


def _expanded_rest(enumeration: Enumeration, owner, counts, chunks, first, per, unsure, peak: int):
    """What :func:`~maskc.analysis.keys.enumerate_keys` returns from its level-1 families (a
    :class:`StridedFamilies`' expand)."""
    owner, counts, chunks = expanded(enumeration.program.level_1_var, owner, counts, chunks, first, per)
    return enumeration.level_0(owner, counts, chunks, unsure, peak)
