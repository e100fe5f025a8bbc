"""Lint: every diagnostic of a .mask file at once, errors and warnings, each at the user's text.

``lint_file(path)`` collects errors instead of stopping at the first:

* parse errors: when the file does not parse, each top-level block (a ``mask`` with its body, an
  ``import``) is parsed on its own, so every broken block is reported and the others are still linted;
  the files it imports are recovered the same way, and an import that cannot be found or read is reported
  at its line and left out (``program_from_text``'s ``parse_source`` and ``skipped``);
* resolve and normalize errors: a mask that fails is checked again one rule at a time, so each wrong
  rule is reported (a mask-wide error such as "no 'allow' rule" too);
* a mask name defined twice in one file (each repeat is an error; linting goes on with the first).

Every mask of every file the program reads is checked for errors, the imported files' masks too (a mask the main
file never calls compiles nowhere else, and its errors would wait for the first file that calls it); warnings are
the main file's (an imported file's come when that file is linted). A main file that cannot be read is one error
without a position (there is no line to point at): ``error: cannot read m.mask: No such file or directory``.

Then it looks for masks that compile but probably do not mean what their author meant (warnings):

* a parameter that no allow/deny/require rule reads after resolution (a ``segments from p``
  origin counts as a read of ``p``; a let that is never used does not count);
* an allow rule whose normal form has no region: it can never make a pair visible;
* an allow rule that deny rules cancel: every pair it shows, some deny rule removes;
* a deny rule none of whose regions meets any allow region: it removes nothing;
* segments declared on one side (queries, or keys with ``over k``) and read only at the other, and table
  indices that may leave the table's declared sizes (:mod:`maskc.lint_bind`): what bind would refuse;
* a rule whose keys per row the range analysis cannot solve (k in a product, in two squares, in floors
  with no common chunk, ...): the warning names the atom and the reason. Its tiles are classified
  soundly but not exactly, so tiles that are really FULL or EMPTY run the per-pair predicate (slower,
  never wrong). Rules that read k through ``//`` and ``%`` by divisors known at bind, or through a
  disc, are exact (:mod:`maskc.analysis.chunks`) and get no warning.

The dead-rule checks are proved on the normal form's face (contradictory linear bounds, together
with 0 <= q < seq_len and 0 <= k < kv_len); a rule the analysis cannot prove dead is never reported.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from maskc import ir
from maskc.analysis import linear as L
from maskc.analysis.normalize import intersect, normalize
from maskc.analysis.bind import check_constants
from maskc.analysis.ranges import analyze_ranges
from maskc.analysis.widths import check_static
from maskc.errors import MaskError, MaskFileError, MaskSyntaxError, Span
from maskc.frontend.parse import parse, source_lines
from maskc.frontend.resolve import Program, resolve
from maskc.frontend.sources import ImportPaths, read_source
from maskc.ir.walk import mentions
from maskc.lint_bind import segment_sides, table_ranges
from maskc.pipeline import program_from_text

FORMATS = ("text", "json", "github")
_COVER_BUDGET = 512          # regions visited when proving that deny rules cancel an allow rule


@dataclass(frozen=True)
class Diagnostic:
    file: str
    line: int | None        # None (and col None): about a file that cannot be read, which has no lines
    col: int | None
    severity: str           # "error" or "warning"
    message: str
    hint: str | None = None
    length: int = field(default=1, compare=False)          # characters the caret marks
    source_line: str = field(default="", compare=False)    # the line's text, for the caret

    def __str__(self) -> str:
        if self.line is None or self.col is None:    # the message names the file, as the other commands print it
            return f"{self.severity}: {self.message}" + (f"\n  hint: {self.hint}" if self.hint else "")
        text = f"{self.file}:{self.line}:{self.col}: {self.severity}: {self.message}"
        caret = Span(self.file, self.line, self.col, self.length, self.source_line).caret()
        return text + (f"\n{caret}" if caret else "") + (f"\n  hint: {self.hint}" if self.hint else "")

    @property
    def end_col(self) -> int | None:
        """The column just past the marked text (on the same line)."""
        return None if self.col is None else self.col + self.length

    @property
    def order(self) -> tuple:
        """Where it sorts: by file, then line and column (a file's position-less error first)."""
        return self.file, self.line or 0, self.col or 0, self.message

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "col": self.col, "end_col": self.end_col,
                "severity": self.severity, "message": self.message, "hint": self.hint}


def _at(span: Span | None, path: str, severity: str, message: str, hint: str | None = None) -> Diagnostic:
    span = span or Span(path, 1, 1)      # errors about the whole file point at its start
    return Diagnostic(span.file, span.line, span.col, severity, message, hint, span.length, span.source_line)


