"""Resolve, calls: ``name(args)`` where ``name`` is a built-in function (min, max, abs, clamp, ceildiv, same), a
``let`` function or another mask (of this file or an imported one), each inlined into the caller's terms.

Invariant: a call's arguments match its callee (count, keywords, kinds: a segments, per-segment array or table
argument is a parameter of the caller of the same kind); a called mask contributes its allow and deny rules
(not its ``require`` checks, nor its score modifier) with its parameters renamed into the caller's; masks call
one another at most MAX_CALL_DEPTH deep."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from maskc import ir
from maskc.analysis import linear
from maskc.errors import MaskNameError, MaskTypeError, did_you_mean
from maskc.frontend.params import table_at
from maskc.frontend.scope import Let
from maskc.ir.walk import depends_on_position

FUNCTIONS = {"min": (2, None), "max": (2, None), "abs": (1, 1), "clamp": (3, 3), "ceildiv": (2, 2), "same": (1, 2)}
"""Built-in functions and their arity: (least, most), None for any number."""
MAX_CALL_DEPTH = 16          # masks calling masks calling masks...: resolve recurses once per level


def call_let(resolver, node, let: Let, scope, file):
    """A let function's value with its arguments bound (resolved in the caller's scope)."""
    if len(node.args) != len(let.args) or any(a.name for a in node.args):
        raise MaskTypeError(f"'{node.func}' takes {len(let.args)} positional argument(s), "
                            f"got {len(node.args)}", node.span)
    inner = let.scope
    for name, arg in zip(let.args, node.args):
        inner = inner.bind(name, resolver.integer(arg.value, scope, file))
    return resolver.expression(let.value, inner, file)


def call_builtin(resolver, node, scope, file):
    """min, max (binary, chained), abs, clamp (as min of max), ceildiv (as a floor division) or same (a
    condition)."""
    lo, hi = FUNCTIONS[node.func]
    n = len(node.args)
    named = next((a for a in node.args if a.name), None)
    if named is not None:
        raise MaskTypeError(f"{node.func}() takes no keyword arguments", named.span)
    if n < lo or (hi is not None and n > hi):
        count = f"{lo}" if lo == hi else f"at least {lo}" if hi is None else f"{lo} to {hi}"
        raise MaskTypeError(f"{node.func}() takes {count} positional argument(s), got {n}", node.span)
    if node.func == "same":
        segs = []
        for a in node.args:
            seg = scope.lookup(a.value.id) if isinstance(a.value, ir.Name) else None
            if seg is None and isinstance(a.value, ir.Name) and a.value.id not in ir.POSITIONS + ir.BUILTINS:
                known = [n for n, v in scope.values if isinstance(v, ir.Param) and v.kind == "segments"]
                raise MaskNameError(f"unknown name '{a.value.id}'", a.value.span, did_you_mean(a.value.id, known)
                                    or (f"its segments parameters: {', '.join(known)}" if known
                                        else "same() takes a segments parameter, and this mask declares none"))
            if not (isinstance(seg, ir.Param) and seg.kind == "segments"):
                raise MaskTypeError("same() takes a segments parameter (q's), and optionally a second (k's)",
                                    a.value.span)
            segs.append(seg.name)
        return ir.Same(segs[0], segs[1] if len(segs) > 1 and segs[1] != segs[0] else None, node.span)
    args = tuple(resolver.integer(a.value, scope, file) for a in node.args)
    if node.func == "ceildiv":
        # -((-a) // b): a floor division, whose forms every later pass knows (ceildiv(k, c) by a constant is
        # one interval per chunk: exact tiles); its divisor, like `//`'s, is free of q and k.
        numerator, divisor = args
        check_divisor(divisor, "ceildiv()'s divisor", node.args[1].value.span)
        zero = ir.Const(0, node.span)
        floor = ir.Arith("//", ir.Arith("-", zero, numerator, node.span), divisor, node.span)
        return ir.Arith("-", zero, floor, node.span)
    if node.func == "clamp":
        value, low, high = args
        return ir.Func("min", (ir.Func("max", (value, low), node.span), high), node.span)
    if node.func in ("min", "max") and len(args) > 2:   # keep the IR binary
        out = args[0]
        for a in args[1:]:
            out = ir.Func(node.func, (out, a), node.span)
        return out
    return ir.Func(node.func, args, node.span)


def check_divisor(divisor, what: str, span) -> None:
    """A divisor (of ``//``, ``%``, ceildiv) free of q and k, and positive where it is a number: else a
    MaskTypeError at it. (One that reads parameters is checked when they are known: at bind, or for const
    parameters when the kernel is specialized to them.)"""
    if depends_on_position(divisor):
        raise MaskTypeError(f"{what} cannot depend on q or k", span, "divide by a number or a parameter")
    value = linear.from_expr(divisor)
    if linear.is_const(value) and value.const <= 0:
        raise MaskTypeError(f"{what} is {value.const}; a divisor must be positive", span)


def call_mask(resolver, node, found, scope, file):
    """Another mask's visibility, its parameters bound to the call's arguments."""
    callee_file, decl = found
    key = (callee_file.path, decl.name)
    if len(resolver.active) >= MAX_CALL_DEPTH or resolver.call_depth.get(key, 0) >= MAX_CALL_DEPTH:
        raise MaskTypeError(f"masks call one another more than {MAX_CALL_DEPTH} deep here", node.span,
                            f"maskc takes chains of at most {MAX_CALL_DEPTH} masks, each calling the next")
    callee = resolver.resolve_mask(callee_file, decl)
    resolver.callees[-1] = max(resolver.callees[-1], resolver.call_depth[key])
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
            mapping[p.name] = resolver.integer(a.value, scope, file)
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
