"""Pass 2, resolve: syntax trees → :class:`~maskc.ir.ResolvedMask` (names, types, arity).

Invariant: every name in the result is a built-in (q, k, seq_len, kv_len, h, b) or a parameter of
the mask itself; ``let`` bindings, ``clamp``, ``~`` and calls of other masks (from this file or an
imported one) are inlined; integer expressions and conditions are distinct node types; segment attributes
and per-segment arrays are read at q or k only, tables at any integer expression (a per-head parameter
at h); divisors are free of q and k; exponents are literal; shift amounts that are constant lie in
[0, MAX_SHIFT]; no expression nests more than ``MAX_NESTING`` levels deep, once lets, mask calls and powers
are expanded (the later passes recurse on it). A mask that cannot satisfy this raises one
:class:`~maskc.errors.MaskError` at the offending text.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from maskc import ir
from maskc.errors import ComplexityError, MaskError, MaskNameError, MaskTypeError, Span, did_you_mean
from maskc.frontend.parse import MAX_NESTING
from maskc.frontend.score import float_param, resolve_score

_FUNCTIONS = {"min": (2, None), "max": (2, None), "abs": (1, 1), "clamp": (3, 3), "same": (1, 2)}
_MAX_EXPONENT = 8
MAX_CALL_DEPTH = 16          # masks calling masks calling masks...: resolve recurses once per level
_MAX_STEPS = 2 * MAX_NESTING     # resolve's own recursion: a let's name and its value are two steps
MAX_EXPANDED_NODES = 20_000
"""The largest rule, in expression nodes once its lets and mask calls are written out (and the most nodes
one resolution may build): a let used twice is copied twice, so a chain of lets that each use the last
one twice doubles at every step. Past it, a :class:`~maskc.errors.ComplexityError` at the rule."""
_INT32_MAX = 2 ** 31 - 1


@dataclass(frozen=True)
class Program:
    """The files a resolution may look in: the main file first, then its imports (transitively)."""

    files: tuple[ir.SourceFile, ...]

    @property
    def main(self) -> ir.SourceFile:
        return self.files[0]


class _TooLarge(Exception):
    """Resolution built more than MAX_EXPANDED_NODES nodes (turned into a ComplexityError at the rule)."""


@dataclass(frozen=True)
class _Let:
    args: tuple[str, ...]
    value: ir.Syntax
    scope: "_Scope"
    span: Span


@dataclass(frozen=True)
class _Scope:
    """What a name means where it is used: a bound IntExpr, a let, or a parameter of the mask."""

    values: tuple[tuple[str, object], ...]   # innermost last
    mask: ir.MaskDecl

    def lookup(self, name: str):
        for key, value in reversed(self.values):
            if key == name:
                return value
        return None

    def bind(self, name: str, value) -> "_Scope":
        return _Scope(self.values + ((name, value),), self.mask)

    def names(self):
        return [k for k, _ in self.values]


def _is_int(node) -> bool:
    return isinstance(node, (ir.Const, ir.Pos, ir.Builtin, ir.ParamRef, ir.SegAttr, ir.SegValue, ir.TableAt, ir.Arith,
                             ir.Func))


def _children(node) -> tuple:
    if isinstance(node, (ir.Arith, ir.Cmp)):
        return (node.left, node.right)
    if isinstance(node, ir.TableAt):
        return node.indices
    if isinstance(node, ir.Func):
        return node.args
    if isinstance(node, (ir.All, ir.Any_)):
        return node.items
    if isinstance(node, ir.Negate):
        return (node.item,)
    return ()


def nodes(node):
    """Every sub-node of a resolved expression, each once: resolved expressions are DAGs (a let's
    argument is shared by each of its uses), and a walk of the tree could take exponential time."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(_children(n))


def mentions(node, predicate) -> bool:
    """Whether any sub-node of a resolved expression satisfies ``predicate``."""
    return any(predicate(n) for n in nodes(node))


