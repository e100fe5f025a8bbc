"""Pass 5, bind: run-time parameter values → :class:`~maskc.kernel_ir.BoundParams`, validated.

Invariant: every parameter of the mask has a value for every batch element; int values are
integers; segments are non-negative lengths that exactly partition their range [origin, end) with
0 <= origin <= end (end = seq_len, or kv_len for segments over k); per-segment arrays have one entry per
segment; tables are non-empty lists of 32-bit integers (a table per h: one per head), tables with declared
sizes have exactly those sizes (a table with two indices is a list of equal rows); every divisor is positive; every ``require`` check holds at
every query position; every intermediate of the mask's forms fits in 64 bits, every shift amount lies in
[0, MAX_SHIFT] and every table index in its table, for every position and head (:mod:`maskc.analysis.widths`). Memory is O(seq_len + kv_len):
nothing of size seq_len x kv_len is built; a ``const`` int has one value across the batch. Values that
break this raise one
:class:`~maskc.errors.BindError` that names the parameter.
"""
from __future__ import annotations

import numbers

import numpy as np

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis.evaluate import Evaluator
from maskc.analysis.keys import sorted_unique
from maskc.analysis.forms import render
from maskc.analysis.rows import lin_value
from maskc.analysis.score import check_score
from maskc.analysis.widths import check_bound, check_expr, fits_32_bits
from maskc.errors import BindError, did_you_mean
from maskc.ir.walk import mentions, nodes
from maskc.kernel_ir import BatchParams, BoundParams, SegmentTable, Table


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


_INT32 = 2 ** 31 - 1
MAX_HEADS = 1024                  # num_heads accepted (the largest models have 128 query heads)
MAX_TABLE = 1 << 24               # entries of one table parameter (the kernels' table is int32-indexed)
_REQUIRE_CHUNK = 1 << 16          # query positions per evaluation of the `require` checks


def _checked_int(v, what: str, span) -> int:
    if not _is_int(v):
        raise BindError(f"{what} must be an integer, got {v!r}", span)
    if abs(int(v)) > _INT32:
        raise BindError(f"{what} = {int(v)} does not fit in 32 bits", span)
    return int(v)


def check_index(value, what: str, end: int | None) -> int:
    """An index the API takes (a batch element, a head, a tile side): an integer in [0, end)."""
    if not _is_int(value) or value < 0 or (end is not None and value >= end):
        where = f"[0, {end})" if end is not None else "[0, 2**31)"
        raise BindError(f"{what} must be an integer in {where}, got {value!r}")
    return int(value)


def check_blocks(block_m, block_n) -> tuple[int, int]:
    """Tile sides: positive integers that fit in 32 bits."""
    for what, v in (("block_m", block_m), ("block_n", block_n)):
        if not _is_int(v) or not 1 <= v <= _INT32:
            raise BindError(f"{what} (a tile side) must be a positive integer below 2**31, got {v!r}")
    return int(block_m), int(block_n)


def check_constants(mask: ir.ResolvedMask, ranges: ir.RangeMask, values: dict) -> tuple[tuple[str, int], ...]:
    """Values of const parameters, checked before they are written into a kernel: integers that fit in 32
    bits, every divisor that reads only const parameters positive, and every ``require`` check that reads
    only them true. Returns them as ints, in the order given."""
    const = {p.name: p for p in mask.params if p.const}
    out = tuple((n, _checked_int(v, f"const parameter '{n}'", const[n].span)) for n, v in values.items())
    known = BatchParams(out, ())

    def unknown(leaf) -> bool:      # what a kernel learns only at run time
        return isinstance(leaf, (ir.Pos, ir.Builtin, ir.SegAttr, ir.SegValue, ir.TableAt, ir.Lookup)) or (
            isinstance(leaf, ir.ParamRef) and leaf.name not in values)

    def named(read) -> str:
        return ", ".join(f"'{n}' = {v}" for n, v in out if read(n))

    for lin in ranges.divisors:
        if not F.lin_mentions(lin, unknown):
            value = lin_value(lin, known, 1, 1, 0, 0)
            if value <= 0:
                reads = {t.name for t in F.terms_of(lin) if isinstance(t, ir.ParamRef)}
                raise BindError(f"const parameter {named(reads.__contains__)} makes the divisor '{render(lin)}' = "
                                f"{value}, and a divisor must be positive", const[min(reads)].span)
    for lin in F.shift_amounts(f for r in ranges.allow + ranges.deny for f in r.forms):
        if not F.lin_mentions(lin, unknown):
            value = lin_value(lin, known, 1, 1, 0, 0)
            if not 0 <= value <= ir.MAX_SHIFT:
                reads = {t.name for t in F.terms_of(lin) if isinstance(t, ir.ParamRef)}
                raise BindError(f"const parameter {named(reads.__contains__)} makes the shift amount '{render(lin)}' "
                                f"= {value}; shifts take 0 to {ir.MAX_SHIFT}", const[min(reads)].span)
    for r in mask.requires:
        if not mentions(r.cond, unknown):
            check_expr(mask.name, r.cond, known, 1, 1, 0, r.span)
            if not np.all(Evaluator(mask, known, 1, 1).cond(r.cond, np.zeros(1, np.int64), None)):
                which = named(lambda n: mentions(r.cond, lambda x: isinstance(x, ir.ParamRef) and x.name == n))
                raise BindError(f"const parameter {which} does not meet this requirement", r.span)
    return out