def _from_error(err: MaskError, path: str) -> Diagnostic:
    if isinstance(err, MaskFileError) and err.span is None:     # the file itself cannot be read: no line exists
        return Diagnostic(path, None, None, "error", err.message, err.hint)
    return _at(err.span, path, "error", err.message, err.hint)


def lint_file(path: str | Path, import_paths: ImportPaths = ()) -> list[Diagnostic]:
    """All diagnostics of one file, and the errors of every mask of the files it imports (called or not), sorted;
    imports are looked for as :func:`maskc.load` does, ``import_paths`` after the file's own directory."""
    path = str(Path(path))
    program, out, broken = _load_recovering(path, import_paths)
    if program is None:
        return out
    if not program.main.masks and not out:
        out.append(Diagnostic(path, 1, 1, "warning", "this file defines no mask",
                              "a mask starts with a line like 'mask causal()'"))
    # Each file keeps the first definition of each name (resolve would stop at a duplicate); each repeat is an error.
    files = []
    for file in program.files:
        first: dict[str, ir.MaskDecl] = {}
        for m in file.masks:
            if m.name in first:
                out.append(_at(m.span, file.path, "error", f"mask '{m.name}' is defined twice in this file "
                                                           f"(first at line {first[m.name].span.line})",
                               "rename one of them"))
            else:
                first[m.name] = m
        files.append(replace(file, masks=tuple(first.values())))
    program = replace(program, files=tuple(files))
    for index, file in enumerate(program.files):
        # The file as the main one: resolve looks a mask up in the main file, and what each file sees of the
        # others follows its own import lines (Program.imports), whichever file comes first.
        as_main = replace(program, files=(file,) + program.files[:index] + program.files[index + 1:])
        for m in file.masks:
            found = _lint_mask(as_main, m.name, file.path, warnings=index == 0)
            out.extend(d for d in found if not any(f"'{b}'" in d.message for b in broken))   # not a broken mask's echo
    return sorted(set(out), key=lambda d: d.order)


# -- errors: every broken block and every wrong rule ----------------------------------------------

def _load_recovering(path: str, import_paths: ImportPaths = ()) -> tuple[Program | None, list[Diagnostic], set[str]]:
    """The program, with the top-level blocks that do not parse left out (of the main file and of each file it
    imports), and the imports that cannot be found, read or parsed at all; their errors; and the names of the
    masks left out (errors that only echo those are not reported again). None for the program when the main
    file itself cannot be read or recovered."""
    errors: list[Diagnostic] = []
    broken: set[str] = set()

    def parse_recovering(text: str, file: str) -> ir.SourceFile:
        try:
            return parse(text, file)
        except MaskSyntaxError as first:
            lines = source_lines(text)
            kept = ["\n"] * len(lines)
            found: list[Diagnostic] = []
            for start, end in _blocks(lines):
                block, block_errors = _parse_dropping_lines(lines, start, end, file)
                found += block_errors
                if block is not None:
                    kept[start:end] = block
                if block_errors:
                    match = re.match(r"mask\s+([A-Za-z_]\w*)", lines[start])
                    if match:
                        broken.add(match.group(1))
            if not found:                # no block fails on its own: the error lies between blocks
                raise first from None
            errors.extend(found)
            return parse("".join(kept), file)

    skipped: list[MaskError] = []
    try:
        program = program_from_text(read_source(Path(path)), path, Path(path).parent, import_paths,
                                     parse_recovering, skipped)
    except MaskError as err:
        return None, errors + [_from_error(err, path)], broken
    return program, errors + [_from_error(err, path) for err in skipped], broken


def _parse_dropping_lines(lines: list[str], start: int, end: int,
                          path: str) -> tuple[list[str] | None, list[Diagnostic]]:
    """Parse lines [start, end) alone; at each error, report it and blank its line (a rule, a let) and
    parse again, so that one bad line does not hide the next. The block's lines as they parse, or None
    when its first line is the one that fails."""
    block = list(lines[start:end])
    errors: list[Diagnostic] = []
    while True:
        try:
            parse("\n" * start + "".join(block), path)       # blank lines keep the line numbers
            return block, errors
        except MaskSyntaxError as err:
            at = (err.span.line - 1 - start) if err.span else 0
            if errors and at <= 0:            # the header, once lines are gone: an echo of those lines
                return None, errors
            errors.append(_from_error(err, path))
            if not 0 < at < len(block) or not block[at].strip() or len(errors) > len(block):
                return None, errors
            block[at] = "\n"


