"""Bind's result: a mask's run-time parameter values, validated (:func:`maskc.analysis.bind.bind`).

Frozen values read by the passes that follow bind (classification, the descriptor, the predicate's table) and
by the reference interpreter; :mod:`maskc.kernel_ir` holds what is derived from them for the kernels.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class SegmentTable:
    """One segments parameter of one batch element: ``bounds[i] <= p < bounds[i+1]`` is segment i."""

    bounds: np.ndarray          # int64[n + 1], non-decreasing; bounds[0] is the range's origin
    values: tuple[tuple[str, np.ndarray], ...] = ()   # per-segment arrays: (name, int64[n])

    @property
    def count(self) -> int:
        return len(self.bounds) - 1

    def value(self, name: str) -> np.ndarray:
        return next(v for n, v in self.values if n == name)

    def value_range(self, name: str) -> tuple[int, int] | None:
        """(least, greatest) of the per-segment array ``name`` (None where there are no segments), worked out
        once: the width proofs read it at every bind, once per program and per position it is read at."""
        hit = self._ranges.get(name, False)
        if hit is False:
            values = self.value(name)
            hit = self._ranges[name] = (int(values.min()), int(values.max())) if len(values) else None
        return hit

    @functools.cached_property
    def _ranges(self) -> dict:
        return {}


@dataclass(frozen=True, eq=False)
class Table:
    """One table parameter of one batch element (a table per h: one entry, or one row, per head)."""

    values: np.ndarray          # int64[n], n >= 1: the entries in row-major order
    shape: tuple[int, ...] = ()     # () for one index of len(values) entries; (rows, columns) for two

    def __post_init__(self):
        if not self.shape:
            object.__setattr__(self, "shape", (len(self.values),))

    @property
    def count(self) -> int:
        return len(self.values)


@dataclass(frozen=True, eq=False)
class BatchParams:
    """The validated parameter values of one batch element."""

    ints: tuple[tuple[str, int], ...]
    segments: tuple[tuple[str, SegmentTable], ...]
    tables: tuple[tuple[str, Table], ...] = ()
    # float parameters (read by the score modifier only): a float, or a float64 array for a float table
    floats: tuple[tuple[str, "float | np.ndarray"], ...] = ()

    def int(self, name: str) -> int:
        return self._by_name[0][name]

    def segment(self, name: str) -> SegmentTable:
        return self._by_name[1][name]

    def table(self, name: str) -> Table:
        return self._by_name[2][name]

    def float(self, name: str):
        return self._by_name[3][name]

    @functools.cached_property
    def _by_name(self) -> tuple[dict, dict, dict, dict]:
        """The four tuples as dicts, made on the first lookup (the passes look names up at every bind; a frozen
        dataclass still takes a cached_property, which writes the instance's __dict__ directly)."""
        return dict(self.ints), dict(self.segments), dict(self.tables), dict(self.floats)


@dataclass(frozen=True, eq=False)
class BoundParams:
    """Bind's result: the lengths and, per batch element, the parameter values (all validated)."""

    seq_len: int
    kv_len: int
    num_heads: int | None       # only for masks that use h
    batch: tuple[BatchParams, ...]
    # every form of the kernel's predicate fits in 32 bits (maskc.analysis.widths.fits_32_bits); for a mask in a
    # token order, also those of the raster mask its element path computes (maskc.codegen.elements)
    narrow: bool = False

    def constants(self, names) -> tuple[tuple[str, int], ...]:
        """The values of the named (const) int parameters, the same in every batch element."""
        return tuple((n, self.batch[0].int(n)) for n in names)
