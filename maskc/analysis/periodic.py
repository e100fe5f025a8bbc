"""Families of translated pieces, proved: a two-level region enumerated on a few owners where a run of them has
one owner's families moved (clear's image rows: the disc seen from image row y + 1 is the one seen from row y
moved by one chunk row, 128 keys).

:func:`families`, the level-1 step that :func:`~maskc.analysis.keys.enumerate_keys` takes (as it takes
:func:`maskc.analysis.strided.records`), looks for the longest run of consecutive owners (pieces) over which
level 1's first chunk and chunk count and every owners' value that level 0 reads move by one step from owner to
owner (at both end rows, the same step), and proves from level 0's compiled FamilyProgram (:func:`step_moves`)
that every level-0 bound then moves by one K keys from owner to owner. Only the clip to [0, kv_len - 1] does not
move; the run's last owner, enumerated, settles it (:class:`PeriodicFamilies`). Level 0 is enumerated on the owners
outside the run and on its first and last only: at 32K, clear's 7696 disc families come from 33 owners' 938.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from maskc import ir
from maskc.analysis.formprog import Shape
from maskc.analysis.keys import Enumeration, expanded
from maskc.runs import any_true

# a run shorter than this saves less than its proof costs (the first and last owners are enumerated anyway)
MIN_RUN = 4


@dataclasses.dataclass(frozen=True)
class PeriodicFamilies:
    """A two-point enumeration (:func:`~maskc.analysis.keys.enumerate_keys`' answer) written as ``kept``, that answer
    for every owner but those strictly inside a run (owners numbered as in the whole; the run's inner owners have no
    families in it), and the run: owners ``first + i`` (0 <= i < length) have the families of owner ``first``
    (``kept``'s families ``at`` .. ``at + size``, followed there by owner ``first + length - 1``'s) with their
    intervals moved by ``i * shift`` keys at both points, in the same order. No family of ``kept`` is empty at
    either point. :meth:`expand` returns the whole answer (the same arrays enumerate_keys returns)."""
    kept: tuple
    first: int
    length: int
    shift: int
    at: int
    size: int
    whole: Callable                  # enumerate_keys' answer worked out in full (its EndBounds.of, if asked)

    @property
    def families(self) -> int:
        """How many families the whole answer has."""
        return len(self.kept[0]) + (self.length - 2) * self.size

    def expand(self):
        owner, lo, hi, unsure, blind, cut, ends = self.kept
        copies = self.length - 2
        end = self.at + self.size
        moves = np.arange(1, copies + 1, dtype=np.int64)[:, None] * self.shift

        def spliced(x, inside):
            return np.concatenate([x[:end], inside, x[end:]])

        def moved(x):
            return spliced(x, (x[self.at:end] + moves).ravel())
        inside_owner = np.arange(self.first + 1, self.first + 1 + copies).repeat(self.size)
        none = np.zeros(copies * self.size, bool)
        unset = np.empty(copies * self.size, np.int64)
        unset.fill(-1)
        whole = self.whole
        return (spliced(owner, inside_owner), [moved(v) for v in lo], [moved(v) for v in hi], unsure,
                spliced(blind, none), spliced(cut, unset), dataclasses.replace(ends, of=lambda pick: whole()[-1].of(pick)))


def step_moves(shapes: list[Shape], owner_move: dict, chunk_move: dict) -> list[int | None]:
    """Per step of a FamilyProgram (its ``shapes``: :data:`~maskc.analysis.formprog.Shape`), the move ``m`` such that
    the step's value at a family of owner ``o + i`` whose chunk indices are a family of owner ``o``'s moved by ``i *
    chunk_move[var]`` is its value there plus ``i * m``, given that every owners' value that steps gather, step j,
    is its value at owner o plus ``i * owner_move[j]``; None where that is not proved. A chunk index moves as told;
    a gathered value as told; a sum as the sum of its parts' moves times their coefficients (int64 sums wrap alike
    in any order); any other step (a square, root, floor, extreme, product) only by 0, where every input moves by
    0 (the same inputs, the same value)."""
    out: list[int | None] = []
    for shape in shapes:
        kind = shape[0]
        move: int | None
        if kind == "chunk":
            move = chunk_move.get(shape[1])
        elif kind == "owner":
            move = owner_move[shape[1]]
        elif kind == "sum":
            _, at, parts = shape
            move = 0 if at is None else owner_move[at]
            for i, c in parts:
                if move is None or out[i] is None:
                    move = None
                    break
                move += c * out[i]
        elif kind == "other":
            move = 0 if all(out[i] == 0 for i in shape[1]) else None
        else:
            move = None
        out.append(move)
    return out


def level_0_reads(program) -> tuple[int, ...]:
    """The owners' steps that level 0 of a two-level ``program`` (:class:`~maskc.analysis.keys._NestProgram`)
    reads: those its FamilyProgram gathers and each bound group's chunk-free parts; kept on the program."""
    def reads() -> tuple[int, ...]:
        family, sides = program.levels[0]
        found = {shape[1] for shape in family.shapes if shape[0] in ("owner", "sum") and shape[1] is not None}
        found.update(i for side in sides for _, _, fixed in side for i in fixed)
        return tuple(sorted(found))
    return ir.kept_on(program, "_level_0_reads", reads)


