"""Lint: every diagnostic of a .mask file at once, errors and warnings, each at the user's text.

``lint_file(path)`` runs parse, resolve and normalize on every mask of the file, collecting each
:class:`~maskc.errors.MaskError` instead of stopping at the first, then looks for masks that compile
but probably do not mean what their author meant:

* a mask name defined twice in one file (each repeat is an error; linting goes on with the first);
* a parameter that no allow/deny/require rule reads after resolution (a ``segments from p``
  origin counts as a read of ``p``; a let that is never used does not count);
* an allow rule whose normal form has no region: it can never make a pair visible;
* a deny rule none of whose regions meets any allow region: it removes nothing.

The last two are proved on the normal form's face (contradictory linear bounds, together with
0 <= q < seq_len and 0 <= k < kv_len); a rule the analysis cannot prove empty is never reported.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from . import ir
from . import linear as L
from .errors import MaskError, Span
from .normalize import intersect, normalize
from .pipeline import load_program
from .resolve import Program, mentions, resolve


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int
    col: int
    severity: str           # "error" or "warning"
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        text = f"{self.file}:{self.line}:{self.col}: {self.severity}: {self.message}"
        return text + (f"\n  hint: {self.hint}" if self.hint else "")

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "col": self.col, "severity": self.severity,
                "message": self.message, "hint": self.hint}


def _at(span: Span | None, path: str, severity: str, message: str, hint: str | None = None) -> Diagnostic:
    span = span or Span(path, 1, 1)      # errors about the whole file point at its start
    return Diagnostic(span.file, span.line, span.col, severity, message, hint)


def _from_error(err: MaskError, path: str) -> Diagnostic:
    return _at(err.span, path, "error", err.message, err.hint)


def lint_file(path: str | Path) -> list[Diagnostic]:
    """All diagnostics of one file (and of the files it imports, where they are the cause), sorted."""
    path = str(path)
    try:
        program = load_program(path)
    except MaskError as err:               # unreadable, or a parse error here or in an import
        return [_from_error(err, path)]
    out: list[Diagnostic] = []
    if not program.main.masks:
        out.append(Diagnostic(path, 1, 1, "warning", "this file defines no mask",
                              "a mask starts with a line like 'mask causal()'"))
    first = {}
    for m in program.main.masks:
        if m.name in first:
            out.append(_at(m.span, path, "error", f"mask '{m.name}' is defined twice in this file "
                                                  f"(first at line {first[m.name].span.line})",
                           "rename one of them"))
        else:
            first[m.name] = m
    # Lint the first definition of each name; resolve would stop at the duplicate.
    program = Program((replace(program.main, masks=tuple(first.values())),) + program.files[1:])
    for name in first:
        out.extend(_lint_mask(program, name, path))
    return sorted(set(out), key=lambda d: (d.file, d.line, d.col, d.message))


def _lint_mask(program: Program, name: str, path: str) -> list[Diagnostic]:
    try:
        resolved = resolve(program, name)
        normal = normalize(resolved)
    except MaskError as err:
        return [_from_error(err, path)]
    out = [_at(p.span, path, "warning", f"parameter '{p.name}' of mask '{name}' is never used",
               "remove it, or use it in a rule") for p in unused_params(resolved)]
    for rule in resolved.allow:
        if not any(_possible(r) for r in _only(resolved, rule).allow):
            out.append(_at(rule.span, path, "warning", "this allow rule can never hold, so it shows nothing",
                           "its conditions contradict each other, or 0 <= q < seq_len, 0 <= k < kv_len"))
    for rule in resolved.deny:
        if not _removes_something(_only(resolved, rule).deny, normal.allow):
            out.append(_at(rule.span, path, "warning", "this deny rule removes nothing: no allow rule "
                                                       "shows any pair it matches"))
    return out


def _domain() -> ir.Region:
    """0 <= q < seq_len and 0 <= k < kv_len, as atoms ``lin <= 0``: facts every pair satisfies."""
    q, k = L.of_term(ir.Pos("q")), L.of_term(ir.Pos("k"))
    seq, kv = L.of_term(ir.Builtin("seq_len")), L.of_term(ir.Builtin("kv_len"))
    one = L.const(1)
    lins = (L.scale(q, -1), L.scale(k, -1), L.add(L.sub(q, seq), one), L.add(L.sub(k, kv), one))
    return ir.Region(tuple(ir.Atom(lin) for lin in lins))


def _possible(region: ir.Region) -> bool:
    return intersect(region, _domain()) is not None


def _only(mask: ir.ResolvedMask, rule: ir.Rule) -> ir.NormalMask:
    """The normal form of one rule on its own (normalize treats rules independently)."""
    return normalize(replace(mask, rules=(rule,)))


def _removes_something(deny: tuple[ir.Region, ...], allow: tuple[ir.Region, ...]) -> bool:
    return any((both := intersect(d, a)) is not None and _possible(both) for d in deny for a in allow)


def _reads(node, name: str) -> bool:
    """Whether a resolved expression reads the parameter ``name`` (of any kind)."""
    def hit(n) -> bool:
        if isinstance(n, ir.ParamRef):
            return n.name == name
        if isinstance(n, (ir.SegAttr, ir.Same)):
            return n.seg == name
        if isinstance(n, ir.SegValue):
            return name in (n.array, n.seg)
        return False
    return mentions(node, hit)


def unused_params(mask: ir.ResolvedMask) -> list[ir.Param]:
    """Parameters that no rule and no segments origin reads."""
    # `segments from prompt` reads `prompt` when the segments are bound, whatever the rules say.
    readers = [r.cond for r in mask.rules] + [p.origin for p in mask.params if p.origin is not None]
    return [p for p in mask.params if not any(_reads(node, p.name) for node in readers)]
