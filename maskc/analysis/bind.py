"""Pass 5, bind: run-time parameter values → :class:`~maskc.bound_params.BoundParams`, validated.

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

import numpy as np

from maskc import ir
from maskc.analysis import condprog
from maskc.analysis import forms as F
from maskc.analysis.evaluate import Evaluator
from maskc.analysis.formprog import Env
from maskc.analysis.forms import render
from maskc.analysis.rows import lin_value
from maskc.analysis.score import check_score
from maskc.analysis.values import (INT32, MAX_TABLE, checked_int, float_value, from_tensors, is_batched, is_int,
                                   per_segment, segment_table, table_value)
from maskc.analysis.widths import check_bound, check_expr, fits_32_bits
from maskc.errors import BindError, did_you_mean
from maskc.ir.text import cond_text, expr_text
from maskc.ir.walk import depends_on_position, mentions, nodes
from maskc.bound_params import BatchParams, BoundParams, SegmentTable, Table
from maskc.runs import sorted_unique

MAX_HEADS = 1024                  # num_heads accepted (the largest models have 128 query heads)
_REQUIRE_CHUNK = 1 << 16          # query positions per evaluation of the `require` checks


def check_index(value, what: str, end: int | None, hint: str | None = None) -> int:
    """An index the API takes (a batch element, a head, a tile side): an integer in [0, end), or in [0, 2**31)
    where ``end`` is None."""
    if not is_int(value) or value < 0 or value >= (INT32 + 1 if end is None else end):
        where = f"[0, {end})" if end is not None else "[0, 2**31)"
        raise BindError(f"{what} must be an integer in {where}, got {value!r}", hint=hint)
    return int(value)


def check_element(batch_index, head, batch: int, num_heads: int | None) -> tuple[int, int]:
    """A batch element and a head of a binding of ``batch`` elements and ``num_heads`` heads; one bound without
    num_heads has one head, 0 (its mask reads no h)."""
    one_head = "this binding has one head, 0: bind with num_heads= for more" if num_heads is None else None
    return (check_index(batch_index, "batch_index", batch),
            check_index(head, "head", 1 if num_heads is None else num_heads, one_head))


def check_blocks(block_m, block_n) -> tuple[int, int]:
    """Tile sides: positive integers that fit in 32 bits."""
    for what, v in (("block_m", block_m), ("block_n", block_n)):
        if not is_int(v) or not 1 <= v <= INT32:
            raise BindError(f"{what} (a tile side) must be a positive integer below 2**31, got {v!r}")
    return int(block_m), int(block_n)


def check_constants(mask: ir.ResolvedMask, ranges: ir.RangeMask, values: dict) -> tuple[tuple[str, int], ...]:
    """Values of const parameters, checked before they are written into a kernel: integers that fit in 32
    bits, every divisor that reads only const parameters positive, and every ``require`` check that reads
    only them true. Returns them as ints, in the order given."""
    const = {p.name: p for p in mask.params if p.const}
    out = tuple((n, checked_int(v, f"const parameter '{n}'", const[n].span)) for n, v in values.items())
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
                                f"{value}, and a divisor must be positive",
                                const[min(reads)].span if reads else mask.span)
    for lin in F.shift_amounts(f for r in ranges.allow + ranges.deny for f in r.forms):
        if not F.lin_mentions(lin, unknown):
            value = lin_value(lin, known, 1, 1, 0, 0)
            if not 0 <= value <= ir.MAX_SHIFT:
                reads = {t.name for t in F.terms_of(lin) if isinstance(t, ir.ParamRef)}
                raise BindError(f"const parameter {named(reads.__contains__)} makes the shift amount '{render(lin)}' "
                                f"= {value}; shifts take 0 to {ir.MAX_SHIFT}",
                                const[min(reads)].span if reads else mask.span)
    for r in mask.requires:
        if not mentions(r.cond, unknown):
            check_expr(mask.name, r.cond, known, 1, 1, 0, r.span)
            if not np.all(Evaluator(mask, known, 1, 1).cond(r.cond, np.zeros(1, np.int64), None)):
                which = named(lambda n: mentions(r.cond, lambda x: isinstance(x, ir.ParamRef) and x.name == n))
                raise BindError(f"const parameter {which} does not meet this requirement", r.span)
    return out


def _check_count(name: str, value, largest: int, why: str) -> None:
    """A length or count: an integer from 1 to ``largest``, else a BindError naming it and the range."""
    if not is_int(value) or not 1 <= value <= largest:
        raise BindError(f"{name} must be a positive integer no larger than {largest}, got {value!r}",
                        hint=why if is_int(value) and value > largest else None)


# bind's own keywords beside the mask's parameters (a misspelt one is named: num_head, kvlen)
LENGTH_KEYWORDS = ("seq_len", "kv_len", "num_heads", "params")


def bind(mask: ir.ResolvedMask, ranges: ir.RangeMask, seq_len: int,
         kv_len: int | None = None, num_heads: int | None = None, **values) -> BoundParams:
    """Validate and bind parameter values (see the module docstring); ``ranges`` is the mask's range
    analysis: its divisors, whether it reads h, and the forms whose widths are checked."""
    _check_count("seq_len", seq_len, INT32, "token positions are 32-bit in the kernels")
    kv_len = seq_len if kv_len is None else kv_len
    _check_count("kv_len", kv_len, INT32, "token positions are 32-bit in the kernels")
    if num_heads is not None:
        _check_count("num_heads", num_heads, MAX_HEADS, "masks that read h are classified once per head")
    names = [p.name for p in mask.params]
    for key in values:
        if key not in names:
            raise BindError(f"mask '{mask.name}' has no parameter '{key}'", mask.span,
                            did_you_mean(key, names + list(LENGTH_KEYWORDS)) or (
                                f"its parameters: {', '.join(names)}" if names else "it takes no parameters"))
    values = {key: from_tensors(v) for key, v in values.items()}     # torch tensors as numpy arrays
    batch = 1
    for p in mask.params:
        if p.name in values and is_batched(p, values[p.name]):
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
            return v[b] if v is not None and is_batched(p, v) else v
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
            floats[p.name] = float_value(mask, p, v, num_heads, at)
        elif p.kind == "int":
            if v is None:
                if p.default is None:
                    raise BindError(f"mask '{mask.name}' needs parameter '{p.name}'", p.span)
                v = p.default
            ints[p.name] = checked_int(v, f"parameter '{p.name}'{at}", p.span)
        elif p.kind == "segments":
            origin = 0
            if p.origin is not None:     # `segments from E`: E reads the int parameters declared before
                known = BatchParams(tuple(ints.items()), ())
                check_expr(mask.name, p.origin, known, seq_len, kv_len, b, p.span, at)
                origin = int(Evaluator(mask, known, seq_len, kv_len, 0, b).int(p.origin, None, None))
            segments[p.name] = segment_table(mask, p, v, origin, seq_len if p.over == "q" else kv_len, at, seq_len,
                                             kv_len)
        elif p.kind == "table":
            known = BatchParams(tuple(ints.items()), ())
            tables[p.name] = table_value(mask, p, v, num_heads, at, _sizes(mask, p, known, seq_len, kv_len, b, at))
        else:
            arrays.setdefault(p.of, {})[p.name] = per_segment(mask, p, v, segments[p.of].count, at)
    params = BatchParams(tuple(ints.items()), tuple(
        (name, SegmentTable(table.bounds, tuple(arrays.get(name, {}).items()))) for name, table in segments.items()),
        tuple(tables.items()), tuple(floats.items()))
    uses_head = ranges.uses_head
    if uses_head and num_heads is None:
        raise BindError(f"mask '{mask.name}' depends on the head h: bind it with num_heads=", mask.span)
    check_bound(mask, ranges, params, seq_len, kv_len, num_heads if uses_head else 1, b, at)
    check_score(mask, params, seq_len, kv_len, num_heads, batch, at, b)
    for h in range(num_heads) if uses_head else (0,):
        _check(mask, ranges, params, seq_len, kv_len, h, b, at)
    return params


def _sizes(mask, p, known: BatchParams, seq_len: int, kv_len: int, b: int, at: str) -> tuple[int, ...] | None:
    """A table's declared sizes, evaluated (None when it declares none): each a positive integer."""
    if p.shape is None:
        return None
    out = []
    for size in p.shape:
        check_expr(mask.name, size, known, seq_len, kv_len, b, p.span, at)
        value = int(Evaluator(mask, known, seq_len, kv_len, 0, b).int(size, None, None))
        if value < 1:
            raise BindError(f"table '{p.name}' is declared with size {expr_text(size)} = {value}{at}; a table's "
                            "sizes must be positive", p.span)
        out.append(value)
    return tuple(out)


