"""Width proofs: every integer maskc computes from a mask's forms fits the 64 bits it is computed in.

The generated predicate computes every form in 64 bits (:mod:`maskc.codegen.predicate`); classification
(:mod:`maskc.analysis.rows`) and the reference (:mod:`maskc.analysis.evaluate`) compute in numpy int64, which wraps
silently. Two checks keep all three exact:

- ``check_static(ranges)``, at compile time: every coefficient and constant of the analysed forms
  (constant folding multiplies literals: ``q * 65536 * 65536 * 65536 * 65536``) lies in
  [-LIMIT, LIMIT], else a :class:`~maskc.errors.MaskError` at the rule.
- ``check_bound(resolved, ranges, params, ...)``, at bind: over q in [0, seq_len), k in [0, kv_len),
  every head and the bound values, interval arithmetic in Python integers bounds every intermediate of
  every form (each term, product, quotient, bit operation and partial sum) of the analysed mask and of the
  resolved expressions dense() evaluates; one that can leave [-LIMIT, LIMIT] is a
  :class:`~maskc.errors.BindError` naming the parameters and the form. The same bounds prove every shift
  amount within [0, MAX_SHIFT] and every table index within its table (else a BindError naming the
  table), so the kernels never shift past 63 bits nor read outside a table.
- ``fits_32_bits(...)``, at bind: the same bounds against 32 bits, for positions a tile past the ends, and
  those of every intermediate of the chunk nests the kernels enumerate (each level's index over its range); a
  binding that passes gets the predicate, nests included, in int (:attr:`~maskc.bound_params.BoundParams.narrow`). Past the
  ends, the kernel clamps table indices and shift amounts into range (their values there are never used),
  and so do these bounds.

LIMIT = 2**62 leaves head-room for the steps taken after a proven value (ceil division negates it,
modulo subtracts a product of the quotient). The interval arithmetic itself: :mod:`maskc.analysis.bounds`.
"""
from __future__ import annotations

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis.bounds import (COMPOUND_EXPRS, LIMIT, NARROW_LIMIT, BadShift, Bounds, OutOfRange, TooWide,
                                   cond_exprs, fit, operands)
from maskc.errors import BindError, MaskError
from maskc.ir.text import expr_text
from maskc.bound_params import BatchParams

TILE_PADDING = 256      # positions a kernel's last tiles evaluate past seq_len and kv_len (tile sides <= 256)


def _params_in_lin(lin: ir.Lin) -> set[str]:
    out: set[str] = set()
    for t in F.terms_of(lin):
        if isinstance(t, ir.ParamRef):
            out.add(t.name)
    return out


def _params_in_expr(e) -> set[str]:
    """The int parameters an expression or condition of the resolved mask reads."""
    if isinstance(e, ir.ParamRef):
        return {e.name}
    if isinstance(e, ir.TableAt):
        return set().union(*(_params_in_expr(i) for i in e.indices + e.strides))
    if isinstance(e, (ir.Arith, ir.Cmp)):
        return _params_in_expr(e.left) | _params_in_expr(e.right)
    if isinstance(e, (ir.Func, ir.All, ir.Any_)):
        return set().union(*(_params_in_expr(a) for a in (e.args if isinstance(e, ir.Func) else e.items)))
    if isinstance(e, ir.Negate):
        return _params_in_expr(e.item)
    return set()


