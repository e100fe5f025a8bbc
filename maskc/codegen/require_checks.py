"""The `require` rules and the segments' origins as C, for the device builder's ``validate`` kernel
(``templates/descriptor_build.cu.j2`` places them; :mod:`maskc.codegen.descriptor_build` puts them in the spec).

A rule's condition is written with the predicate's own :class:`~maskc.codegen.cwriter.CWriter` (each comparison
``a op b`` as ``(a - b) op 0`` over the canonical linear form, in 64 bits: the builder's ``maskc_int``); only its
boolean structure (and, or, not) is written here. The rule is checked at the positions :mod:`maskc.analysis.bind`
checks it at: every query position where it reads q itself, the starts of the segments it reads where it reads
q only through them (it is constant between them), position 0 where it reads no position.
"""
from __future__ import annotations

from maskc import ir
from maskc.analysis import linear as L
from maskc.builder_ir import RequireCheck
from maskc.codegen.cwriter import CWriter, TableLayout
from maskc.codegen.sanitize import comment_text
from maskc.ir.walk import mentions, nodes

MAX_REQUIRE_RULES = 30      # status[2] bits 0..29 (bit 30: a value past 32 bits)


def _cond(w: CWriter, cond: ir.Cond) -> str:
    """``cond`` as a C boolean expression over the table ``mask`` at row ``q`` (batch element ``b``, head ``h``)."""
    if isinstance(cond, ir.Truth):
        return "true" if cond.value else "false"
    if isinstance(cond, ir.Cmp):
        return f"({w.lin(L.sub(L.from_expr(cond.left), L.from_expr(cond.right)))} {cond.op} 0)"
    if isinstance(cond, (ir.All, ir.Any_)):
        joiner = " && " if isinstance(cond, ir.All) else " || "
        return "(" + joiner.join(_cond(w, c) for c in cond.items) + ")" if cond.items else (
            "true" if isinstance(cond, ir.All) else "false")
    if isinstance(cond, ir.Negate):
        return f"(!{_cond(w, cond.item)})"
    raise TypeError(f"a 'require' condition the device cannot check: {type(cond).__name__}")


def _function(index: int, rule: ir.Rule, layout: TableLayout, constants: dict[str, int]) -> str:
    """``bool maskc_require<index>(mask, b, h, q)``: whether the rule holds at row q."""
    w = CWriter(layout, constants)
    body = _cond(w, rule.cond)
    lines = [f"// rule {index}: {comment_text(rule.span.source_line.strip())}",
             f"__device__ __forceinline__ bool maskc_require{index}(const int* __restrict__ mask, int b, int h, "
             "int q) {",
             "    const int extent = max(mask[0], mask[1]);",
             "    (void)extent; (void)b; (void)h; (void)q;"]
    for seg, var in w.row_segments.items():
        lines.append(f"    const MaskSegment {var} = maskc_segment(mask + mask[{layout.seg_slot(seg)}], q, extent);")
    lines += [f"    return {body};", "}"]
    return "\n".join(lines)


def require_checks(resolved: ir.ResolvedMask, params: tuple[ir.Param, ...],
                   constants: tuple[tuple[str, int], ...] = ()) -> tuple[RequireCheck, ...]:
    """Every `require` rule of the mask (the first MAX_REQUIRE_RULES: the status word's bits) as the builder
    checks it; a TypeError where a condition cannot be written (``same`` reads k: resolve refuses it)."""
    layout, known = TableLayout.of(params), dict(constants)
    out = []
    for i, rule in enumerate(resolved.requires[:MAX_REQUIRE_RULES]):
        segs: tuple[str, ...] = ()
        if mentions(rule.cond, lambda n: isinstance(n, (ir.Pos, ir.Same))):
            positions = "every"
        else:
            segs = tuple(sorted({n.seg for n in nodes(rule.cond) if isinstance(n, (ir.SegAttr, ir.SegValue))
                                 and n.pos == "q"}))
            positions = "starts" if segs else "once"
        out.append(RequireCheck(i, _function(i, rule, layout, known), positions,
                                tuple(layout.seg_slot(s) for s in segs)))
    return tuple(out)


def origin_c(p: ir.Param, layout: TableLayout, constants: tuple[tuple[str, int], ...] = ()) -> str:
    """A segments parameter's origin (its ``from`` expression, 0 without one) as C over the table's ints."""
    if p.origin is None:
        return "0"
    return CWriter(layout, dict(constants)).lin(L.from_expr(p.origin))