def _check_count(name: str, value, largest: int, why: str) -> None:
    """A length or count: an integer from 1 to ``largest``, else a BindError naming it and the range."""
    if not _is_int(value) or not 1 <= value <= largest:
        raise BindError(f"{name} must be a positive integer no larger than {largest}, got {value!r}",
                        hint=why if _is_int(value) and value > largest else None)


def _int_list(value, what: str, span) -> list[int]:
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iu":
            raise BindError(f"{what} must be a list of integers", span)
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(_is_int(v) for v in value):
        raise BindError(f"{what} must be a list of integers", span)
    return [_checked_int(v, what, span) for v in value]


def _depth(value) -> int:
    """How deeply lists nest in ``value`` (an array: its dimensions), read down the first entries."""
    if isinstance(value, np.ndarray):
        return value.ndim
    if isinstance(value, (list, tuple)):
        return 1 + (_depth(value[0]) if len(value) else 0)
    return 0


def _is_batched(param: ir.Param, value) -> bool:
    """A list of lists for segments, per-arrays and tables (of lists of lists for a table of rows), a list for
    ints and floats: one value per batch element."""
    if param.kind in ("int", "float"):
        return isinstance(value, (list, tuple, np.ndarray))
    rows = param.kind == "table" and (param.dims == 2 or (param.of == "h" and param.dims == 1))
    if rows:
        return isinstance(value, (list, tuple, np.ndarray)) and _depth(value) >= 3
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(v, (list, tuple, np.ndarray)) for v in value)


def bind(mask: ir.ResolvedMask, ranges: ir.RangeMask, seq_len: int,
         kv_len: int | None = None, num_heads: int | None = None, **values) -> BoundParams:
    """Validate and bind parameter values (see the module docstring); ``ranges`` is the mask's range
    analysis: its divisors, whether it reads h, and the forms whose widths are checked."""
    _check_count("seq_len", seq_len, _INT32, "token positions are 32-bit in the kernels")
    kv_len = seq_len if kv_len is None else kv_len
    _check_count("kv_len", kv_len, _INT32, "token positions are 32-bit in the kernels")
    if num_heads is not None:
        _check_count("num_heads", num_heads, MAX_HEADS, "masks that read h are classified once per head")
    names = [p.name for p in mask.params]
    for key in values:
        if key not in names:
            raise BindError(f"mask '{mask.name}' has no parameter '{key}'", mask.span,
                            did_you_mean(key, names) or (f"its parameters: {', '.join(names)}" if names else
                                                         "it takes no parameters"))
    batch = 1
    for p in mask.params:
        if p.name in values and _is_batched(p, values[p.name]):
            n = len(values[p.name])
            if n == 0:
                raise BindError(f"parameter '{p.name}' is an empty list: a batch needs at least one element",
                                p.span)
            if batch not in (1, n):
                raise BindError(f"parameter '{p.name}' has {n} batch entries, another has {batch}", p.span)
            batch = max(batch, n)
    if batch < 1:
        raise BindError("a batch needs at least one element")
    elements = []
    for b in range(batch):
        def value_of(p):
            v = values.get(p.name)
            return v[b] if v is not None and _is_batched(p, v) else v
        elements.append(_bind_one(mask, ranges, seq_len, kv_len, num_heads, value_of, b, batch))
    for p in mask.params:
        if p.const and len({e.int(p.name) for e in elements}) > 1:
            raise BindError(f"parameter '{p.name}' is const (compiled into the kernel): every batch element "
                            "must give it the same value", p.span)
    heads = num_heads if ranges.uses_head and num_heads else 1
    narrow = all(fits_32_bits(ranges, e, seq_len, kv_len, heads, b, mask) for b, e in enumerate(elements))
    return BoundParams(seq_len, kv_len, num_heads, tuple(elements), narrow)


