"""Forms compiled once into flat lists of numpy steps: the per-bind evaluation of a mask's bounds.

:class:`~maskc.analysis.rows.RowValues` walks a form's terms on every evaluation (memo lookups, a type
dispatch per term), which costs more than the numpy work on the few hundred rows of a piece table.
:class:`FormProgram` does the walk once per mask: every distinct term and form (by value) becomes one step,
children before parents, and a bind runs the steps in order, each a closure doing its numpy operations.
:class:`FamilyProgram` does the same for forms that read chunk indices (:class:`~maskc.ir.ChunkVar`),
evaluated per *family* (an owner's row and a chunk tuple) with their chunk-free parts taken from a
FormProgram's values at the owners' rows, gathered: what RowValues does with ``gather``. Values are the
ones RowValues computes (the same operations in int64, exact under bind's width proofs).

Forms that read k (:class:`Unsupported`) are not compiled: their callers keep RowValues.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from maskc import ir
from maskc.analysis import bitops
from maskc.analysis import forms as F
from maskc.analysis.rows import isqrt, seg_bound, segment_attr, segment_slot, split_on_chunks

# A step: (values so far, gathered(i): step i of the owners' program at the families, env) -> value
Step = Callable[[list, Callable[[int], object], "Env"], object]


class Unsupported(Exception):
    """A form that reads k: evaluated by RowValues instead."""


class Env:
    """What a run reads besides the steps' values: positions q, one batch element's parameters, the
    builtins, each segment table's slots at q (looked up once per run), and for a FamilyProgram the chunk
    indices of the families."""

    def __init__(self, params, seq_len: int, kv_len: int, head: int, batch_index: int, q: np.ndarray,
                 chunks: dict | None = None):
        self.params, self.q, self.chunks = params, q, chunks or {}
        self.builtins = {"seq_len": seq_len, "kv_len": kv_len, "h": head, "b": batch_index}
        self.extent = max(seq_len, kv_len)
        self._slots: dict = {}

    def slot(self, seg: str):
        hit = self._slots.get(seg)
        if hit is None:
            table = self.params.segment(seg)
            hit = self._slots[seg] = (table, segment_slot(table, self.q))
        return hit


def _summed(const: int, parts, first: Callable | None = None) -> Step:
    """RowValues.lin's sum: ``first`` (a value, else the constant) plus each (step, coefficient) of
    ``parts``; no leading zero added, no negation. A constant (no parts) is made once, here."""
    if not parts and first is None:
        value = np.int64(const)
        return lambda v, g, e: value

    def step(v, g, e):
        out = first(v, g, e) if first is not None else (None if const == 0 else np.int64(const))
        for i, c in parts:
            x = v[i]
            if out is None:
                out = x if c == 1 else -x if c == -1 else c * x
            else:
                out = out + x if c == 1 else out - x if c == -1 else out + c * x
        return np.int64(0) if out is None else out
    return step


def _compound(t, inner: list[int]) -> Step:
    """The step of a term computed from its inner forms' steps (forms.inner_lins)."""
    if isinstance(t, ir.Square):
        i = inner[0]
        return lambda v, g, e: v[i] * v[i]
    if isinstance(t, ir.Product):
        i, j = inner
        return lambda v, g, e: v[i] * v[j]
    if isinstance(t, ir.Floor):
        i, j = inner
        divide = np.floor_divide if t.op == "//" else np.mod
        return lambda v, g, e: divide(v[i], v[j])
    if isinstance(t, ir.Extreme):
        pick = np.minimum if t.fn == "min" else np.maximum

        def extreme(v, g, e):
            out = v[inner[0]]
            for i in inner[1:]:
                out = pick(out, v[i])
            return out
        return extreme
    if isinstance(t, ir.Root):
        i = inner[0]
        return lambda v, g, e: isqrt(v[i])
    if isinstance(t, ir.Bits):
        i, j = inner
        op = t.op
        return lambda v, g, e: bitops.apply(op, v[i], v[j])
    if isinstance(t, ir.Lookup):
        i, name = inner[0], t.table
        return lambda v, g, e: e.params.table(name).values[v[i]]
    if isinstance(t, ir.SegBound):
        i, seg = inner[0], t.seg
        return lambda v, g, e: seg_bound(e.params.segment(seg), v[i])
    raise TypeError(t)