def expanded_size(node) -> int:
    """The number of nodes of a resolved expression written out as a tree (what the passes after
    resolve walk), counted on its DAG in time linear in the DAG."""
    sizes: dict[int, int] = {}
    stack = [node]
    while stack:
        n = stack[-1]
        if id(n) in sizes:
            stack.pop()
            continue
        pending = [c for c in _children(n) if id(c) not in sizes]
        if pending:
            stack.extend(pending)
            continue
        stack.pop()
        sizes[id(n)] = 1 + sum(sizes[id(c)] for c in _children(n))
    return sizes[id(node)]


def nesting(node) -> int:
    """The depth of a resolved expression or condition, counted without recursion (shared sub-trees
    once: a let used twice is one sub-tree)."""
    children = _children
    depth: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(node, False)]
    while stack:
        n, expanded = stack.pop()
        if id(n) in depth:
            continue
        kids = children(n)
        if expanded or not kids:
            depth[id(n)] = 1 + max((depth[id(c)] for c in kids), default=0)
        else:
            stack.append((n, True))
            stack.extend((c, False) for c in kids if id(c) not in depth)
    return depth[id(node)]


def depends_on_position(node) -> bool:
    return mentions(node, lambda n: isinstance(n, (ir.Pos, ir.SegAttr, ir.SegValue)))