def _check(mask, ranges, params, seq_len, kv_len, h, b, at):
    """Divisors positive; every `require` true at every query position. The checks that read nothing but int
    parameters, lengths, h and b (:class:`_Checks`) are a function of those values: once they all passed with
    these values (remembered per mask, as the width proofs are), only the others run, in their order, so the
    first failure is the one the whole walk would meet first."""
    checks = _checks_of(mask, ranges)
    builtins = {"seq_len": seq_len, "kv_len": kv_len, "h": h, "b": b}
    key = tuple(builtins[name] for name in checks.builtins) + tuple(params.int(name) for name in checks.ints)
    if key in checks.passed:
        _check_items(mask, checks.divisors, checks.requires, params, seq_len, kv_len, h, b, at)
        return
    _check_items(mask, ranges.divisors, mask.requires, params, seq_len, kv_len, h, b, at)
    if len(checks.passed) >= _MEMO:
        checks.passed.clear()
    checks.passed.add(key)


_MEMO = 256          # passes of the value checks remembered per mask


class _Checks:
    """A mask's bind checks (divisors, ``require`` rules) less those that read nothing but int parameters,
    seq_len, kv_len, h and b: ``divisors`` and ``requires`` are the others (they read positions, segments or
    tables: checked at every bind), ``builtins`` and ``ints`` the builtins and int parameters the left-out ones
    read, and ``passed`` the keys (those values) with which every check passed (a key leaves out h where no
    left-out check reads it: a mask bound per head does not fill the memo with one key per head)."""

    def __init__(self, mask: ir.ResolvedMask, divisors: tuple):
        self.divisors = tuple(lin for lin in divisors if not _reads_values_only(F.terms_of(lin)))
        self.requires = tuple(r for r in mask.requires if not _reads_values_only(nodes(r.cond)))
        read = [t for lin in divisors if lin not in self.divisors for t in F.terms_of(lin)]
        read += [n for r in mask.requires if r not in self.requires for n in nodes(r.cond)]
        self.builtins = tuple(sorted({n.name for n in read if isinstance(n, ir.Builtin)}))
        self.ints = tuple(sorted({n.name for n in read if isinstance(n, ir.ParamRef)}))
        self.passed: set = set()


