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

from maskc import ir
from maskc.analysis import linear
from maskc.analysis.values import INT32
from maskc.errors import ComplexityError, MaskError, MaskNameError, MaskTypeError, Span, did_you_mean
from maskc.frontend.calls import FUNCTIONS, MAX_CALL_DEPTH, call_builtin, call_let, call_mask, check_divisor
from maskc.frontend.params import resolve_params, table_at
from maskc.frontend.parse import MAX_NESTING
from maskc.frontend.scope import Let, Program, Scope
from maskc.frontend.score import resolve_score
from maskc.ir.walk import expanded_size, is_int, mentions, nesting, nodes

_MAX_EXPONENT = 8
_MAX_STEPS = 2 * MAX_NESTING     # resolve's own recursion: a let's name and its value are two steps
MAX_EXPANDED_NODES = 20_000
"""The largest rule, in expression nodes once its lets and mask calls are written out (and the most nodes
one resolution may build): a let used twice is copied twice, so a chain of lets that each use the last
one twice doubles at every step. Past it, a :class:`~maskc.errors.ComplexityError` at the rule."""


class _TooLarge(Exception):
    """Resolution built more than MAX_EXPANDED_NODES nodes (turned into a ComplexityError at the rule)."""


class _Resolver:
    """Resolves the masks of one program, each once. Syntax is resolved by :meth:`expression` (and its typed
    forms :meth:`integer` and :meth:`condition`), which the declarations (:mod:`maskc.frontend.params`), calls
    (:mod:`maskc.frontend.calls`) and score modifiers (:mod:`maskc.frontend.score`) call back into."""

    def __init__(self, program: Program):
        self.program = program
        self.done: dict[tuple[str, str], ir.ResolvedMask] = {}
        self.active: list[tuple[str, str]] = []
        self._depth = 0                 # of expression() calls in progress: nesting, through lets and mask calls
        self.call_depth: dict[tuple[str, str], int] = {}    # 1 + the deepest chain of masks a mask calls
        self.callees: list[int] = []   # per mask being resolved: the deepest call_depth among its callees
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

    def find_mask(self, name: str, here: ir.SourceFile, span: Span) -> tuple[ir.SourceFile, ir.MaskDecl] | None:
        """The mask ``name`` called at ``span`` in ``here``: its own, else the one of the files it imports
        (transitively). Two imported files defining it is an error: taking the first found would depend on the
        order of the import lines."""
        for m in here.masks:
            if m.name == name:
                return here, m
        found = [(f, m) for f in self.program.visible_from(here) if f is not here for m in f.masks if m.name == name]
        if len(found) > 1:
            places = ", ".join(str(m.span) for _, m in found)
            raise MaskNameError(f"mask '{name}' is defined in more than one imported file ({places}): which one is "
                                "meant is ambiguous", span, "rename one of them, or define the one meant in this file")
        return found[0] if found else None

    def mask_names_from(self, here: ir.SourceFile) -> list[str]:
        """The masks ``here`` can call (its own and its imports')."""
        return [m.name for f in self.program.visible_from(here) for m in f.masks]

    # -- masks -------------------------------------------------------------------------------
    def resolve_mask(self, file: ir.SourceFile, decl: ir.MaskDecl) -> ir.ResolvedMask:
        key = (file.path, decl.name)
        if key in self.done:
            return self.done[key]
        if key in self.active:
            raise MaskNameError(f"mask '{decl.name}' uses itself", decl.span)
        self.active.append(key)
        self.callees.append(0)
        try:
            params = resolve_params(self, decl)
            scope = Scope((), decl)
            for p in params:
                scope = scope.bind(p.name, p)
            for let in decl.lets:
                if let.name in ir.POSITIONS + ir.BUILTINS or any(p.name == let.name for p in params):
                    raise MaskNameError(f"'{let.name}' is already a {'parameter' if scope.lookup(let.name) else 'built-in'} "
                                        "and cannot be redefined", let.span)
                # a second let of a name replaced the first for every rule, silently
                earlier = scope.lookup(let.name)
                if isinstance(earlier, Let):
                    raise MaskNameError(f"'{let.name}' is defined twice in mask '{decl.name}' (first at line "
                                        f"{earlier.span.line})", let.span, "rename one of them")
                twice = sorted({a for a in let.args if let.args.count(a) > 1})
                if twice:
                    raise MaskNameError(f"'{let.name}' names its argument '{twice[0]}' twice", let.span)
                scope = scope.bind(let.name, Let(let.args, let.value, scope, let.span))
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
            self.call_depth[key] = 1 + self.callees[-1]
        finally:
            self.active.pop()
            self.callees.pop()
        self.done[key] = result
        return result

    # -- conditions --------------------------------------------------------------------------
    def _rule_cond(self, rule: ir.RuleDecl, scope: Scope, file) -> ir.Cond:
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
        items = tuple(self.condition(c, scope, file) for c in conds)
        return items[0] if len(items) == 1 else ir.All(items, span)

    def condition(self, node: ir.Syntax, scope: Scope, file) -> ir.Cond:
        out = self.expression(node, scope, file)
        if is_int(out):
            raise MaskTypeError("a number is not a condition", node.span,
                                "compare it, e.g. 'k <= q'")
        return out

    def integer(self, node: ir.Syntax, scope: Scope, file) -> ir.IntExpr:
        out = self.expression(node, scope, file)
        if not is_int(out):
            raise MaskTypeError("expected a number here, found a condition", node.span)
        return out

    def expression(self, node: ir.Syntax, scope: Scope, file):
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
        items = tuple(self.condition(o, scope, file) for o in node.operands)
        return (ir.All if node.op == "and" else ir.Any_)(items, node.span)

    def _Not(self, node, scope, file):
        return ir.Negate(self.condition(node.operand, scope, file), node.span)

    def _Compare(self, node, scope, file):
        values = [self.integer(o, scope, file) for o in node.operands]
        cmps = tuple(ir.Cmp(op, a, b, node.span) for op, a, b in zip(node.ops, values, values[1:]))
        return cmps[0] if len(cmps) == 1 else ir.All(cmps, node.span)

    def _InRange(self, node, scope, file):
        value = self.integer(node.value, scope, file)
        low, high = self.integer(node.low, scope, file), self.integer(node.high, scope, file)
        cond = ir.All((ir.Cmp("<=" if node.low_closed else "<", low, value, node.span),
                       ir.Cmp("<=" if node.high_closed else "<", value, high, node.span)), node.span)
        return ir.Negate(cond, node.span) if node.negated else cond

    # -- integer expressions -----------------------------------------------------------------
    def _Num(self, node, scope, file):
        if node.value > INT32:      # the kernel computes in 32 bits (64 for squares and products)
            raise MaskTypeError("this number does not fit in 32 bits", node.span)
        return ir.Const(node.value, node.span)

    def _FloatNum(self, node, scope, file):
        raise MaskTypeError("masks compute on integers: a float is read only by a score modifier", node.span,
                            "e.g. 'score = softcap(score, 30.0)'")

    def _UnaryMinus(self, node, scope, file):
        return ir.Arith("-", ir.Const(0, node.span), self.integer(node.operand, scope, file), node.span)

    def _Invert(self, node, scope, file):       # ~x == -x - 1, as in Python
        return ir.Arith("-", ir.Const(-1, node.span), self.integer(node.operand, scope, file), node.span)

    def _Subscript(self, node, scope, file):
        table = scope.lookup(node.table)
        if not (isinstance(table, ir.Param) and table.kind == "table"):
            known = [n for n, v in scope.values if isinstance(v, ir.Param) and v.kind == "table"]
            what = f"a {table.kind} parameter" if isinstance(table, ir.Param) else \
                "a let" if isinstance(table, Let) else "not a parameter"
            raise MaskTypeError(f"'{node.table}' is {what}, not a table: only tables are indexed with [...]",
                                node.span, did_you_mean(node.table, known) or "declare it 't: table'")
        if len(node.indices) != table.dims:
            raise MaskTypeError(f"'{node.table}' takes {table.dims} ind{'ex' if table.dims == 1 else 'ices'}, "
                                f"got {len(node.indices)}", node.span,
                                "a table per head reads this head's row: t[i] is t's entry i for head h"
                                if table.of == "h" else None)
        indices = tuple(self.integer(i, scope, file) for i in node.indices)
        return table_at(table, indices, node.span)

    def _BinOp(self, node, scope, file):
        if node.op == "/":
            raise MaskTypeError("'/' divides floats, in score modifiers only", node.span,
                                "integer division, floored as in Python, is '//'")
        left = self.integer(node.left, scope, file)
        right = self.integer(node.right, scope, file)
        if node.op == "**":
            if not isinstance(right, ir.Const) or not 0 <= right.value <= _MAX_EXPONENT:
                raise MaskTypeError(f"an exponent must be a literal from 0 to {_MAX_EXPONENT}", node.right.span)
            if right.value == 0:
                return ir.Const(1, node.span)
            out = left
            for _ in range(right.value - 1):
                out = ir.Arith("*", out, left, node.span)
            return out
        if node.op in ("//", "%"):
            check_divisor(right, f"the right side of '{node.op}'", node.right.span)
        if node.op in ("<<", ">>"):
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
        if isinstance(bound, Let):
            if bound.args:
                raise MaskTypeError(f"'{node.id}' takes {len(bound.args)} argument(s)", node.span,
                                    f"write {node.id}({', '.join(bound.args)})")
            return self.expression(bound.value, bound.scope, file)
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
        value = self.integer(node.args[0].value, scope, file)
        if not isinstance(value, ir.Pos):
            raise MaskTypeError(f"{what} takes q or k, not an expression", node.args[0].span)
        return value.which

    def _Call(self, node, scope, file):
        bound = scope.lookup(node.func)
        if isinstance(bound, Let):
            return call_let(self, node, bound, scope, file)
        if isinstance(bound, ir.Param):
            if bound.kind != "per":
                raise MaskTypeError(f"'{node.func}' is a{'n' if bound.kind == 'int' else ''} {bound.kind} "
                                    "parameter and cannot be called", node.span,
                                    (f"write {node.func}[...] to read an entry" if bound.of is None else
                                     f"write {node.func}: it is this head's value") if bound.kind == "table"
                                    else None)
            pos = self._position_arg(node, scope, file, node.func)
            return ir.SegValue(bound.name, bound.of, pos, node.span)
        if node.func in FUNCTIONS:
            return call_builtin(self, node, scope, file)
        here = file or self.program.main
        found = self.find_mask(node.func, here, node.span)
        if found is not None:
            return call_mask(self, node, found, scope, file)
        known = list(FUNCTIONS) + [n for n, v in scope.values if isinstance(v, Let) or
                                   (isinstance(v, ir.Param) and v.kind == "per")] + self.mask_names_from(here)
        elsewhere = next((f.path for f in self.program.files for m in f.masks if m.name == node.func), None)
        hint = (f"'{node.func}' is a mask of {elsewhere}, which this file does not import" if elsewhere
                else did_you_mean(node.func, known))
        raise MaskNameError(f"unknown function or mask '{node.func}'", node.span, hint)


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
            defined = [m.name for m in main.masks]
            raise MaskNameError(f"{main.path} has no mask '{name}'", None, did_you_mean(name, defined) or (
                f"its masks: {', '.join(defined)}" if defined else "it defines no mask"))
        decl = found[0]
    return resolver.resolve_mask(main, decl)


def resolve_all(program: Program) -> tuple[ir.ResolvedMask, ...]:
    """Every mask of the main file, in order (for lint and explain)."""
    resolver = _Resolver(program)
    return tuple(resolver.resolve_mask(program.main, m) for m in program.main.masks)


__all__ = ["MAX_CALL_DEPTH", "MAX_EXPANDED_NODES", "Program", "mentions", "nodes", "resolve", "resolve_all", "table_at"]