class _Resolver:
    def __init__(self, program: Program):
        self.program = program
        self.done: dict[tuple[str, str], ir.ResolvedMask] = {}
        self.active: list[tuple[str, str]] = []
        self._depth = 0                 # of _any calls in progress: nesting, through lets and mask calls
        self.call_depth: dict[tuple[str, str], int] = {}    # 1 + the deepest chain of masks a mask calls
        self._callees: list[int] = []   # per mask being resolved: the deepest call_depth among its callees
        self.built = 0          # nodes built for the rule being resolved, against MAX_EXPANDED_NODES
        self._check_duplicates()

    # -- lookup of masks across files --------------------------------------------------------
    def _check_duplicates(self):
        for f in self.program.files:
            seen: dict[str, ir.MaskDecl] = {}
            for m in f.masks:
                if m.name in seen:
                    raise MaskNameError(f"mask '{m.name}' is defined twice in this file (first at "
                                        f"line {seen[m.name].span.line})", m.span)
                seen[m.name] = m

    def find_mask(self, name: str, here: ir.SourceFile) -> tuple[ir.SourceFile, ir.MaskDecl] | None:
        for m in here.masks:
            if m.name == name:
                return here, m
        for f in self.program.files:
            for m in f.masks:
                if m.name == name:
                    return f, m
        return None

    def all_mask_names(self):
        return [m.name for f in self.program.files for m in f.masks]

    # -- masks -------------------------------------------------------------------------------
    def resolve_mask(self, file: ir.SourceFile, decl: ir.MaskDecl) -> ir.ResolvedMask:
        key = (file.path, decl.name)
        if key in self.done:
            return self.done[key]
        if key in self.active:
            raise MaskNameError(f"mask '{decl.name}' uses itself", decl.span)
        self.active.append(key)
        self._callees.append(0)
        try:
            params = self._params(decl)
            scope = _Scope((), decl)
            for p in params:
                scope = scope.bind(p.name, p)
            for let in decl.lets:
                if let.name in ir.POSITIONS + ir.BUILTINS or any(p.name == let.name for p in params):
                    raise MaskNameError(f"'{let.name}' is already a {'parameter' if scope.lookup(let.name) else 'built-in'} "
                                        "and cannot be redefined", let.span)
                scope = scope.bind(let.name, _Let(let.args, let.value, scope, let.span))
            rules = tuple(ir.Rule(r.kind, self._rule_cond(r, scope, file), r.span) for r in decl.rules)
            for r in rules:
                if nesting(r.cond) > MAX_NESTING:
                    raise MaskTypeError(f"this rule nests more than {MAX_NESTING} levels deep once its lets, mask "
                                        "calls and powers are expanded", r.span,
                                        f"maskc takes at most {MAX_NESTING} levels of nesting")
                if r.kind == "require" and mentions(r.cond, lambda n: (isinstance(n, ir.Pos) and n.which == "k")
                                                    or (isinstance(n, (ir.SegAttr, ir.SegValue)) and n.pos == "k")):
                    raise MaskTypeError("a 'require' check is made for every query position q; it cannot use k",
                                        r.span)
            if not any(r.kind == "allow" for r in rules):
                raise MaskError(f"mask '{decl.name}' has no 'allow' rule, so it shows nothing", decl.span)
            result = ir.ResolvedMask(decl.name, params, rules, decl.span, resolve_score(self, decl, scope, file))
            self.call_depth[key] = 1 + self._callees[-1]
        finally:
            self.active.pop()
            self._callees.pop()
        self.done[key] = result
        return result

    def _params(self, decl: ir.MaskDecl) -> tuple[ir.Param, ...]:
        out: list[ir.Param] = []
        for p in decl.params:
            if p.name in ir.POSITIONS + ir.BUILTINS:
                raise MaskNameError(f"'{p.name}' is a built-in and cannot be a parameter", p.span)
            if any(o.name == p.name for o in out):
                raise MaskNameError(f"parameter '{p.name}' is declared twice", p.span)
            scope = _Scope(tuple((o.name, o) for o in out), decl)
            if p.kind in ir.FLOAT_KINDS:
                out.append(float_param(self, p, scope))
            elif p.kind in ("int", "const"):
                default = None
                if p.default is not None:
                    default = self._constant(p.default, scope)
                out.append(ir.Param(p.name, "int", default, const=p.kind == "const", span=p.span))
            elif p.kind == "segments":
                if p.default is not None:
                    raise MaskTypeError("segments take no default", p.default.span)
                origin = None
                if p.origin is not None:
                    origin = self._int(p.origin, scope, None)
                    if depends_on_position(origin):
                        raise MaskTypeError("where segments start cannot depend on q or k", p.origin.span)
                    if mentions(origin, lambda n: isinstance(n, ir.TableAt) or (isinstance(n, ir.Builtin) and
                                                                                 n.name in ("h", "b"))):
                        raise MaskTypeError("where segments start reads int parameters, seq_len and kv_len only",
                                            p.origin.span)
                if p.over not in ir.POSITIONS:
                    raise MaskTypeError(f"segments are over q (the queries, [0, seq_len)) or k (the keys, "
                                        f"[0, kv_len)), not '{p.over}'", p.span, "write 'segments over k'")
                out.append(ir.Param(p.name, "segments", origin=origin, over=p.over, span=p.span))
            elif p.kind == "table":
                if p.default is not None:
                    raise MaskTypeError("a table takes no default (its length is its value's)", p.default.span,
                                        "a table per head takes one: 'w: per h = 4'")
                if p.of is not None and p.of != "h":
                    raise MaskTypeError(f"a table is per h (one row per head), not per {p.of}", p.span,
                                        f"'per {p.of}' alone gives one integer per segment of '{p.of}'")
                shape = None if p.sizes is None else tuple(self._size(e, scope) for e in p.sizes)
                if p.of == "h" and shape is None:
                    raise MaskTypeError("a table per head needs its length declared, as 't: per h table[n]'", p.span)
                if shape is not None and len(shape) > 2:
                    raise MaskTypeError(f"a table has one or two indices, not {len(shape)}", p.span)
                out.append(ir.Param(p.name, "table", of=p.of, shape=shape, span=p.span))
            elif p.of == "h":           # one value per head: a table indexed by h
                default = None if p.default is None else self._constant(p.default, scope)
                out.append(ir.Param(p.name, "table", default, of="h", span=p.span))
            else:
                seg = next((o for o in out if o.name == p.of), None)
                if seg is None or seg.kind != "segments":
                    known = [o.name for o in out if o.kind == "segments"]
                    raise MaskNameError(f"'per {p.of}' needs a segments parameter '{p.of}' declared before it",
                                        p.span, did_you_mean(p.of or "", known) or "'per h' gives one value per head")
                default = None if p.default is None else self._constant(p.default, scope)
                out.append(ir.Param(p.name, "per", default, of=p.of, span=p.span))
        return tuple(out)

    def _size(self, node, scope) -> ir.IntExpr:
        """A table's declared size: an expression of int parameters (declared before), seq_len and kv_len."""
        size = self._int(node, scope, None)
        if depends_on_position(size) or mentions(size, lambda n: isinstance(n, ir.TableAt) or (
                isinstance(n, ir.Builtin) and n.name in ("h", "b"))):
            raise MaskTypeError("a table's size reads int parameters, seq_len and kv_len only", node.span)
        return size

    def _constant(self, node, scope) -> int:
        """A default value: any integer expression of literals (``-2``, ``4 * 1024``)."""
        from maskc.analysis import linear
        value = linear.from_expr(self._int(node, scope, None))
        if not linear.is_const(value):
            raise MaskTypeError("a default must be a number", node.span)
        return value.const

    # -- conditions --------------------------------------------------------------------------
    def _rule_cond(self, rule: ir.RuleDecl, scope: _Scope, file) -> ir.Cond:
        """A rule's condition, refused past MAX_EXPANDED_NODES (built, or written out as a tree)."""
        saved, self.built = self.built, 0          # a called mask's rules count on their own
        try:
            cond = self._conjunction(rule.conditions, scope, file, rule.span)
        except _TooLarge:
            cond = None
        finally:
            self.built = saved
        if cond is None or expanded_size(cond) > MAX_EXPANDED_NODES:
            raise ComplexityError(f"this rule grows past {MAX_EXPANDED_NODES} expression nodes once its lets and "
                                  "mask calls are expanded", rule.span,
                                  "a let is copied at every use: a chain of lets that each use the one before "
                                  "twice doubles in size at every step") from None
        return cond

    def _conjunction(self, conds, scope, file, span) -> ir.Cond:
        items = tuple(self._cond(c, scope, file) for c in conds)
        return items[0] if len(items) == 1 else ir.All(items, span)

    def _cond(self, node: ir.Syntax, scope: _Scope, file) -> ir.Cond:
        out = self._any(node, scope, file)
        if _is_int(out):
            raise MaskTypeError("a number is not a condition", node.span,
                                "compare it, e.g. 'k <= q'")
        return out

    def _int(self, node: ir.Syntax, scope: _Scope, file) -> ir.IntExpr:
        out = self._any(node, scope, file)
        if not _is_int(out):
            raise MaskTypeError("expected a number here, found a condition", node.span)
        return out

    def _any(self, node: ir.Syntax, scope: _Scope, file):
        self.built += 1
        if self.built > MAX_EXPANDED_NODES:
            raise _TooLarge
        method = getattr(self, "_" + type(node).__name__)
        if self._depth >= _MAX_STEPS:
            raise MaskTypeError("this expression nests too deeply once lets and mask calls are substituted",
                                node.span, f"maskc follows at most {_MAX_STEPS} lets, calls and operators "
                                "inside one another")
        self._depth += 1
        try:
            return method(node, scope, file)
        finally:
            self._depth -= 1

    def _BoolLit(self, node, scope, file):
        return ir.Truth(node.value, node.span)

    def _BoolOp(self, node, scope, file):
        items = tuple(self._cond(o, scope, file) for o in node.operands)
        return (ir.All if node.op == "and" else ir.Any_)(items, node.span)

    def _Not(self, node, scope, file):
        return ir.Negate(self._cond(node.operand, scope, file), node.span)

    def _Compare(self, node, scope, file):
        values = [self._int(o, scope, file) for o in node.operands]
        cmps = tuple(ir.Cmp(op, a, b, node.span) for op, a, b in zip(node.ops, values, values[1:]))
        return cmps[0] if len(cmps) == 1 else ir.All(cmps, node.span)

    def _InRange(self, node, scope, file):
        value = self._int(node.value, scope, file)
        low, high = self._int(node.low, scope, file), self._int(node.high, scope, file)
        cond = ir.All((ir.Cmp("<=" if node.low_closed else "<", low, value, node.span),
                       ir.Cmp("<=" if node.high_closed else "<", value, high, node.span)), node.span)
        return ir.Negate(cond, node.span) if node.negated else cond

    # -- integer expressions -----------------------------------------------------------------
    def _Num(self, node, scope, file):
        if node.value > _INT32_MAX:      # the kernel computes in 32 bits (64 for squares and products)
            raise MaskTypeError("this number does not fit in 32 bits", node.span)
        return ir.Const(node.value, node.span)

    def _FloatNum(self, node, scope, file):
        raise MaskTypeError("masks compute on integers: a float is read only by a score modifier", node.span,
                            "e.g. 'score = softcap(score, 30.0)'")

    def _UnaryMinus(self, node, scope, file):
        return ir.Arith("-", ir.Const(0, node.span), self._int(node.operand, scope, file), node.span)

    def _Invert(self, node, scope, file):       # ~x == -x - 1, as in Python
        return ir.Arith("-", ir.Const(-1, node.span), self._int(node.operand, scope, file), node.span)

    def _Subscript(self, node, scope, file):
        table = scope.lookup(node.table)
        if not (isinstance(table, ir.Param) and table.kind == "table"):
            known = [n for n, v in scope.values if isinstance(v, ir.Param) and v.kind == "table"]
            what = f"a {table.kind} parameter" if isinstance(table, ir.Param) else \
                "a let" if isinstance(table, _Let) else "not a parameter"
            raise MaskTypeError(f"'{node.table}' is {what}, not a table: only tables are indexed with [...]",
                                node.span, did_you_mean(node.table, known) or "declare it 't: table'")
        if len(node.indices) != table.dims:
            raise MaskTypeError(f"'{node.table}' takes {table.dims} ind{'ex' if table.dims == 1 else 'ices'}, "
                                f"got {len(node.indices)}", node.span,
                                "a table per head reads this head's row: t[i] is t's entry i for head h"
                                if table.of == "h" else None)
        indices = tuple(self._int(i, scope, file) for i in node.indices)
        return table_at(table, indices, node.span)

    def _BinOp(self, node, scope, file):
        if node.op == "/":
            raise MaskTypeError("'/' divides floats, in score modifiers only", node.span,
                                "integer division, floored as in Python, is '//'")
        left = self._int(node.left, scope, file)
        right = self._int(node.right, scope, file)
        if node.op == "**":
            if not isinstance(right, ir.Const) or not 0 <= right.value <= _MAX_EXPONENT:
                raise MaskTypeError(f"an exponent must be a literal from 0 to {_MAX_EXPONENT}", node.right.span)
            if right.value == 0:
                return ir.Const(1, node.span)
            out = left
            for _ in range(right.value - 1):
                out = ir.Arith("*", out, left, node.span)
            return out
        if node.op in ("//", "%") and depends_on_position(right):
            raise MaskTypeError(f"the right side of '{node.op}' cannot depend on q or k", node.right.span,
                                "divide by a number or a parameter")
        if node.op in ("<<", ">>"):
            from maskc.analysis import linear
            amount = linear.from_expr(right)
            if linear.is_const(amount) and not 0 <= amount.const <= ir.MAX_SHIFT:
                raise MaskTypeError(f"a shift amount must be from 0 to {ir.MAX_SHIFT}; this one is {amount.const}",
                                    node.right.span, "every value maskc computes fits in 63 bits")
        return ir.Arith(node.op, left, right, node.span)

    def _Name(self, node, scope, file):
        if node.id in ir.POSITIONS:
            return ir.Pos(node.id, node.span)
        if node.id in ir.BUILTINS:
            return ir.Builtin(node.id, node.span)
        bound = scope.lookup(node.id)
        if bound is None:
            known = list(ir.POSITIONS + ir.BUILTINS) + scope.names()
            raise MaskNameError(f"unknown name '{node.id}'", node.span, did_you_mean(node.id, known))
        if isinstance(bound, ir.Param):
            if bound.kind == "int":
                return ir.ParamRef(bound.name, node.span)
            if bound.kind in ir.FLOAT_KINDS:
                raise MaskTypeError(f"'{node.id}' is a float parameter: only a score modifier reads it", node.span,
                                    f"e.g. 'score = score - {node.id} * (q - k)'")
            if bound.kind == "table" and bound.dims == 0:            # this head's value
                return table_at(bound, (), node.span)
            use = "same(" + bound.name + ") or " + bound.name + ".start(q)" if bound.kind == "segments" \
                else bound.name + "[i]" if bound.kind == "table" else bound.name + "(q)"
            raise MaskTypeError(f"'{node.id}' is a {bound.kind} parameter, not a number", node.span,
                                f"use {use}")
        if isinstance(bound, _Let):
            if bound.args:
                raise MaskTypeError(f"'{node.id}' takes {len(bound.args)} argument(s)", node.span,
                                    f"write {node.id}({', '.join(bound.args)})")
            return self._any(bound.value, bound.scope, file)
        return bound   # an argument of a let function: an already resolved IntExpr

    def _MethodCall(self, node, scope, file):
        seg = scope.lookup(node.obj)
        if not (isinstance(seg, ir.Param) and seg.kind == "segments"):
            segs = [n for n, v in scope.values if isinstance(v, ir.Param) and v.kind == "segments"]
            raise MaskNameError(f"'{node.obj}' is not a segments parameter", node.span, did_you_mean(node.obj, segs))
        if node.method not in ir.SEGMENT_ATTRS:
            raise MaskNameError(f"segments have no attribute '{node.method}'", node.span,
                                did_you_mean(node.method, ir.SEGMENT_ATTRS) or
                                "they have " + ", ".join(ir.SEGMENT_ATTRS))
        pos = self._position_arg(node, scope, file, f"{node.obj}.{node.method}")
        return ir.SegAttr(seg.name, node.method, pos, node.span)

    def _position_arg(self, node, scope, file, what: str) -> str:
        if len(node.args) != 1 or node.args[0].name is not None:
            raise MaskTypeError(f"{what} takes one position, q or k", node.span)
        value = self._int(node.args[0].value, scope, file)
        if not isinstance(value, ir.Pos):
            raise MaskTypeError(f"{what} takes q or k, not an expression", node.args[0].span)
        return value.which

    def _Call(self, node, scope, file):
        bound = scope.lookup(node.func)
        if isinstance(bound, _Let):
            return self._call_let(node, bound, scope, file)
        if isinstance(bound, ir.Param):
            if bound.kind != "per":
                raise MaskTypeError(f"'{node.func}' is a{'n' if bound.kind == 'int' else ''} {bound.kind} "
                                    "parameter and cannot be called", node.span,
                                    (f"write {node.func}[...] to read an entry" if bound.of is None else
                                     f"write {node.func}: it is this head's value") if bound.kind == "table"
                                    else None)
            pos = self._position_arg(node, scope, file, node.func)
            return ir.SegValue(bound.name, bound.of, pos, node.span)
        if node.func in _FUNCTIONS:
            return self._call_builtin(node, scope, file)
        found = self.find_mask(node.func, file or self.program.main)
        if found is not None:
            return self._call_mask(node, found, scope, file)
        known = list(_FUNCTIONS) + [n for n, v in scope.values if isinstance(v, _Let) or
                                    (isinstance(v, ir.Param) and v.kind == "per")] + self.all_mask_names()
        raise MaskNameError(f"unknown function or mask '{node.func}'", node.span, did_you_mean(node.func, known))

    def _call_let(self, node, let: _Let, scope, file):
        if len(node.args) != len(let.args) or any(a.name for a in node.args):
            raise MaskTypeError(f"'{node.func}' takes {len(let.args)} positional argument(s), "
                                f"got {len(node.args)}", node.span)
        inner = let.scope
        for name, arg in zip(let.args, node.args):
            inner = inner.bind(name, self._int(arg.value, scope, file))
        return self._any(let.value, inner, file)

    def _call_builtin(self, node, scope, file):
        lo, hi = _FUNCTIONS[node.func]
        n = len(node.args)
        named = next((a for a in node.args if a.name), None)
        if named is not None:
            raise MaskTypeError(f"{node.func}() takes no keyword arguments", named.span)
        if n < lo or (hi is not None and n > hi):
            count = f"{lo}" if lo == hi else f"at least {lo}"
            raise MaskTypeError(f"{node.func}() takes {count} positional argument(s), got {n}", node.span)
        if node.func == "same":
            segs = []
            for a in node.args:
                seg = scope.lookup(a.value.id) if isinstance(a.value, ir.Name) else None
                if not (isinstance(seg, ir.Param) and seg.kind == "segments"):
                    raise MaskTypeError("same() takes a segments parameter (q's), and optionally a second (k's)",
                                        a.value.span)
                segs.append(seg.name)
            return ir.Same(segs[0], segs[1] if len(segs) > 1 and segs[1] != segs[0] else None, node.span)
        args = tuple(self._int(a.value, scope, file) for a in node.args)
        if node.func == "clamp":
            value, low, high = args
            return ir.Func("min", (ir.Func("max", (value, low), node.span), high), node.span)
        if node.func in ("min", "max") and len(args) > 2:   # keep the IR binary
            out = args[0]
            for a in args[1:]:
                out = ir.Func(node.func, (out, a), node.span)
            return out
        return ir.Func(node.func, args, node.span)

    def _call_mask(self, node, found, scope, file):
        callee_file, decl = found
        key = (callee_file.path, decl.name)
        if len(self.active) >= MAX_CALL_DEPTH or self.call_depth.get(key, 0) >= MAX_CALL_DEPTH:
            raise MaskTypeError(f"masks call one another more than {MAX_CALL_DEPTH} deep here", node.span,
                                f"maskc takes chains of at most {MAX_CALL_DEPTH} masks, each calling the next")
        callee = self.resolve_mask(callee_file, decl)
        self._callees[-1] = max(self._callees[-1], self.call_depth[key])
        mapping: dict[str, object] = {}
        tables: dict[str, ir.Param] = {}          # the caller's tables passed in: their shapes give the strides
        positional = [a for a in node.args if a.name is None]
        keywords = {a.name: a for a in node.args if a.name is not None}
        if len(positional) > len(callee.params):
            raise MaskTypeError(f"mask '{callee.name}' takes {len(callee.params)} argument(s), "
                                f"got {len(node.args)}", node.span)
        for p, a in zip(callee.params, positional):
            keywords.setdefault(p.name, a)
        for name, a in keywords.items():
            if all(p.name != name for p in callee.params):
                raise MaskNameError(f"mask '{callee.name}' has no parameter '{name}'", a.span,
                                    did_you_mean(name, [p.name for p in callee.params]))
        for p in callee.params:
            a = keywords.get(p.name)
            if p.kind in ir.FLOAT_KINDS:     # read only by the callee's score modifier, which is not inherited
                if a is not None:
                    raise MaskTypeError(f"parameter '{p.name}' of mask '{callee.name}' is a float: only its score "
                                        "modifier reads it, and a call takes the mask's rules alone", a.span)
                continue
            if a is None:
                if p.kind == "int" and p.default is not None:
                    mapping[p.name] = ir.Const(p.default, node.span)
                    continue
                raise MaskTypeError(f"mask '{callee.name}' needs its parameter '{p.name}'", node.span)
            if p.kind == "int":
                mapping[p.name] = self._int(a.value, scope, file)
            else:
                target = scope.lookup(a.value.id) if isinstance(a.value, ir.Name) else None
                if not (isinstance(target, ir.Param) and target.kind == p.kind and target.of == p.of
                        and target.dims == p.dims if p.kind == "table" else
                        isinstance(target, ir.Param) and target.kind == p.kind and target.over == p.over):
                    kind = _kind_text(p)
                    raise MaskTypeError(f"parameter '{p.name}' of mask '{callee.name}' is {kind}: pass a "
                                        f"{kind} parameter of this mask", a.span)
                mapping[p.name] = target.name
                if p.kind == "table":
                    tables[target.name] = target
        for p in callee.params:   # a per-array must follow the segments it is indexed by
            if p.kind == "per":
                caller_array = next(v for n, v in scope.values if n == mapping[p.name])
                if caller_array.of != mapping[p.of]:
                    raise MaskTypeError(f"'{mapping[p.name]}' is per {caller_array.of}, but mask "
                                        f"'{callee.name}' needs it per {mapping[p.of]}", node.span)
        # The callee's own 'require' checks are not inherited: its caller states what it needs.
        allow = ir.Any_(tuple(_substitute(r.cond, mapping, tables) for r in callee.allow), node.span)
        deny = tuple(_substitute(r.cond, mapping, tables) for r in callee.deny)
        if not deny:
            return allow if len(allow.items) > 1 else allow.items[0]
        return ir.All((allow, ir.Negate(ir.Any_(deny, node.span), node.span)), node.span)