class _Steps:
    def __init__(self):
        self.steps: list[Step] = []
        self._index: dict = {}

    def _add(self, key, step: Step) -> int:
        self._index[key] = len(self.steps)
        self.steps.append(step)
        return self._index[key]

    def bound(self, item: ir.KBound, lower: bool) -> int:
        """A bound rounded inward (up for a lower bound, down for an upper one)."""
        if item.den == 1:
            return self.lin(item.lin)
        key = ("bound", item.lin, item.den, lower)
        if key not in self._index:
            i, den = self.lin(item.lin), item.den
            self._add(key, (lambda v, g, e: -((-v[i]) // den)) if lower else (lambda v, g, e: v[i] // den))
        return self._index[key]

    def lin(self, lin: ir.Lin) -> int:
        raise NotImplementedError


class FormProgram(_Steps):
    """The steps that evaluate forms of q at positions ``env.q``. ``items`` (optional): ``(form, None)`` or
    ``(bound, lower)`` pairs whose values :meth:`run` returns, in order (arrays, or int64 scalars for items
    free of q); more steps may be added later (:meth:`lin`, :meth:`bound`) and read from :meth:`values`."""

    def __init__(self, items=()):
        super().__init__()
        self._by_terms: dict = {}             # a form's terms -> (its step, its constant): the first form of them
        self.outputs = [self.lin(item) if lower is None else self.bound(item, lower) for item, lower in items]

    def values(self, env: Env) -> list:
        """Every step's value."""
        values: list = []
        for step in self.steps:
            values.append(step(values, _no_gather, env))
        return values

    def run(self, env: Env) -> list:
        values = self.values(env)
        return [values[i] for i in self.outputs]

    def lin(self, lin: ir.Lin) -> int:
        key = ("lin", lin)
        if key not in self._index:
            # a form of several terms that an earlier one has, constants apart: that one's value plus the difference
            # (one numpy call, not one a term; int64 sums wrap alike in any order)
            same = self._by_terms.get(lin.terms) if len(lin.terms) > 1 else None
            if same is not None:
                i, shift = same
                delta = np.int64(lin.const - shift)
                self._add(key, lambda v, g, e: v[i] + delta)
            else:
                self._add(key, _summed(lin.const, [(self.term(t), c) for t, c in lin.terms]))
                self._by_terms[lin.terms] = (self._index[key], lin.const)
        return self._index[key]

    def term(self, t) -> int:
        key = ("term", t)
        if key not in self._index:
            self._add(key, self._term(t))
        return self._index[key]

    def _term(self, t) -> Step:
        if isinstance(t, ir.Pos):
            if t.which != "q":
                raise Unsupported(t)
            return lambda v, g, e: e.q
        if isinstance(t, ir.Builtin):
            name = t.name
            return lambda v, g, e: np.int64(e.builtins[name])
        if isinstance(t, ir.ParamRef):
            name = t.name
            return lambda v, g, e: np.int64(e.params.int(name))
        if isinstance(t, (ir.SegAttr, ir.SegValue)):
            if t.pos != "q":
                raise Unsupported(t)
            seg = t.seg
            if isinstance(t, ir.SegValue):
                array = t.array
                return lambda v, g, e: segment_attr(e.slot(seg)[0], e.slot(seg)[1], "value", e.extent, array)
            attr = t.attr
            return lambda v, g, e: segment_attr(e.slot(seg)[0], e.slot(seg)[1], attr, e.extent)
        if isinstance(t, ir.ChunkVar):
            raise Unsupported(t)
        return _compound(t, [self.lin(x) for x in F.inner_lins(t)])


@dataclasses.dataclass(frozen=True)
class OwnerRuns:
    """Families that come in their owners' order, ``counts[o]`` of them for owner o (``families`` in all), at
    ``points`` points: the index [points, families] into the owners' rows (point after point) that this
    stands for ascends within each point, so np.repeat does a gather's work (at a third of its cost)."""
    points: int
    counts: np.ndarray
    families: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.points, self.families


def gathered_at(x, index: np.ndarray | OwnerRuns):
    """Owners' values ``x`` (the owners' rows point after point) at the families of ``index`` [points,
    families] (or :class:`OwnerRuns`): [1, families] where ``x`` is equal at every point (what is computed
    from it alone is then computed once for all points), a scalar as it is."""
    if not np.ndim(x):
        return x
    points = index.shape[0] if not isinstance(index, OwnerRuns) else index.points
    same = points > 1 and _points_equal(x, points)
    if isinstance(index, OwnerRuns):
        return x.reshape(1 if same else points, -1)[:, :len(x) // points].repeat(index.counts, axis=1)
    return x[index[:1]] if same else x[index]


def _points_equal(x: np.ndarray, points: int) -> bool:
    """Whether the owners' values ``x`` (int, the owners' rows point after point) are equal at every point; for
    two points, by comparing the halves' bytes (equal bytes are equal integers): one memcmp, where ``==`` and
    ``all()`` cost four times as much on the few hundred owners of a piece table, at every gather."""
    n = len(x) // points
    if points == 2:
        return x[:n].tobytes() == x[n:].tobytes()
    return bool((x.reshape(points, -1) == x[:n]).all())


def _no_gather(i: int):
    raise AssertionError("a FormProgram's steps read no gathered values")


class FamilyProgram(_Steps):
    """Steps that evaluate forms reading chunk indices per family: chunk-free parts (of a form, and terms
    free of chunks) become steps of ``owners`` (a FormProgram run at the owners' rows) and are gathered to
    the families; chunk indices come from ``env.chunks``."""

    def __init__(self, owners: FormProgram):
        super().__init__()
        self.owners = owners

    def values(self, env: Env, owner_values: list, index: np.ndarray | OwnerRuns) -> list:
        """Every step's value at the families: ``index`` [points, families] into the owners' rows (the
        owners' rows point after point), or :class:`OwnerRuns`. An owners' value equal at every point is
        gathered once, [1, families], so that what is computed from it alone is computed once for all
        points."""
        gathered: dict = {}

        def gather(i: int):
            hit = gathered.get(i)
            if hit is None:
                hit = gathered[i] = gathered_at(owner_values[i], index)
            return hit
        values: list = []
        for step in self.steps:
            values.append(step(values, gather, env))
        return values

    def lin(self, lin: ir.Lin) -> int:
        key = ("lin", lin)
        if key not in self._index:
            fixed, moving = split_on_chunks(lin)
            at = self.owners.lin(fixed)
            if len(moving) > 1:
                # all but the last chunk-reading term are a lin of their own, memoized (clear's `128 J1` once for
                # `128 J1 +- root` and `128 J1`), and the last is added to it (int64 sums wrap alike in any order)
                last, c = moving[-1]
                parts = [(self.lin(ir.Lin(moving[:-1], 0)), 1), (self.term(last), c)]
            else:
                parts = [(self.term(t), c) for t, c in moving]
            # a chunk-free part of 0 (clear's 128 J1 +- root) is not added: one pass over the families less
            self._add(key, _summed(0, parts, None if fixed == ir.Lin((), 0) and parts else lambda v, g, e: g(at)))
        return self._index[key]

    def term(self, t) -> int:
        key = ("term", t)
        if key not in self._index:
            if isinstance(t, ir.ChunkVar):
                self._add(key, lambda v, g, e: e.chunks[t])
            elif not F.term_reads_chunks(t):
                at = self.owners.term(t)
                self._add(key, lambda v, g, e: g(at))
            else:
                self._add(key, _compound(t, [self.lin(x) for x in F.inner_lins(t)]))
        return self._index[key]


def program_of(items) -> FormProgram | None:
    """The program of ``items`` (see :class:`FormProgram`), None where one reads k or a chunk index."""
    try:
        return FormProgram(items)
    except Unsupported:
        return None
