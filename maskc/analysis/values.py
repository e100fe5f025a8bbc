"""Bind, parameter values: what a user passes for each kind of parameter, checked and converted (32-bit ints,
segment lengths to segment bounds, per-segment arrays, tables and their rows, floats and float tables), and which
values give one entry per batch element. Each refusal is a :class:`~maskc.errors.BindError` naming the parameter;
:mod:`maskc.analysis.bind` decides what is asked of each and checks the mask's own conditions."""
from __future__ import annotations

import itertools
import numbers
import sys

import numpy as np

from maskc import ir
from maskc.errors import BindError
from maskc.ir.text import expr_text
from maskc.bound_params import SegmentTable, Table

INT32 = 2 ** 31 - 1               # the int32 range's ends: the package's one copy of them
INT32_MIN = -2 ** 31
MAX_TABLE = 1 << 24               # entries of one table parameter (the kernels' table is int32-indexed)
FEW_SEGMENTS = 16                 # lengths up to which segment_table sums in Python ints


def is_int(v) -> bool:
    """An integer, not a bool."""
    return type(v) is int or (isinstance(v, numbers.Integral) and not isinstance(v, bool))


def checked_int(v, what: str, span) -> int:
    """``v`` as an int that fits in 32 bits, else a BindError naming ``what``."""
    if not is_int(v):
        raise BindError(f"{what} must be an integer, got {v!r}", span)
    if abs(int(v)) > INT32:
        raise BindError(f"{what} = {int(v)} does not fit in 32 bits", span)
    return int(v)


def from_tensors(value):
    """A torch tensor (CPU or CUDA) as the numpy array of its values (read with ``.tolist()``), a list or tuple
    holding tensors (one per batch element) as a list of those arrays; any other value as it is. Then a tensor
    is taken wherever a numpy array is. torch is not imported: a tensor exists only where it already was."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    if isinstance(value, torch.Tensor):
        values = value.tolist()
        empty = np.zeros(0, np.float64 if value.is_floating_point() else np.int64)
        return empty if values == [] else np.asarray(values)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [from_tensors(v) for v in value]
    return value


def _int_array(value, what: str, span) -> np.ndarray:
    """A list of integers (not bools) or a 1-D integer array, each fitting in 32 bits, as int64; else a
    BindError naming ``what``. Arrays are checked whole (a table of millions of entries binds in milliseconds)."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iu":
            raise BindError(f"{what} must be a list of integers", span)
        outside = (value > INT32) | (value < -INT32)
    else:
        if not isinstance(value, (list, tuple)) or not all(is_int(v) for v in value):
            raise BindError(f"{what} must be a list of integers", span)
        value = [int(v) for v in value]
        if value and -INT32 <= min(value) and max(value) <= INT32:
            return np.asarray(value, np.int64)
        outside = np.array([abs(v) > INT32 for v in value], bool)
    if outside.any():
        raise BindError(f"{what} = {int(value[int(np.argmax(outside))])} does not fit in 32 bits", span)
    return np.asarray(value, np.int64)


def _depth(value) -> int:
    """How deeply lists nest in ``value`` (an array: its dimensions), read down the first entries."""
    if isinstance(value, np.ndarray):
        return value.ndim
    if isinstance(value, (list, tuple)):
        return 1 + (_depth(value[0]) if len(value) else 0)
    return 0


def is_batched(param: ir.Param, value) -> bool:
    """A list of lists for segments, per-arrays and tables (of lists of lists for a table of rows), a list for
    ints and floats: one value per batch element."""
    if param.kind in ("int", "float"):
        return isinstance(value, (list, tuple, np.ndarray))
    rows = param.kind == "table" and (param.dims == 2 or (param.of == "h" and param.dims == 1))
    if rows:
        return isinstance(value, (list, tuple, np.ndarray)) and _depth(value) >= 3
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(v, (list, tuple, np.ndarray)) for v in value)


def segment_table(mask, p, value, origin: int, end: int, at: str, seq_len: int, kv_len: int) -> SegmentTable:
    """Lengths that partition [origin, end) exactly, as segment bounds (end: seq_len, or kv_len over k)."""
    if value is None:
        raise BindError(f"mask '{mask.name}' needs segments '{p.name}' (a list of lengths)", p.span)
    lengths = _int_array(value, f"segments '{p.name}'{at}", p.span)
    few = lengths.tolist() if len(lengths) <= FEW_SEGMENTS else None      # Python ints: cheaper than numpy calls
    if min(few, default=0) < 0 if few is not None else (lengths < 0).any():
        raise BindError(f"segments '{p.name}' has a negative length{at}", p.span)
    length = "seq_len" if p.over == "q" else "kv_len"
    if not 0 <= origin <= end:
        raise BindError(f"segments '{p.name}' start at {origin}, outside [0, {length} = {end}]{at}", p.span)
    total = sum(few) if few is not None else int(lengths.sum())
    if total != end - origin:
        other, other_end = ("kv_len", kv_len) if p.over == "q" else ("seq_len", seq_len)
        hint = (f"these lengths cover [{origin}, {other} = {other_end}): to partition the "
                f"{'keys' if p.over == 'q' else 'queries'}, declare it '{p.name}: segments over "
                f"{'k' if p.over == 'q' else 'q'}'") if total == other_end - origin and seq_len != kv_len else None
        raise BindError(f"segments '{p.name}' sum to {total}, but must cover [{origin}, {end})"
                        f"{' (the keys: kv_len)' if p.over == 'k' else ''}: {end - origin} tokens{at}", p.span, hint)
    if few is not None:
        return SegmentTable(np.array(list(itertools.accumulate(few, initial=origin)), np.int64))
    bounds = np.zeros(len(lengths) + 1, np.int64)
    bounds[0] = origin
    np.cumsum(lengths, out=bounds[1:])
    bounds[1:] += origin
    return SegmentTable(bounds)


