"""Resolve, parameter declarations: a mask's ``ParamDecl`` list → typed :class:`~maskc.ir.Param` values (ints and
their defaults, segments and where they start, per-segment arrays, tables and their declared sizes, float
parameters), and how a table parameter is read (:func:`table_at`: the head's index first, row-major strides).

Invariant: every parameter name is new (not a built-in, not declared twice); a default, a segments' origin and a
table's sizes read only int parameters declared before, seq_len and kv_len; ``per`` names a segments parameter
declared before it (or h)."""
from __future__ import annotations

from maskc import ir
from maskc.analysis import linear
from maskc.errors import MaskNameError, MaskTypeError, did_you_mean
from maskc.frontend.scope import Scope
from maskc.frontend.score import float_param
from maskc.ir.walk import depends_on_position, mentions


# Names bind() takes for itself: a parameter of that name could never be given a value (bind(num_heads=4)
# sets the heads, and the parameter silently kept its default).
BIND_KEYWORDS = {"num_heads": "bind()'s number of heads (--heads on the command line)",
                 "self": "a name Python's bind() reserves",
                 "params": "the name of the mapping every call that binds takes parameter values in (params={...})"}


def resolve_params(resolver, decl: ir.MaskDecl) -> tuple[ir.Param, ...]:
    """The mask's parameters, in declaration order (see the module docstring)."""
    out: list[ir.Param] = []
    for p in decl.params:
        if p.name in ir.POSITIONS + ir.BUILTINS:
            raise MaskNameError(f"'{p.name}' is a built-in and cannot be a parameter", p.span)
        if p.name in BIND_KEYWORDS:
            raise MaskNameError(f"'{p.name}' is {BIND_KEYWORDS[p.name]} and cannot be a parameter", p.span,
                                "rename the parameter")
        if any(o.name == p.name for o in out):
            raise MaskNameError(f"parameter '{p.name}' is declared twice", p.span)
        scope = Scope(tuple((o.name, o) for o in out), decl)
        if p.kind in ir.FLOAT_KINDS:
            out.append(float_param(resolver, p, scope))
        elif p.kind in ("int", "const"):
            default = None
            if p.default is not None:
                default = _constant(resolver, p.default, scope)
            out.append(ir.Param(p.name, "int", default, const=p.kind == "const", span=p.span))
        elif p.kind == "segments":
            if p.default is not None:
                raise MaskTypeError("segments take no default", p.default.span)
            origin = None
            if p.origin is not None:
                origin = resolver.integer(p.origin, scope, None)
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
            shape = None if p.sizes is None else tuple(_size(resolver, e, scope) for e in p.sizes)
            if p.of == "h" and shape is None:
                raise MaskTypeError("a table per head needs its length declared, as 't: per h table[n]'", p.span)
            if shape is not None and len(shape) > 2:
                raise MaskTypeError(f"a table has one or two indices, not {len(shape)}", p.span)
            out.append(ir.Param(p.name, "table", of=p.of, shape=shape, span=p.span))
        elif p.of == "h":           # one value per head: a table indexed by h
            default = None if p.default is None else _constant(resolver, p.default, scope)
            out.append(ir.Param(p.name, "table", default, of="h", span=p.span))
        else:
            seg = next((o for o in out if o.name == p.of), None)
            if seg is None or seg.kind != "segments":
                known = [o.name for o in out if o.kind == "segments"]
                raise MaskNameError(f"'per {p.of}' needs a segments parameter '{p.of}' declared before it",
                                    p.span, did_you_mean(p.of or "", known) or "'per h' gives one value per head")
            default = None if p.default is None else _constant(resolver, p.default, scope)
            out.append(ir.Param(p.name, "per", default, of=p.of, span=p.span))
    return tuple(out)


def _size(resolver, node, scope: Scope) -> ir.IntExpr:
    """A table's declared size: an expression of int parameters (declared before), seq_len and kv_len."""
    size = resolver.integer(node, scope, None)
    if depends_on_position(size) or mentions(size, lambda n: isinstance(n, ir.TableAt) or (
            isinstance(n, ir.Builtin) and n.name in ("h", "b"))):
        raise MaskTypeError("a table's size reads int parameters, seq_len and kv_len only", node.span)
    return size


def _constant(resolver, node, scope: Scope) -> int:
    """A default value: any integer expression of literals (``-2``, ``4 * 1024``)."""
    value = linear.from_expr(resolver.integer(node, scope, None))
    if not linear.is_const(value):
        raise MaskTypeError("a default must be a number", node.span)
    return value.const


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