# Nodes whose value is a function of their operands alone (ir.walk.children; a floor's and a product's in
# F.inner_lins): with leaves of _VALUE_LEAVES only, a check reads nothing that changes with the batch's data.
_PURE_NODES = (ir.Arith, ir.Func, ir.Cmp, ir.All, ir.Any_, ir.Negate, ir.Floor, ir.Product, ir.Square,
               ir.Extreme)
_VALUE_LEAVES = (ir.Const, ir.Truth, ir.ParamRef, ir.Builtin)


def _reads_values_only(found) -> bool:
    """Whether the nodes ``found`` (every node of a check, at any depth) are all value leaves or pure nodes."""
    return all(isinstance(n, _VALUE_LEAVES + _PURE_NODES) for n in found)


def _checks_of(mask: ir.ResolvedMask, ranges: ir.RangeMask) -> _Checks:
    """The mask's :class:`_Checks`, kept on ``ranges`` (immutable; the divisors are its)."""
    return ir.kept_on(ranges, "_value_checks", lambda: _Checks(mask, ranges.divisors), along=mask)


def _check_items(mask, divisors, requires, params, seq_len, kv_len, h, b, at):
    """The divisors positive and the ``requires`` true at every query position, in their order."""
    for lin in divisors:
        if lin_value(lin, params, seq_len, kv_len, h, b) <= 0:
            raise BindError(f"divisor '{render(lin)}' of mask '{mask.name}' is not positive{at}", mask.span)
    if not requires:
        return
    ev = Evaluator(mask, params, seq_len, kv_len, h, b)
    for r in requires:
        program = condprog.program_of(r.cond)

        def truth(q: np.ndarray):
            """The condition at positions q: by its compiled program, else (or past int64) by the Evaluator."""
            if program is not None:
                try:
                    return program.run(Env(params, seq_len, kv_len, h, b, q))
                except condprog.Inexact:
                    pass
            return ev.cond(r.cond, q, None)
        starts = _piece_starts(r.cond, params, seq_len)
        if starts is not None:            # constant between these positions: one check per piece
            ok = truth(starts)
            if np.shape(ok) != starts.shape:      # a condition free of the segments' values: one value
                ok = np.broadcast_to(ok, starts.shape)
            if not ok.all():
                raise BindError(f"requirement not met{_unmet(ev, r.cond, int(starts[np.argmin(ok)]))}{at}", r.span)
            continue
        for start in range(0, seq_len, _REQUIRE_CHUNK):       # memory bounded at any seq_len
            q = np.arange(start, min(seq_len, start + _REQUIRE_CHUNK), dtype=np.int64)
            ok = np.broadcast_to(truth(q), q.shape)
            if not ok.all():
                raise BindError(f"requirement not met{_unmet(ev, r.cond, start + int(np.argmin(ok)))}{at}", r.span)