def per_segment(mask, p, value, count: int, at: str) -> np.ndarray:
    """One integer per segment of ``p.of`` (its default for every one when no value is given)."""
    if value is None:
        if p.default is None:
            raise BindError(f"mask '{mask.name}' needs '{p.name}' (one integer per segment of '{p.of}')", p.span)
        value = [p.default] * count
    values = _int_array(value, f"'{p.name}'{at}", p.span)
    if len(values) != count:
        raise BindError(f"'{p.name}' has {len(values)} entries but '{p.of}' has {count} segments{at}", p.span)
    return values


def table_value(mask, p, value, num_heads: int | None, at: str, sizes: tuple[int, ...] | None) -> Table:
    """A table: a non-empty list of integers, of its declared sizes; a table with two indices a list of rows;
    a table per h has one entry (or one row) per head (a per-head value: its default for every head)."""
    per_head = p.of == "h"
    rows = p.dims == 2 or (per_head and p.dims == 1)
    shape: tuple[int, ...]
    if value is None:
        if not per_head or p.default is None:
            what = ("one row per head" if rows else "one integer per head") if per_head else \
                "a list of rows" if rows else "a list of integers"
            raise BindError(f"mask '{mask.name}' needs '{p.name}' ({what})", p.span)
        value = [p.default] * (num_heads or 0)
    if isinstance(value, (list, tuple, np.ndarray)) and len(value) > MAX_TABLE:
        raise BindError(f"table '{p.name}' has {len(value)} entries; maskc takes at most {MAX_TABLE} (2**24){at}",
                        p.span)
    if rows and isinstance(value, np.ndarray) and value.ndim == 2:      # an array of rows: checked whole
        shape = value.shape
        values = _int_array(value.reshape(-1), f"'{p.name}'{at}", p.span)
    elif rows:
        if not isinstance(value, (list, tuple)) or not value or not all(
                isinstance(r, (list, tuple, np.ndarray)) for r in value):
            # a flattened table (a list of integers) is the likely slip: say that it is one
            got = ", got a list of integers" if isinstance(value, (list, tuple)) and value and all(
                is_int(r) for r in value) else ""
            raise BindError(f"'{p.name}' must be a list of rows (lists of integers)"
                            f"{', one per head' if per_head else ''}{got}{at}", p.span)
        lists = [_int_array(r, f"'{p.name}'{at}", p.span) for r in value]
        if len({len(r) for r in lists}) > 1:
            raise BindError(f"the rows of '{p.name}' differ in length ({', '.join(str(len(r)) for r in lists)})"
                            f"{at}", p.span)
        shape = (len(lists), len(lists[0]))
        values = np.concatenate(lists)
    else:
        values = _int_array(value, f"'{p.name}'{at}", p.span)
        shape = (len(values),)
    if len(values) > MAX_TABLE:
        raise BindError(f"table '{p.name}' has {len(values)} entries; maskc takes at most {MAX_TABLE} (2**24){at}",
                        p.span)
    if per_head and num_heads is not None and shape[0] != num_heads:
        raise BindError(f"'{p.name}' has {shape[0]} {'rows' if rows else 'entries'}, one per head, but num_heads = "
                        f"{num_heads}{at}", p.span)
    declared = sizes if not per_head else (None if sizes is None else (shape[0],) + sizes)
    if declared is not None and shape != declared:
        names = ", ".join(expr_text(e) for e in p.shape or ())
        raise BindError(f"table '{p.name}' has {' x '.join(map(str, shape))} entries, but is declared "
                        f"{'per h, ' if per_head else ''}[{names}] = {' x '.join(map(str, declared))}{at}", p.span)
    if not len(values) and not per_head:
        raise BindError(f"table '{p.name}' is empty{at}", p.span)
    return Table(values, shape)


def float_value(mask, p, value, num_heads: int | None, at: str):
    """A float parameter's value: a finite real number; a float table, a non-empty list of them (a float per
    h: one per head, so the mask must be bound with num_heads; its default for every head)."""
    def finite(v, what):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(float(v)) \
                or abs(float(v)) > np.finfo(np.float32).max:
            raise BindError(f"{what} must be a finite number (a float32), got {v!r}", p.span)
        return float(v)

    if p.kind == "float":
        if value is None:
            if p.default is None:
                raise BindError(f"mask '{mask.name}' needs parameter '{p.name}' (a float)", p.span)
            value = p.default
        return finite(value, f"parameter '{p.name}'{at}")
    per_head = p.of == "h"
    if per_head and num_heads is None:
        raise BindError(f"'{p.name}' has one value per head: bind mask '{mask.name}' with num_heads=", p.span)
    if value is None:
        if not per_head or p.default is None:
            what = "one float per head" if per_head else "a list of floats"
            raise BindError(f"mask '{mask.name}' needs '{p.name}' ({what})", p.span)
        value = [p.default] * (num_heads or 0)
    if isinstance(value, np.ndarray):
        value = value.tolist() if value.ndim == 1 else None
    if not isinstance(value, (list, tuple)):
        raise BindError(f"'{p.name}'{at} must be a list of floats", p.span)
    if len(value) > MAX_TABLE:
        raise BindError(f"table '{p.name}' has {len(value)} entries; maskc takes at most {MAX_TABLE} (2**24){at}",
                        p.span)
    values = [finite(v, f"'{p.name}'{at}") for v in value]
    if per_head and len(values) != num_heads:
        raise BindError(f"'{p.name}' has {len(values)} entries, one per head, but num_heads = {num_heads}{at}", p.span)
    if not values:
        raise BindError(f"table '{p.name}' is empty{at}", p.span)
    return np.asarray(values, np.float64)