def _blocks(lines: list[str]) -> list[tuple[int, int]]:
    """[start, end) line ranges of the top-level blocks: each starts at a line that begins in column 1
    with something other than a comment."""
    starts = [i for i, text in enumerate(lines) if text[:1] not in ("", " ", "\t", "\n", "\r", "#")]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    return list(zip(starts, starts[1:] + [len(lines)]))


def _lint_mask(program: Program, name: str, path: str, warnings: bool = True) -> list[Diagnostic]:
    """The errors of mask ``name`` of the program's main file (``path``), and with ``warnings`` its warnings."""
    try:
        resolved = resolve(program, name)
        normal = normalize(resolved)
        ranges = analyze_ranges(normal)
    except MaskError as err:
        return _rule_errors(program, name, path, err)
    return (_warnings(resolved, normal, ranges, path) if warnings else []) + _compile_errors(resolved, ranges, path)


def _compile_errors(resolved: ir.ResolvedMask, ranges: ir.RangeMask, path: str) -> list[Diagnostic]:
    """What `maskc compile` refuses past the passes above, so that a file lint passes compiles: constants that
    64 bits cannot hold once folded, and const parameters whose defaults make a divisor, a shift amount or a
    requirement fail (compile specializes the kernel to them)."""
    defaults = {p.name: p.default for p in resolved.params if p.const and p.default is not None}
    try:
        check_static(ranges)
        check_constants(resolved, ranges, defaults)
    except MaskError as err:
        return [_from_error(err, path)]
    return []


def _rule_errors(program: Program, name: str, path: str, first: MaskError) -> list[Diagnostic]:
    """The errors of each rule of mask ``name`` on its own, then the error of the mask without its failing
    rules (mask-wide: no allow rule at all, say); ``first``, the whole mask's, if neither finds one."""
    decl = next(m for m in program.main.masks if m.name == name)

    def error_of(rules: tuple[ir.RuleDecl, ...], lend_allow: bool) -> Diagnostic | None:
        if lend_allow:           # a rule without an allow rule beside it would fail for that alone
            rules += (ir.RuleDecl("allow", (ir.BoolLit(True, decl.span),), decl.span),)
        changed = replace(decl, rules=rules)
        main = replace(program.main, masks=tuple(changed if m is decl else m for m in program.main.masks))
        try:
            normalize(resolve(replace(program, files=(main,) + program.files[1:]), name))
            return None
        except MaskError as err:
            return _from_error(err, path)

    per_rule = {i: error_of((rule,), rule.kind != "allow") for i, rule in enumerate(decl.rules)}
    good = tuple(rule for i, rule in enumerate(decl.rules) if per_rule[i] is None)
    had_allow = any(r.kind == "allow" for r in decl.rules)
    whole = error_of(good, had_allow and not any(r.kind == "allow" for r in good))
    out = {d for d in (*per_rule.values(), whole) if d is not None}
    return list(out) or [_from_error(first, path)]


# -- warnings: masks that compile but likely mean something else ----------------------------------

def _warnings(resolved: ir.ResolvedMask, normal: ir.NormalMask, ranges: ir.RangeMask, path: str) -> list[Diagnostic]:
    name = resolved.name
    out = [_at(p.span, path, "warning", f"parameter '{p.name}' of mask '{name}' is never used",
               "remove it, or use it in a rule") for p in unused_params(resolved)]
    for rule in resolved.allow:
        regions = [r for r in _only(resolved, rule).allow if _possible(r)]
        if not regions:
            out.append(_at(rule.span, path, "warning", "this allow rule can never hold, so it shows nothing",
                           "its conditions contradict each other, or 0 <= q < seq_len, 0 <= k < kv_len"))
        elif normal.deny and all(_covered(r, normal.deny, [_COVER_BUDGET]) for r in regions):
            lines = sorted({d.span.line for d in normal.deny if any(intersect(d, r) for r in regions)})
            out.append(_at(rule.span, path, "warning", "deny rules cancel this allow rule: every pair it shows, "
                                                       f"the deny rule(s) at line {', '.join(map(str, lines))} remove",
                           "remove the allow rule, or narrow the deny rule"))
    def warn(span, message, hint):
        out.append(_at(span, path, "warning", message, hint))
    segment_sides(resolved, warn)
    table_ranges(resolved, warn)
    for rule in resolved.deny:
        if not _removes_something(_only(resolved, rule).deny, normal.allow):
            out.append(_at(rule.span, path, "warning", "this deny rule removes nothing: no allow rule "
                                                       "shows any pair it matches"))
    inexact: dict = {}
    for region in ranges.allow + ranges.deny:
        if region.inexact is not None:
            atom = region.inexact.atom
            span = atom.span if atom.span.line == region.span.line else region.span
            inexact.setdefault((region.span, span), region.inexact.reason)
    for (_, span), reason in inexact.items():
        out.append(_at(span, path, "warning",
                       f"tile classes are sound but not exact here: {reason}; the tiles this rule touches are "
                       "computed as PARTIAL (the predicate runs per pair) even where they are full or empty",
                       "k can enter through +, -, constant multiples, // and % by divisors known when the mask "
                       "is bound (image rows, frames, chunks; >> and << by constants, & with 2**n - 1 too) and "
                       "squares bounded above (a disc): each row's keys are then intervals that maskc computes "
                       "exactly"))
    if ranges.uses_head and ranges.exact:
        rule = (resolved.allow + resolved.deny)[0]
        out.append(_at(rule.span, path, "warning",
                       "this mask reads h: one tile map serves every head, so tiles where heads differ are "
                       "PARTIAL (the predicate runs per pair there) even where one head's tile is full or empty",
                       "heads with equal parameters share their tiles exactly; heads that differ a lot (windows "
                       "of different sizes) are cheaper as separate masks, one call per group of heads"))
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