def _bind_one(mask, ranges, seq_len, kv_len, num_heads, value_of, b, batch) -> BatchParams:
    at = f" (batch element {b})" if batch > 1 else ""
    ints: dict[str, int] = {}
    segments: dict[str, SegmentTable] = {}
    arrays: dict[str, dict[str, np.ndarray]] = {}
    tables: dict[str, Table] = {}
    floats: dict[str, float | np.ndarray] = {}
    for p in mask.params:
        v = value_of(p)
        if p.kind in ir.FLOAT_KINDS:
            floats[p.name] = _float_value(mask, p, v, num_heads, at)
        elif p.kind == "int":
            if v is None:
                if p.default is None:
                    raise BindError(f"mask '{mask.name}' needs parameter '{p.name}'", p.span)
                v = p.default
            ints[p.name] = _checked_int(v, f"parameter '{p.name}'{at}", p.span)
        elif p.kind == "segments":
            origin = 0
            if p.origin is not None:     # `segments from E`: E reads the int parameters declared before
                known = BatchParams(tuple(ints.items()), ())
                check_expr(mask.name, p.origin, known, seq_len, kv_len, b, p.span, at)
                origin = int(Evaluator(mask, known, seq_len, kv_len, 0, b).int(p.origin, None, None))
            segments[p.name] = _segments(mask, p, v, origin, seq_len if p.over == "q" else kv_len, at, seq_len,
                                         kv_len)
        elif p.kind == "table":
            known = BatchParams(tuple(ints.items()), ())
            tables[p.name] = _table(mask, p, v, num_heads, at, _sizes(mask, p, known, seq_len, kv_len, b, at))
        else:
            arrays.setdefault(p.of, {})[p.name] = _per_segment(mask, p, v, segments[p.of].count, at)
    params = BatchParams(tuple(ints.items()), tuple(
        (name, SegmentTable(table.bounds, tuple(arrays.get(name, {}).items()))) for name, table in segments.items()),
        tuple(tables.items()), tuple(floats.items()))
    uses_head = ranges.uses_head
    if uses_head and num_heads is None:
        raise BindError(f"mask '{mask.name}' depends on the head h: bind it with num_heads=", mask.span)
    check_bound(mask, ranges, params, seq_len, kv_len, num_heads if uses_head else 1, b, at)
    check_score(mask, params, seq_len, kv_len, num_heads, batch, at)
    for h in range(num_heads) if uses_head else (0,):
        _check(mask, ranges.divisors, params, seq_len, kv_len, h, b, at)
    return params


def _segments(mask, p, value, origin: int, end: int, at: str, seq_len: int, kv_len: int) -> SegmentTable:
    """Lengths that partition [origin, end) exactly, as segment bounds (end: seq_len, or kv_len over k)."""
    if value is None:
        raise BindError(f"mask '{mask.name}' needs segments '{p.name}' (a list of lengths)", p.span)
    lengths = _int_list(value, f"segments '{p.name}'{at}", p.span)
    if any(n < 0 for n in lengths):
        raise BindError(f"segments '{p.name}' has a negative length{at}", p.span)
    length = "seq_len" if p.over == "q" else "kv_len"
    if not 0 <= origin <= end:
        raise BindError(f"segments '{p.name}' start at {origin}, outside [0, {length} = {end}]{at}", p.span)
    total = sum(lengths)
    if total != end - origin:
        other, other_end = ("kv_len", kv_len) if p.over == "q" else ("seq_len", seq_len)
        hint = (f"these lengths cover [{origin}, {other} = {other_end}): to partition the "
                f"{'keys' if p.over == 'q' else 'queries'}, declare it '{p.name}: segments over "
                f"{'k' if p.over == 'q' else 'q'}'") if total == other_end - origin and seq_len != kv_len else None
        raise BindError(f"segments '{p.name}' sum to {total}, but must cover [{origin}, {end})"
                        f"{' (the keys: kv_len)' if p.over == 'k' else ''}: {end - origin} tokens{at}", p.span, hint)
    bounds = np.zeros(len(lengths) + 1, np.int64)
    bounds[0] = origin
    np.cumsum(lengths, out=bounds[1:])
    bounds[1:] += origin
    return SegmentTable(bounds)


def _per_segment(mask, p, value, count: int, at: str) -> np.ndarray:
    """One integer per segment of ``p.of`` (its default for every one when no value is given)."""
    if value is None:
        if p.default is None:
            raise BindError(f"mask '{mask.name}' needs '{p.name}' (one integer per segment of '{p.of}')", p.span)
        value = [p.default] * count
    values = _int_list(value, f"'{p.name}'{at}", p.span)
    if len(values) != count:
        raise BindError(f"'{p.name}' has {len(values)} entries but '{p.of}' has {count} segments{at}", p.span)
    return np.asarray(values, np.int64)