def _kind_text(p: ir.Param) -> str:
    if p.kind == "table":
        return {0: "table per h", 1: "per h table" if p.of == "h" else "table", 2: "table with two indices"}[p.dims]
    return "segments over k" if p.kind == "segments" and p.over == "k" else p.kind


def table_at(table: ir.Param, indices: tuple, span) -> ir.TableAt:
    """``table[indices]`` as written, with the head's index first for a table per h, and row-major strides."""
    if table.of == "h":
        indices = (ir.Builtin("h", span),) + tuple(indices)
    one = ir.Const(1, span)
    if len(indices) == 1:
        return ir.TableAt(table.name, tuple(indices), (one,), span)
    assert table.shape is not None, "resolve declares the sizes of every table with two indices"
    row = table.shape[0] if table.of == "h" else table.shape[1]       # entries per row
    return ir.TableAt(table.name, tuple(indices), (row, one), span)


def _substitute(node, mapping: dict[str, Any], tables: dict[str, ir.Param] | None = None):
    """Rename a called mask's parameters into the caller's terms (ints become expressions; a table read
    takes the strides of the caller's table)."""
    if isinstance(node, ir.ParamRef):
        return mapping[node.name]
    if isinstance(node, ir.SegAttr):
        return replace(node, seg=mapping[node.seg])
    if isinstance(node, ir.SegValue):
        return replace(node, array=mapping[node.array], seg=mapping[node.seg])
    if isinstance(node, ir.TableAt):
        indices = tuple(_substitute(i, mapping, tables) for i in node.indices)
        target = (tables or {}).get(mapping[node.table])
        if target is None:
            return replace(node, table=mapping[node.table], indices=indices)
        return table_at(target, indices[1:] if target.of == "h" else indices, node.span)
    if isinstance(node, ir.Same):
        return replace(node, seg=mapping[node.seg], key_seg=None if node.key_seg is None else mapping[node.key_seg])
    if isinstance(node, ir.Arith):
        return replace(node, left=_substitute(node.left, mapping, tables),
                       right=_substitute(node.right, mapping, tables))
    if isinstance(node, ir.Func):
        return replace(node, args=tuple(_substitute(a, mapping, tables) for a in node.args))
    if isinstance(node, ir.Cmp):
        return replace(node, left=_substitute(node.left, mapping, tables),
                       right=_substitute(node.right, mapping, tables))
    if isinstance(node, (ir.All, ir.Any_)):
        return replace(node, items=tuple(_substitute(i, mapping, tables) for i in node.items))
    if isinstance(node, ir.Negate):
        return replace(node, item=_substitute(node.item, mapping, tables))
    return node


def resolve(program: Program, name: str | None = None) -> ir.ResolvedMask:
    """Resolve the mask ``name`` of the program's main file (its only mask when ``name`` is None)."""
    resolver = _Resolver(program)
    main = program.main
    if name is None:
        if not main.masks:
            raise MaskNameError("this file defines no mask", Span(main.path, 1, 1),
                                "a mask starts with a line like 'mask causal()'")
        if len(main.masks) != 1:
            names = ", ".join(m.name for m in main.masks)
            raise MaskNameError(f"this file defines {len(main.masks)} masks ({names}); pick one by name",
                                main.masks[1].span, "with -m NAME on the command line, name= in Python")
        decl = main.masks[0]
    else:
        found = [m for m in main.masks if m.name == name]
        if not found:
            raise MaskNameError(f"{main.path} has no mask '{name}'", None,
                                did_you_mean(name, [m.name for m in main.masks]))
        decl = found[0]
    return resolver.resolve_mask(main, decl)


def resolve_all(program: Program) -> tuple[ir.ResolvedMask, ...]:
    """Every mask of the main file, in order (for lint and explain)."""
    resolver = _Resolver(program)
    return tuple(resolver.resolve_mask(program.main, m) for m in program.main.masks)
