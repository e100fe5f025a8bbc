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
- ``fits_32_bits(...)``, at bind: the same bounds against 32 bits, for positions a tile past the ends; a
  binding that passes gets the predicate in int (:attr:`~maskc.kernel_ir.BoundParams.narrow`). Past the
  ends, the kernel clamps table indices and shift amounts into range (their values there are never used),
  and so do these bounds.

LIMIT = 2**62 leaves head-room for the steps taken after a proven value (ceil division negates it,
modulo subtracts a product of the quotient).
"""
from __future__ import annotations

import math

from maskc import ir
from maskc.analysis import bitops
from maskc.analysis import linear as L
from maskc.errors import BindError, MaskError
from maskc.kernel_ir import BatchParams

LIMIT = 2 ** 62
NARROW_LIMIT = 2 ** 31 - 1
TILE_PADDING = 256      # positions a kernel's last tiles evaluate past seq_len and kv_len (tile sides <= 256)


class _TooWide(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value


class _BadShift(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value


class _OutOfRange(Exception):
    def __init__(self, table: str, value: int, count: int, dim: int | None = None):
        super().__init__(table, value, count)
        self.table, self.value, self.count, self.dim = table, value, count, dim


def _fit(*values: int, limit: int = LIMIT) -> None:
    for v in values:
        if abs(v) > limit:
            raise _TooWide(v)


def _params_in_lin(lin: ir.Lin) -> set[str]:
    out: set[str] = set()
    for t in L.terms_of(lin):
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


class _Bounds:
    """Interval bounds (lo, hi), as Python integers, of terms and expressions over the whole domain."""

    def __init__(self, params: BatchParams, seq_len: int, kv_len: int, heads: int, batch_index: int,
                 limit: int = LIMIT, padding: int = 0):
        self.padding = padding
        self.limit = limit
        self.params = params
        self.extent = max(seq_len, kv_len)
        self.leaves = {"q": (0, seq_len - 1 + padding), "k": (0, kv_len - 1 + padding), "h": (0, max(heads, 1) - 1),
                       "b": (batch_index, batch_index), "seq_len": (seq_len, seq_len), "kv_len": (kv_len, kv_len)}

    # -- leaves shared by both representations --------------------------------------------------
    def leaf(self, t) -> tuple[int, int]:
        if isinstance(t, ir.Pos):
            return self.leaves[t.which]
        if isinstance(t, ir.Builtin):
            return self.leaves[t.name]
        if isinstance(t, ir.ParamRef):
            v = self.params.int(t.name)
            return v, v
        if isinstance(t, ir.SegAttr):
            return self.segment_index(t) if t.attr == "index" else (0, self.extent)
        if isinstance(t, ir.SegValue):
            values = self.params.segment(t.seg).value(t.array)
            return (min(int(values.min()), 0), max(int(values.max()), 0)) if len(values) else (0, 0)
        raise TypeError(t)

    def segment_index(self, t: ir.SegAttr) -> tuple[int, int]:
        """The index of the segment holding q (or k): -1 only where positions lie outside the partitioned range
        (so a table may be read at ``docs.index(q)`` when the segments cover [0, seq_len))."""
        table = self.params.segment(t.seg)
        first, last = self.leaves[t.pos]
        bounds = table.bounds
        outside = first < bounds[0] or last >= bounds[-1]
        inside = table.count > 0 and first < bounds[-1] and last >= bounds[0]
        return (-1 if outside else 0), (table.count - 1 if inside else -1)

    def product(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        corners = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
        _fit(*corners, limit=self.limit)
        return min(corners), max(corners)

    def floor(self, op: str, num: tuple[int, int], den: tuple[int, int]) -> tuple[int, int]:
        mag = max(abs(num[0]), abs(num[1]))
        if den[0] < 1:            # bind refuses a divisor that is not positive; stay sound until then
            dmag = max(abs(den[0]), abs(den[1]))
            return (-mag, mag) if op == "//" else (-dmag, dmag)
        if op == "//":
            return min(num[0] // den[0], num[0] // den[1]), max(num[1] // den[0], num[1] // den[1])
        _fit(den[1] * (mag // den[0] + 1), limit=self.limit)      # the kernel's modulo subtracts den * quotient
        return 0, den[1] - 1

    def extreme(self, fn: str, args: list[tuple[int, int]]) -> tuple[int, int]:
        pick = min if fn == "min" else max
        return pick(lo for lo, _ in args), pick(hi for _, hi in args)

    def bits(self, op: str, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        if op in ("<<", ">>"):
            if self.padding:                     # past the ends the kernel clamps the amount
                b = (min(max(b[0], 0), ir.MAX_SHIFT), min(max(b[1], 0), ir.MAX_SHIFT))
            if b[0] < 0 or b[1] > ir.MAX_SHIFT:
                raise _BadShift(b[0] if b[0] < 0 else b[1])
            scale = (2 ** b[0], 2 ** b[1])       # x >> n == x // 2**n, x << n == x * 2**n
            return self.floor("//", a, scale) if op == ">>" else self.product(a, scale)
        lo, hi = bitops.interval(op, a, b)        # operands within LIMIT: the result fits in int64
        lo, hi = int(lo), int(hi)
        _fit(lo, hi, limit=self.limit)
        return lo, hi

    def lookup(self, name: str, index: tuple[int, int]) -> tuple[int, int]:
        table = self.params.table(name)
        if self.padding:                         # past the ends the kernel clamps the index into the table
            index = (min(max(index[0], 0), table.count - 1), min(max(index[1], 0), table.count - 1))
        if index[0] < 0 or index[1] >= table.count:
            raise _OutOfRange(name, index[0] if index[0] < 0 else index[1], table.count)
        values = table.values[index[0]:index[1] + 1]
        return int(values.min()), int(values.max())

    def lookup_at(self, name: str, indices: list[tuple[int, int]]) -> tuple[int, int]:
        """A table read as written: each index within its dimension (the head's too, for a table per h)."""
        table = self.params.table(name)
        if len(indices) == 1:
            return self.lookup(name, indices[0])
        for d, ((lo, hi), size) in enumerate(zip(indices, table.shape)):
            if lo < 0 or hi >= size:
                raise _OutOfRange(name, lo if lo < 0 else hi, size, d)
        rows = table.values.reshape(table.shape)[indices[0][0]:indices[0][1] + 1, indices[1][0]:indices[1][1] + 1]
        return int(rows.min()), int(rows.max())

    def seg_bound(self, seg: str, index: tuple[int, int]) -> tuple[int, int]:
        """Segment bounds are non-decreasing: the bounds at the clipped ends of the index's interval."""
        bounds = self.params.segment(seg).bounds
        n = len(bounds) - 1
        return int(bounds[min(max(index[0], 0), n)]), int(bounds[min(max(index[1], 0), n)])

    # -- analysed forms ---------------------------------------------------------------------------
    # -- combinations of proven children (shared by the recursive walk and the compiled check) ----------
    def of_lin(self, lin: ir.Lin, terms: list[tuple[int, int]]) -> tuple[int, int]:
        _fit(lin.const, limit=self.limit)
        lo = hi = lin.const
        partial = abs(lin.const)
        for (_, c), (tlo, thi) in zip(lin.terms, terms):
            a, b = sorted((c * tlo, c * thi))
            _fit(a, b, limit=self.limit)
            lo, hi = lo + a, hi + b
            partial += max(abs(a), abs(b))
            _fit(partial, limit=self.limit)       # every partial sum, in whatever order it is added
        return lo, hi

    def of_term(self, t, lins: list[tuple[int, int]]) -> tuple[int, int]:
        """A non-leaf term from its inner forms' (linear.inner_lins) bounds."""
        if isinstance(t, ir.Square):
            lo, hi = lins[0]
            top = max(lo * lo, hi * hi)
            _fit(top, limit=self.limit)
            return (0 if lo <= 0 <= hi else min(lo * lo, hi * hi)), top
        if isinstance(t, ir.Product):
            return self.product(lins[0], lins[1])
        if isinstance(t, ir.Floor):
            return self.floor(t.op, lins[0], lins[1])
        if isinstance(t, ir.Extreme):
            return self.extreme(t.fn, lins)
        if isinstance(t, ir.Root):                  # monotone; read only where its argument is >= 0
            lo, hi = lins[0]
            return math.isqrt(max(lo, 0)), math.isqrt(max(hi, 0))
        if isinstance(t, ir.Bits):
            return self.bits(t.op, lins[0], lins[1])
        if isinstance(t, ir.Lookup):
            return self.lookup(t.table, lins[0])
        if isinstance(t, ir.SegBound):
            return self.seg_bound(t.seg, lins[0])
        raise TypeError(t)

    def of_expr(self, e, args: list[tuple[int, int]]) -> tuple[int, int]:
        """A resolved expression that is not a leaf from its operands' (:func:`_operands`) bounds."""
        if isinstance(e, ir.Const):
            _fit(e.value, limit=self.limit)
            return e.value, e.value
        if isinstance(e, ir.Func):
            if e.fn == "abs":
                lo, hi = args[0]
                return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
            return self.extreme(e.fn, args)
        if isinstance(e, ir.TableAt):             # the indices' bounds, then the strides' (unused here)
            return self.lookup_at(e.table, args[:len(e.indices)])
        a, b = args
        if e.op == "*":
            return self.product(a, b)
        if e.op in ("//", "%"):
            return self.floor(e.op, a, b)
        if e.op in ir.BIT_OPS:
            return self.bits(e.op, a, b)
        out = (a[0] + b[0], a[1] + b[1]) if e.op == "+" else (a[0] - b[1], a[1] - b[0])
        _fit(*out, limit=self.limit)
        return out

    # -- the recursive walk -----------------------------------------------------------------------------
    def lin(self, lin: ir.Lin) -> tuple[int, int]:
        return self.of_lin(lin, [self.term(t) for t, _ in lin.terms])

    def term(self, t) -> tuple[int, int]:
        if isinstance(t, ir._HashOnce):
            return self.of_term(t, [self.lin(a) for a in L.inner_lins(t)])
        return self.leaf(t)

    def expr(self, e) -> tuple[int, int]:
        if isinstance(e, _COMPOUND_EXPRS):
            return self.of_expr(e, [self.expr(a) for a in _operands(e)])
        return self.leaf(e)

    def cond(self, c) -> None:
        for e in _cond_exprs(c):
            self.expr(e)


_COMPOUND_EXPRS = (ir.Const, ir.Func, ir.Arith, ir.TableAt)     # what of_expr combines (the rest are leaves)


def _operands(e) -> tuple:
    if isinstance(e, ir.Func):
        return e.args
    if isinstance(e, ir.Arith):
        return (e.left, e.right)
    return e.indices + e.strides if isinstance(e, ir.TableAt) else ()


def _cond_exprs(c):
    """The expressions a condition compares, left to right."""
    if isinstance(c, ir.Cmp):
        yield c.left
        yield c.right
    elif isinstance(c, ir.Negate):
        yield from _cond_exprs(c.item)
    elif isinstance(c, (ir.All, ir.Any_)):
        for item in c.items:
            yield from _cond_exprs(item)


class _Program:
    """The interval arithmetic of check_bound and fits_32_bits for one mask, compiled once: every distinct
    form, term and resolved expression (by value) as a step, children before parents, so that a bind
    evaluates each once. The checked items are the kernel's forms (``forms`` of them), then the rules;
    ``roots[i]`` is the number of steps the first i + 1 items need."""

    def __init__(self, resolved: ir.ResolvedMask, ranges: ir.RangeMask):
        self.steps: list[tuple[str, object, tuple[int, ...]]] = []
        self._index: dict = {}
        self.roots: list[int] = []
        for lin, _ in _checked_forms(ranges):
            self._add("lin", lin)
            self.roots.append(len(self.steps))
        self.forms = len(self.roots)
        for rule in resolved.rules:
            for e in _cond_exprs(rule.cond):
                self._add("expr", e)
            self.roots.append(len(self.steps))

    def _add(self, kind: str, node) -> int:
        key = (kind, node)
        hit = self._index.get(key)
        if hit is None:
            if kind == "lin":
                kids = tuple(self._add("term", t) for t, _ in node.terms)
            elif kind == "term" and isinstance(node, ir._HashOnce):
                kids = tuple(self._add("lin", a) for a in L.inner_lins(node))
            elif kind == "expr" and isinstance(node, _COMPOUND_EXPRS):
                kids = tuple(self._add("expr", a) for a in _operands(node))
            else:
                kind, kids = "leaf", ()
            hit = self._index[key] = len(self.steps)
            self.steps.append((kind, node, kids))
        return hit

    def first_failing(self, bounds: _Bounds, forms_only: bool = False) -> int | None:
        """The index of the first checked item some step of which leaves the bounds' limit, else None."""
        values: list = []
        combine: dict = {"lin": bounds.of_lin, "term": bounds.of_term, "expr": bounds.of_expr}
        end = (self.roots[self.forms - 1] if self.forms else 0) if forms_only else len(self.steps)
        try:
            for kind, node, kids in self.steps[:end]:
                values.append(bounds.leaf(node) if kind == "leaf" else combine[kind](node, [values[i] for i in kids]))
        except _REFUSED:
            return next(i for i, end in enumerate(self.roots) if end > len(values))
        return None


def _checked_forms(ranges: ir.RangeMask):
    """(form, its region) for every form of the kernel's predicate, in order."""
    for region in ranges.allow + ranges.deny:
        for lin in region.forms:
            yield lin, region


def _program(resolved: ir.ResolvedMask, ranges: ir.RangeMask) -> _Program:
    """The mask's compiled check, kept on ``ranges`` (an immutable RangeMask) for the next binds."""
    cached = ranges.__dict__.get("_width_program")
    if cached is None or cached[0] is not resolved:
        cached = (resolved, _Program(resolved, ranges))
        object.__setattr__(ranges, "_width_program", cached)
    return cached[1]


def _refuse(mask_name: str, params: BatchParams, names: set[str], form: str, err: Exception, span, at: str):
    ints = dict(params.ints)
    named = [f"'{n}' = {ints[n]}" for n in sorted(names) if n in ints]
    who = f"parameter {', '.join(named)}" if named else "seq_len / kv_len"
    if isinstance(err, _OutOfRange):
        which = "an index" if err.dim is None else ("its first index" if err.dim == 0 else "its second index")
        what = "entries" if err.dim is None else ("rows" if err.dim == 0 else "columns")
        raise BindError(f"with {who}{at}, {which} of table '{err.table}' in '{form}' in mask '{mask_name}' can "
                        f"reach {err.value}, but '{err.table}' has {err.count} {what} (indices 0 to "
                        f"{err.count - 1})", span, f"give '{err.table}' more {what}, or keep its index in range "
                        f"(clamp(i, 0, {err.count - 1}))") from None
    if isinstance(err, _BadShift):
        raise BindError(f"with {who}{at}, a shift amount in '{form}' in mask '{mask_name}' can be {err.value}; "
                        f"shifts take 0 to {ir.MAX_SHIFT}", span) from None
    assert isinstance(err, _TooWide)
    raise BindError(f"with {who}{at}, '{form}' in mask '{mask_name}' can reach {err.value}, beyond the 64-bit "
                    f"range maskc computes in (|x| <= 2**62)", span,
                    "use smaller values (bind's limit for each int parameter is 32 bits, and products "
                    "of them must stay within 2**62)") from None


_REFUSED = (_TooWide, _BadShift, _OutOfRange)


def check_expr(mask_name: str, expr, params: BatchParams, seq_len: int, kv_len: int, batch_index: int,
               span, at: str = "") -> None:
    """Bind's check of one resolved expression (a segment origin) or condition before it is evaluated."""
    bounds = _Bounds(params, seq_len, kv_len, 1, batch_index)
    try:
        bounds.expr(expr) if _is_expr(expr) else bounds.cond(expr)
    except _REFUSED as err:
        from maskc.explain import expr_text
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
    ``resolved`` mask, from the steps :func:`check_bound` compiled."""
    bounds = _Bounds(params, seq_len, kv_len, heads, batch_index, NARROW_LIMIT, TILE_PADDING)
    if resolved is not None:
        return _program(resolved, ranges).first_failing(bounds, forms_only=True) is None
    try:
        for lin, _ in _checked_forms(ranges):
            bounds.lin(lin)
    except _REFUSED:
        return False
    return True


def check_bound(resolved: ir.ResolvedMask, ranges: ir.RangeMask, params: BatchParams, seq_len: int,
                kv_len: int, heads: int, batch_index: int, at: str = "") -> None:
    """Every intermediate of the analysed forms and of the resolved rules fits (see module docstring).

    The steps are compiled once per mask (:class:`_Program`, kept on ``ranges``); a failure is then
    reported by walking the item that failed."""
    bounds = _Bounds(params, seq_len, kv_len, heads, batch_index)
    if _program(resolved, ranges).first_failing(bounds) is None:
        return
    for rule in resolved.rules:         # shift amounts and table indices first, reported at the rule's text
        try:
            bounds.cond(rule.cond)
        except (_BadShift, _OutOfRange) as err:
            text = rule.span.source_line.strip() if rule.span.source_line else rule.kind
            _refuse(resolved.name, params, _params_in_expr(rule.cond), text, err, rule.span, at)
        except _TooWide:
            pass                        # reported below, at the form that overflows
    for region in ranges.allow + ranges.deny:
        for lin in region.forms:
            try:
                bounds.lin(lin)
            except _REFUSED as err:
                _refuse(resolved.name, params, _params_in_lin(lin), L.render(lin), err, region.span, at)
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
            for inner in L.inner_lins(t):
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