class _Program:
    """The interval arithmetic of check_bound and fits_32_bits for one mask, compiled once: every distinct
    form, term and resolved expression (by value) as a step, children before parents, so that a bind
    evaluates each once. The checked items are the kernel's forms (``forms`` of them), then the rules
    (none without ``resolved``); ``roots[i]`` is the number of steps the first i + 1 items need."""

    def __init__(self, resolved: ir.ResolvedMask | None, ranges: ir.RangeMask):
        self.steps: list[tuple[str, object, tuple[int, ...]]] = []
        self._index: dict = {}
        self.roots: list[int] = []
        for lin, _ in _checked_forms(ranges):
            self._add("lin", lin)
            self.roots.append(len(self.steps))
        self.forms = len(self.roots)
        for rule in resolved.rules if resolved is not None else ():
            for e in cond_exprs(rule.cond):
                self._add("expr", e)
            self.roots.append(len(self.steps))
        self.leaves = [node for kind, node, _ in self.steps if kind == "leaf"]     # in step order
        # a node may be a leaf of a form and of a rule (two steps): its bounds are asked once a bind
        self.distinct = tuple(dict.fromkeys(self.leaves))
        self.leaf_at = [self.distinct.index(node) for node in self.leaves]
        self.widen = [_widening(node) for node in self.distinct]
        self.monotone = all(_monotone(kind, node) for kind, node, _ in self.steps)
        self._passed: dict = {}         # widened leaves -> whether every step passes with them

    def _add(self, kind: str, node) -> int:
        key = (kind, node)
        hit = self._index.get(key)
        if hit is None:
            if kind == "lin":
                kids = tuple(self._add("term", t) for t, _ in node.terms)
            elif kind == "term" and isinstance(node, ir.HashOnce):
                kids = tuple(self._add("lin", a) for a in F.inner_lins(node))
            elif kind == "expr" and isinstance(node, COMPOUND_EXPRS):
                kids = tuple(self._add("expr", a) for a in operands(node))
            else:
                kind, kids = "leaf", ()
            hit = self._index[key] = len(self.steps)
            self.steps.append((kind, node, kids))
        return hit

    def first_failing(self, bounds: Bounds, forms_only: bool = False) -> int | None:
        """The index of the first checked item some step of which leaves the bounds' limit, else None.

        A program of monotone steps first tries its leaves widened (:func:`_widened`), remembered per mask:
        a pass there is a pass here (every step's bounds only grow with its inputs', and every limit check
        is monotone in them), so binds whose segment lengths and per-segment values change from batch to
        batch mostly skip the walk. Only passes are taken from there: a failure walks the exact leaves."""
        end = (self.roots[self.forms - 1] if self.forms else 0) if forms_only else len(self.steps)
        if not self.monotone:
            return self._walk(bounds, end, None)
        distinct = [bounds.leaf(node) for node in self.distinct]
        widened = tuple(_widened(v, how) for v, how in zip(distinct, self.widen))
        key = (bounds.limit, bounds.padding, end, widened)
        passed = self._passed.get(key)
        if passed is None:
            if len(self._passed) >= _MEMO:
                self._passed.clear()
            passed = self._passed[key] = self._walk(bounds, end, [widened[i] for i in self.leaf_at]) is None
        if passed:
            return None
        return self._walk(bounds, end, [distinct[i] for i in self.leaf_at])

    def _walk(self, bounds: Bounds, end: int, leaves) -> int | None:
        """first_failing over the steps before ``end``, the leaves' bounds given in step order (else asked of
        ``bounds``)."""
        values: list = []
        combine: dict = {"lin": bounds.of_lin, "term": bounds.of_term, "expr": bounds.of_expr}
        given = iter(leaves) if leaves is not None else None
        try:
            for kind, node, kids in self.steps[:end]:
                if kind == "leaf":
                    values.append(next(given) if given is not None else bounds.leaf(node))
                else:
                    values.append(combine[kind](node, [values[i] for i in kids]))
        except _REFUSED:
            return next(i for i, end in enumerate(self.roots) if end > len(values))
        return None


_MEMO = 256         # widened leaf sets remembered per mask and limit


def _monotone(kind: str, node) -> bool:
    """Whether a step's bounds grow with its inputs' (inclusion-monotone, its limit checks monotone in them)
    and read nothing else: sums, products, quotients, min/max, squares and roots do; table reads and segment
    bounds read data, and bit operations' bounds are not monotone."""
    if kind == "term":
        return isinstance(node, (ir.Square, ir.Product, ir.Floor, ir.Extreme, ir.Root))
    if kind == "expr":
        return isinstance(node, (ir.Const, ir.Func)) or (isinstance(node, ir.Arith) and node.op not in ir.BIT_OPS)
    return True


def _widening(node) -> str:
    """How a leaf's bounds are widened for the memo: those that change with the batch's data (per-segment
    values, segment counts) to powers of two; positions, lengths and ints kept exact."""
    if isinstance(node, ir.SegValue) or (isinstance(node, ir.SegAttr) and node.attr == "index"):
        return "pow2"
    return "exact"


def _widened(bounds: tuple[int, int], how: str) -> tuple[int, int]:
    """``bounds`` (lo, hi) widened ``how`` (:func:`_widening`): a negative lo down to -(2**n - 1), a positive
    hi up to 2**n - 1."""
    if how == "exact":
        return bounds
    lo, hi = bounds
    return (-((1 << (-lo).bit_length()) - 1) if lo < 0 else lo, (1 << hi.bit_length()) - 1 if hi > 0 else hi)


def _checked_forms(ranges: ir.RangeMask):
    """(form, its region) for every form of the kernel's predicate, in order."""
    for region in ranges.allow + ranges.deny:
        for lin in region.forms:
            yield lin, region