def _sizes(mask, p, known: BatchParams, seq_len: int, kv_len: int, b: int, at: str) -> tuple[int, ...] | None:
    """A table's declared sizes, evaluated (None when it declares none): each a positive integer."""
    if p.shape is None:
        return None
    out = []
    for size in p.shape:
        check_expr(mask.name, size, known, seq_len, kv_len, b, p.span, at)
        value = int(Evaluator(mask, known, seq_len, kv_len, 0, b).int(size, None, None))
        if value < 1:
            from maskc.explain import expr_text
            raise BindError(f"table '{p.name}' is declared with size {expr_text(size)} = {value}{at}; a table's "
                            "sizes must be positive", p.span)
        out.append(value)
    return tuple(out)


def _table(mask, p, value, num_heads: int | None, at: str, sizes: tuple[int, ...] | None) -> Table:
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
    if rows:
        if isinstance(value, np.ndarray) and value.ndim == 2:
            value = list(value)
        if not isinstance(value, (list, tuple)) or not value:
            raise BindError(f"'{p.name}' must be a list of rows (lists of integers){at}", p.span)
        lists = [_int_list(r, f"'{p.name}'{at}", p.span) for r in value]
        if len({len(r) for r in lists}) > 1:
            raise BindError(f"the rows of '{p.name}' differ in length ({', '.join(str(len(r)) for r in lists)})"
                            f"{at}", p.span)
        shape = (len(lists), len(lists[0]))
        values = [v for r in lists for v in r]
    else:
        values = _int_list(value, f"'{p.name}'{at}", p.span)
        shape = (len(values),)
    if len(values) > MAX_TABLE:
        raise BindError(f"table '{p.name}' has {len(values)} entries; maskc takes at most {MAX_TABLE} (2**24){at}",
                        p.span)
    if per_head and num_heads is not None and shape[0] != num_heads:
        raise BindError(f"'{p.name}' has {shape[0]} {'rows' if rows else 'entries'}, one per head, but num_heads = "
                        f"{num_heads}{at}", p.span)
    declared = sizes if not per_head else (None if sizes is None else (shape[0],) + sizes)
    if declared is not None and shape != declared:
        from maskc.explain import expr_text
        names = ", ".join(expr_text(e) for e in p.shape or ())
        raise BindError(f"table '{p.name}' has {' x '.join(map(str, shape))} entries, but is declared "
                        f"{'per h, ' if per_head else ''}[{names}] = {' x '.join(map(str, declared))}{at}", p.span)
    if not values and not per_head:
        raise BindError(f"table '{p.name}' is empty{at}", p.span)
    return Table(np.asarray(values, np.int64), shape)


def _float_value(mask, p, value, num_heads: int | None, at: str):
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


def _check(mask, divisors, params, seq_len, kv_len, h, b, at):
    """Divisors positive; every `require` true at every query position."""
    for lin in divisors:
        if lin_value(lin, params, seq_len, kv_len, h, b) <= 0:
            raise BindError(f"divisor '{render(lin)}' of mask '{mask.name}' is not positive{at}", mask.span)
    if not mask.requires:
        return
    ev = Evaluator(mask, params, seq_len, kv_len, h, b)
    for r in mask.requires:
        starts = _piece_starts(r.cond, params, seq_len)
        if starts is not None:            # constant between these positions: one check per piece
            ok = np.broadcast_to(ev.cond(r.cond, starts, None), starts.shape)
            if not ok.all():
                raise BindError(f"requirement not met at q = {int(starts[np.argmin(ok)])}{at}", r.span)
            continue
        for start in range(0, seq_len, _REQUIRE_CHUNK):       # memory bounded at any seq_len
            q = np.arange(start, min(seq_len, start + _REQUIRE_CHUNK), dtype=np.int64)
            ok = np.broadcast_to(ev.cond(r.cond, q, None), q.shape)
            if not ok.all():
                raise BindError(f"requirement not met at q = {start + int(np.argmin(ok))}{at}", r.span)


def _piece_starts(cond: ir.Cond, params, seq_len: int) -> np.ndarray | None:
    """Sorted positions p_0 = 0 < p_1 < ... such that ``cond`` has one value on each [p_i, p_i+1) of
    [0, seq_len), when it reads q only through segments (their bounds cut it into pieces): checking it
    at these positions checks it at every position, in time that grows with the segments, not seq_len.
    None when it reads q itself."""
    segs = set()
    for n in nodes(cond):
        if isinstance(n, (ir.Pos, ir.Same)):
            return None
        if isinstance(n, (ir.SegAttr, ir.SegValue)):
            segs.add(n.seg)
    cuts = [np.zeros(1, np.int64)] + [params.segment(s).bounds for s in sorted(segs)]
    starts = sorted_unique(np.concatenate(cuts))
    return starts[(starts >= 0) & (starts < seq_len)]