def _unmet(ev: Evaluator, cond: ir.Cond, q: int) -> str:
    """Where and why a ``require`` condition fails at query ``q``: `` at q = 5: targets(q) <= users.length(q)
    is 6 <= 5`` (the first of its conjuncts that fails, with the values of its sides); no position when the
    condition reads none."""
    at = np.array([q], np.int64)
    while isinstance(cond, ir.All):
        cond = next(c for c in cond.items if not np.all(ev.cond(c, at, None)))
    where = f" at q = {q}" if depends_on_position(cond) else ""
    if not isinstance(cond, ir.Cmp):
        return f"{where}: {cond_text(cond)}"
    left, right = (int(np.ravel(ev.int(side, at, None))[0]) for side in (cond.left, cond.right))
    return f"{where}: {cond_text(cond)} is {left} {cond.op} {right}"


def _segments_read(cond: ir.Cond) -> tuple[str, ...] | None:
    """The segments ``cond`` reads (sorted), None when it reads q itself; kept on the condition (immutable)."""
    def read() -> tuple[str, ...] | None:
        found = list(nodes(cond))
        reads_q = any(isinstance(n, (ir.Pos, ir.Same)) for n in found)
        return None if reads_q else tuple(sorted({n.seg for n in found if isinstance(n, (ir.SegAttr, ir.SegValue))}))
    return ir.kept_on(cond, "_segments_read", read)


def _piece_starts(cond: ir.Cond, params, seq_len: int) -> np.ndarray | None:
    """Positions p_0 = 0 <= p_1 <= ..., in order, such that ``cond`` has one value on each [p_i, p_i+1) of
    [0, seq_len), when it reads q only through segments (their bounds cut it into pieces): checking it
    at these positions checks it at every position, in time that grows with the segments, not seq_len.
    A position may come twice (empty segments; one table's bounds are not sorted again). None when it
    reads q itself."""
    segs = _segments_read(cond)
    if segs is None:
        return None
    cuts = np.concatenate([np.zeros(1, np.int64)] + [params.segment(s).bounds for s in segs])
    starts = cuts if len(segs) <= 1 else sorted_unique(cuts)    # one table's bounds ascend from its origin >= 0
    return starts[(starts >= 0) & (starts < seq_len)]


__all__ = ["MAX_HEADS", "MAX_TABLE", "bind", "check_blocks", "check_constants", "check_element", "check_index"]