def _program(resolved: ir.ResolvedMask | None, ranges: ir.RangeMask) -> _Program:
    """The mask's compiled check, kept on ``ranges`` (an immutable RangeMask) for the next binds; without
    ``resolved``, the forms' alone (kept apart: the forms of a kernel's element path, fits_32_bits)."""
    attr = "_width_program" if resolved is not None else "_width_forms_program"
    return ir.kept_on(ranges, attr, lambda: _Program(resolved, ranges), along=resolved)


def _refuse(mask_name: str, params: BatchParams, names: set[str], form: str, err: Exception, span, at: str):
    ints = dict(params.ints)
    named = [f"'{n}' = {ints[n]}" for n in sorted(names) if n in ints]
    who = f"parameter {', '.join(named)}" if named else "seq_len / kv_len"
    if isinstance(err, OutOfRange):
        which = "an index" if err.dim is None else ("its first index" if err.dim == 0 else "its second index")
        what = "entries" if err.dim is None else ("rows" if err.dim == 0 else "columns")
        raise BindError(f"with {who}{at}, {which} of table '{err.table}' in '{form}' in mask '{mask_name}' can "
                        f"reach {err.value}, but '{err.table}' has {err.count} {what} (indices 0 to "
                        f"{err.count - 1})", span, f"give '{err.table}' more {what}, or keep its index in range "
                        f"(clamp(i, 0, {err.count - 1}))") from None
    if isinstance(err, BadShift):
        raise BindError(f"with {who}{at}, a shift amount in '{form}' in mask '{mask_name}' can be {err.value}; "
                        f"shifts take 0 to {ir.MAX_SHIFT}", span) from None
    assert isinstance(err, TooWide)
    raise BindError(f"with {who}{at}, '{form}' in mask '{mask_name}' can reach {err.value}, beyond the 64-bit "
                    f"range maskc computes in (|x| <= 2**62)", span,
                    "use smaller values (bind's limit for each int parameter is 32 bits, and products "
                    "of them must stay within 2**62)") from None


_REFUSED = (TooWide, BadShift, OutOfRange)


def check_expr(mask_name: str, expr, params: BatchParams, seq_len: int, kv_len: int, batch_index: int,
               span, at: str = "") -> None:
    """Bind's check of one resolved expression (a segment origin) or condition before it is evaluated."""
    bounds = Bounds(params, seq_len, kv_len, 1, batch_index)
    try:
        bounds.expr(expr) if _is_expr(expr) else bounds.cond(expr)
    except _REFUSED as err:
        text = expr_text(expr) if _is_expr(expr) else (span.source_line.strip() if span and span.source_line
                                                        else "a condition")
        _refuse(mask_name, params, _params_in_expr(expr), text, err, span, at)


def _is_expr(node) -> bool:
    return isinstance(node, (ir.Const, ir.Pos, ir.Builtin, ir.ParamRef, ir.SegAttr, ir.SegValue, ir.TableAt,
                             ir.Arith, ir.Func))


def fits_32_bits(ranges: ir.RangeMask, params: BatchParams, seq_len: int, kv_len: int, heads: int,
                 batch_index: int, resolved: ir.ResolvedMask | None = None) -> bool:
    """Whether every intermediate of the kernel's forms fits in 32 bits, for q and k up to TILE_PADDING
    past their ends (the last tiles' rows and keys): the predicate may then be computed in int. With the
    ``resolved`` mask, from the steps :func:`check_bound` compiled; without, from a program of the forms alone
    (both remember their passes: :meth:`_Program.first_failing`)."""
    bounds = Bounds(params, seq_len, kv_len, heads, batch_index, NARROW_LIMIT, TILE_PADDING)
    try:
        if _program(resolved, ranges).first_failing(bounds, forms_only=True) is not None:
            return False
        _check_nests(ranges, bounds)
    except _REFUSED:
        return False
    return True


def _check_nests(ranges: ir.RangeMask, bounds: Bounds) -> None:
    """:func:`_check_nest` on every chunk nest of the mask. Its outcome is a function of the bounds' limit and
    padding, k's range and the nests' leaves' bounds alone, unless a nest reads a table's entries or a segment's
    bounds (data): elsewhere a pass is remembered per mask for those values, and a bind that gives the leaves the
    same bounds again (the same ints and lengths) skips the walk. Failures are never remembered."""
    nests = [r.chunks for r in ranges.allow + ranges.deny if r.chunks is not None]
    if not nests:
        return
    leaves = _nest_leaves(ranges, nests)
    key = None if leaves is None else (bounds.limit, bounds.padding, bounds.leaves["k"],
                                       tuple(bounds.leaf(t) for t in leaves))
    passed = ranges.__dict__.setdefault("_nests_passed", set())
    if key is not None and key in passed:
        return
    for nest in nests:
        _check_nest(nest, bounds)
    if key is not None:
        if len(passed) >= _MEMO:
            passed.clear()
        passed.add(key)