def _widest_run(per: np.ndarray) -> tuple[int, int]:
    """``(r, length)``: the longest run of consecutive owners with the most chunks (``per``), the first of the
    longest; the candidate run, where a level-1 range is clipped at the ends of the keys (clear's image rows near
    the image's top and bottom) and whole between."""
    flags = per == per.max()
    at = flags.nonzero()[0]
    r, last = int(at[0]), int(at[-1])
    if last - r + 1 == len(at):                       # usual: one run
        return r, len(at)
    edges = np.diff(np.concatenate([[False], flags, [False]]).view(np.int8))
    starts, stops = (edges == 1).nonzero()[0], (edges == -1).nonzero()[0]
    k = int((stops - starts).argmax())
    return int(starts[k]), int(stops[k] - starts[k])


def families(enumeration: Enumeration, owner, counts, chunks: dict, first, per, unsure, peak: int):
    """The level-1 families of a two-level region at two points (``owner``: every owner, ``per`` chunks of J1 each from
    ``first``) as a :class:`PeriodicFamilies`, or None where no run of at least :data:`MIN_RUN` owners is proved.

    The proof, for a run of owners ``r .. r + L - 1``: every owners' value level 0 reads (:func:`level_0_reads`) is
    ``v(r) + i s_v`` at owner ``r + i``, at both points (one ``s_v``), ``first`` is ``first(r) + i c`` and ``per``
    constant, no owner of the run unsure (checked on the values); then, family j of owner ``r + i`` having chunk
    ``first(r) + i c + j``, each level-0 step moves by ``i`` times its :func:`step_moves` move, and where every
    bound group (its chunk-free part, plus its chunk-reading part, rounded by a divisor the move is a multiple of)
    moves by one K, a side's extreme of them does too. The clip (0 below, kv_len - 1 above) does not move: a lower
    end is ``max(0, G + i K)``, which is ``max(0, G) + i K`` at every i in [0, L) exactly where it is at i = L - 1
    (if ``G < 0 <= max(0, G + (L - 1) K)``, the two sides differ there unless K = 0), and so for upper ends: the
    last owner's intervals are compared with the first's moved by ``(L - 1) K``."""
    program, owner_values = enumeration.program, enumeration.owner_values
    n = len(enumeration.points[0])
    if len(program.levels) != 2 or chunks or len(owner) != n or n < MIN_RUN:
        return None
    r, length = _widest_run(per)
    if length < MIN_RUN or per[r] <= 0 or any_true(unsure[r:r + length]):
        return None
    reads = level_0_reads(program)
    moving = [i for i in reads if np.ndim(owner_values[i])]
    # first, per, then each moving value at the first point and at the second: each one step from owner to owner
    values = np.concatenate([first, per] + [owner_values[i] for i in moving]).reshape(-1, n)[:, r:r + length]
    step = values[:, 1:] - values[:, :-1]
    if any_true(step[:, 1:] != step[:, :-1]):
        return None
    s = step[:, 0].tolist()
    at_first, at_second = s[2::2], s[3::2]
    if s[1] != 0 or at_first != at_second:
        return None
    owner_move = dict.fromkeys(reads, 0)
    owner_move.update(zip(moving, at_first))
    family, sides = program.levels[0]
    moves = step_moves(family.shapes, owner_move, {program.level_1_var: s[0]})
    shift = None
    for side in sides:
        for chunk_part, den, fixed in side:
            found = {owner_move[i] for i in fixed}
            total = found.pop() if len(found) == 1 else None
            if chunk_part is not None and total is not None:
                total = None if moves[chunk_part] is None else total + moves[chunk_part]
            if total is None or total % den or (shift is not None and total // den != shift):
                return None
            shift = total // den
    if shift is None:
        return None
    kept_per = per.copy()
    kept_per[r + 1:r + length - 1] = 0
    kept = enumeration.level_0(*expanded(program.level_1_var, owner, counts, chunks, first, kept_per, True), unsure,
                               peak)
    _, lo, hi, _, _, _, ends = kept
    if len(ends.empty):
        return None
    at, size = int(np.add.reduce(kept_per[:r])), int(per[r])
    ours, last = slice(at, at + size), slice(at + size, at + 2 * size)
    ends_of = (lo[0], hi[0], lo[1], hi[1])
    if any_true(np.concatenate([v[last] for v in ends_of]) - np.concatenate([v[ours] for v in ends_of])
                != (length - 1) * shift):
        return None
    whole = functools.partial(_whole, enumeration, owner, counts, chunks, first, per, unsure, peak)
    return PeriodicFamilies(kept, r, length, shift, at, size, whole)


def _whole(enumeration: Enumeration, owner, counts, chunks, first, per, unsure, peak: int):
    """enumerate_keys' answer from its level-1 families, every owner's enumerated."""
    return enumeration.level_0(*expanded(enumeration.program.level_1_var, owner, counts, chunks, first, per, True),
                               unsure, peak)