def _covered(region: ir.Region, denies: tuple[ir.Region, ...], budget: list[int]) -> bool:
    """Whether the union of ``denies`` provably contains ``region``: region minus the first deny is the
    union over its atoms ``lin <= 0`` of region and ``lin >= 1`` (integers), each piece covered by the
    rest. False when unproved, or after ``budget`` pieces."""
    budget[0] -= 1
    if budget[0] < 0:
        return False
    if not _possible(region):
        return True
    if not denies:
        return False
    first, rest = denies[0], denies[1:]
    for atom in first.atoms:
        outside = ir.Atom(L.add(L.scale(atom.lin, -1), L.const(1)), atom.span)     # not (lin <= 0)
        piece = intersect(region, ir.Region((outside,), region.span))
        if piece is not None and not _covered(piece, rest, budget):
            return False
    return True


def _reads(node, name: str) -> bool:
    """Whether a resolved expression reads the parameter ``name`` (of any kind)."""
    def hit(n) -> bool:
        if isinstance(n, ir.ParamRef):
            return n.name == name
        if isinstance(n, ir.SegAttr):
            return n.seg == name
        if isinstance(n, ir.Same):
            return name in (n.seg, n.k_seg)
        if isinstance(n, ir.SegValue):
            return name in (n.array, n.seg)
        if isinstance(n, ir.TableAt):
            return n.table == name
        return False
    return mentions(node, hit)


def score_params(mask: ir.ResolvedMask) -> set[str]:
    """The parameters a mask's score modifier reads."""
    if mask.score is None:
        return set()
    out, stack = set(), [mask.score.expr]
    while stack:
        e = stack.pop()
        if isinstance(e, (ir.FloatParam, ir.FloatAt)):
            out.add(e.name if isinstance(e, ir.FloatParam) else e.table)
        if isinstance(e, ir.FArith):
            stack += [e.left, e.right]
        elif isinstance(e, ir.FCall):
            stack += list(e.args)
        elif isinstance(e, (ir.ToFloat, ir.FloatAt)):
            out |= {p.name for p in mask.params if _reads(e.value if isinstance(e, ir.ToFloat) else e.index, p.name)}
    return out


def unused_params(mask: ir.ResolvedMask) -> list[ir.Param]:
    """Parameters that no rule, no segments origin and no score modifier reads."""
    # `segments from prompt` reads `prompt` when the segments are bound, whatever the rules say.
    readers = [r.cond for r in mask.rules] + [p.origin for p in mask.params if p.origin is not None] + [
        size for p in mask.params for size in p.shape or ()]
    scored = score_params(mask)
    return [p for p in mask.params if p.name not in scored and not any(_reads(node, p.name) for node in readers)]


# -- output formats ---------------------------------------------------------------------------------

def _github_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def render(diags: list[Diagnostic], fmt: str) -> str:
    """The diagnostics as ``text`` (file:line:col, the line and a caret, the hint), ``json`` (a list of
    objects) or ``github`` (workflow commands that annotate a pull request's lines)."""
    if fmt == "json":
        return json.dumps([d.as_dict() for d in diags], indent=2) + "\n"
    if fmt == "github":
        return "".join(f"::{d.severity} file={_github_escape(d.file, True)}"
                       + (f",line={d.line},col={d.col},endColumn={d.end_col}" if d.line is not None else "")
                       + f"::{_github_escape(d.message + (f' (hint: {d.hint})' if d.hint else ''))}\n" for d in diags)
    return "".join(f"{d}\n" for d in diags)