def _nest_leaves(ranges: ir.RangeMask, nests) -> tuple | None:
    """The leaves (positions, builtins, ints, segment attributes and values) every nest reads, in a fixed order,
    or None where one reads data beyond its leaves' bounds (a table entry, a segment bound); kept on ``ranges``."""
    def leaves() -> tuple | None:
        found: dict = {}
        data = False
        for nest in nests:
            lins = [g.lin for g in nest.guards]
            for level in nest.levels:
                lins += [b.lin for b in level.lower + level.upper]
                lins += [x for x in (level.offset, level.size) if x is not None]
            for lin in lins:
                for t in F.terms_of(lin):
                    data |= isinstance(t, (ir.Lookup, ir.SegBound))
                    if not isinstance(t, ir.HashOnce):
                        found.setdefault(t, None)
        return None if data else tuple(found)
    return ir.kept_on(ranges, "_nest_leaves", leaves)


def _check_nest(nest: ir.ChunkedKeys, bounds: Bounds) -> None:
    """Every intermediate of a chunk nest as the kernels' ``mask_chunks`` compute it (maskc.codegen.tile_bits),
    within the bounds' limit: each level's chunk index over its whole range (``(var + offset) // size`` from k's
    range up, and ``var + offset`` itself), then every bound of every level, the guards, offsets and sizes."""
    lo, hi = bounds.leaves["k"]
    for index, below in enumerate(nest.levels[:-1], start=1):
        assert below.offset is not None and below.size is not None
        offset, size = bounds.lin(below.offset), bounds.lin(below.size)
        shifted = (lo + offset[0], hi + offset[1])
        fit(*shifted, limit=bounds.limit)
        lo, hi = bounds.floor("//", shifted, size)
        bounds.chunks[index] = (lo, hi)
        fit(hi + 1, limit=bounds.limit)               # a loop's last step past its end
    for level in nest.levels:
        for b in level.lower + level.upper:
            value = bounds.lin(b.lin)
            fit(value[0] - b.den, value[1] + b.den, limit=bounds.limit)     # ceil and floor division by den
    for g in nest.guards:
        bounds.lin(g.lin)


def check_bound(resolved: ir.ResolvedMask, ranges: ir.RangeMask, params: BatchParams, seq_len: int,
                kv_len: int, heads: int, batch_index: int, at: str = "") -> None:
    """Every intermediate of the analysed forms and of the resolved rules fits (see module docstring).

    The steps are compiled once per mask (:class:`_Program`, kept on ``ranges``); a failure is then
    reported by walking the item that failed."""
    bounds = Bounds(params, seq_len, kv_len, heads, batch_index)
    if _program(resolved, ranges).first_failing(bounds) is None:
        return
    for rule in resolved.rules:         # shift amounts and table indices first, reported at the rule's text
        try:
            bounds.cond(rule.cond)
        except (BadShift, OutOfRange) as err:
            text = rule.span.source_line.strip() if rule.span.source_line else rule.kind
            _refuse(resolved.name, params, _params_in_expr(rule.cond), text, err, rule.span, at)
        except TooWide:
            pass                        # reported below, at the form that overflows
    for region in ranges.allow + ranges.deny:
        for lin in region.forms:
            try:
                bounds.lin(lin)
            except _REFUSED as err:
                _refuse(resolved.name, params, _params_in_lin(lin), F.render(lin), err, region.span, at)
    for rule in resolved.rules:
        try:
            bounds.cond(rule.cond)
        except _REFUSED as err:
            text = rule.span.source_line.strip() if rule.span.source_line else rule.kind
            _refuse(resolved.name, params, _params_in_expr(rule.cond), text, err, rule.span, at)
    raise AssertionError("the compiled width check failed where the walk does not")


def check_static(ranges: ir.RangeMask) -> ir.RangeMask:
    """Compile time: every coefficient and constant of the analysed forms fits in [-LIMIT, LIMIT]."""
    def numbers(lin: ir.Lin):
        yield lin.const
        for t, c in lin.terms:
            yield c
            for inner in F.inner_lins(t):
                yield from numbers(inner)

    for region in ranges.allow + ranges.deny:
        forms = [(b.lin, b.den) for b in region.lower + region.upper] + [
            (a.lin, 1) for a in region.guards + region.static_guards + region.opaque]
        for lin, den in forms:
            worst = max([abs(den)] + [abs(v) for v in numbers(lin)])
            if worst > LIMIT:
                raise MaskError(f"this rule folds to the constant {worst}, beyond the 64-bit range maskc computes "
                                "in (|x| <= 2**62)", region.span, "use smaller constants")
    return ranges
